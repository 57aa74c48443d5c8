"""Cross traffic: the spec, real flows on an emulated network, and the env's phases."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from commgym.env import AllReduceEnv, EnvConfig
from commgym.env.net import EmulatedNetwork, cleanup_leftovers, netem_available
from commgym.env.net.cross_traffic import CrossTraffic, CrossTrafficSpec

# ------------------------------------------------------------------------------ the spec


@pytest.mark.parametrize(
    ("text", "flows", "rank", "back"),
    [
        ("off", 0, 0, "off"),
        (None, 0, 0, "off"),
        (False, 0, 0, "off"),  # YAML 1.1: an unquoted `off` arrives as False
        ("1flow", 1, 0, "1flow@0"),
        ("2flows", 2, 0, "2flows@0"),
        ("3flows@2", 3, 2, "3flows@2"),
        (" 1 flow @ all ", 1, None, "1flow@all"),
    ],
)
def test_spec_parses_and_round_trips(text, flows, rank, back):
    spec = CrossTrafficSpec.parse(text)
    assert (spec.flows, spec.rank) == (flows, rank)
    assert str(spec) == back
    assert CrossTrafficSpec.parse(str(spec)) == spec


@pytest.mark.parametrize("text", ["", "flows", "0flows", "17flows", "1flow@", "1flow@r1", True, 3])
def test_bad_spec_names_the_value_and_the_forms(text):
    with pytest.raises(ValueError, match="cross traffic spec must be") as err:
        CrossTrafficSpec.parse(text)
    assert repr(text) in str(err.value) and "<n>flows@<rank>" in str(err.value)


def test_busy_ranks():
    assert CrossTrafficSpec.parse("off").busy_ranks(4) == []
    assert CrossTrafficSpec.parse("1flow@3").busy_ranks(4) == [3]
    assert CrossTrafficSpec.parse("1flow@all").busy_ranks(3) == [0, 1, 2]
    with pytest.raises(ValueError, match=r"rank 4's link, but the world size is 4 \(ranks 0..3\)"):
        CrossTrafficSpec.parse("1flow@4").busy_ranks(4)


def test_config_needs_an_emulated_network_and_a_rank_in_the_world():
    with pytest.raises(ValueError, match="needs an emulated network"):
        EnvConfig(world_size=2, cross_traffic="1flow")
    with pytest.raises(ValueError, match="world size is 2"):
        EnvConfig(world_size=2, network="1gbit", cross_traffic=[[0, "off"], [1, "1flow@2"]])
    with pytest.raises(ValueError, match="cross_traffic schedule times must strictly increase"):
        EnvConfig(world_size=2, network="1gbit", cross_traffic=[[0, "off"], [0, "1flow"]])
    cfg = EnvConfig(world_size=2, cross_traffic="off")  # off needs no network
    assert cfg.cross_traffic_condition.values == [CrossTrafficSpec()]
    cfg = EnvConfig(
        world_size=2,
        network="1gbit",
        cross_traffic={"schedule": [[0, "off"], [2, "2flows@1"]], "shift_s": 0.5},
    )
    phases = cfg.cross_traffic_condition.for_episode(7)
    assert phases.value_at(0) == CrossTrafficSpec()
    assert phases.value_at(5) == CrossTrafficSpec(2, 1)
    assert 1.5 <= phases.boundaries[0] <= 2.5


# ------------------------------------------------------------------------ host tests

_AVAILABLE, _WHY = netem_available()
needs_host = pytest.mark.skipif(not _AVAILABLE, reason=f"network emulation unavailable: {_WHY}")


def _egress(net: EmulatedNetwork, rank: int) -> dict[str, int]:
    """Rank ``rank``'s namespace-side tbf counters: sent bytes, drops, backlog bytes."""
    out = subprocess.run(
        ["tc", "-s", "-n", net.namespaces[rank], "qdisc", "show", "dev", net.interfaces(rank)[1]],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    sent = re.search(r"Sent (\d+) bytes", out)
    dropped = re.search(r"dropped (\d+)", out)
    backlog = re.search(r"backlog (\d+)([KMG]?)b", out)  # tc scales it: 0b, 34Kb, 1Mb
    assert sent and dropped and backlog, out
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[backlog[2]]
    return {
        "sent": int(sent[1]),
        "dropped": int(dropped[1]),
        "backlog": int(backlog[1]) * scale,
    }


def _wait_until(predicate, timeout_s: float = 10.0) -> bool:
    """Polls ``predicate`` until it holds (a deadline against hangs, not a measurement)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z")


@needs_host
def test_flows_fill_the_busy_links_queue_and_stop_on_switch():
    with EmulatedNetwork(2, "100mbit") as net:
        cross = CrossTraffic(net)
        try:
            before = _egress(net, 0)
            cross.apply("2flows")
            assert str(cross.spec) == "2flows@0" and len(cross.pids) == 2  # sink + sender
            sender = next(p for p in cross.pids if p != cross._sink.pid)
            ns_pids = subprocess.run(
                ["ip", "netns", "pids", net.namespaces[0]],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            assert str(sender) in ns_pids  # the sender runs inside rank 0's namespace
            # the flows go out through rank 0's shaped egress and keep its queue filled
            assert _wait_until(lambda: _egress(net, 0)["sent"] - before["sent"] > 4 << 20)
            assert _wait_until(lambda: _egress(net, 0)["backlog"] > 0)
            quiet_rank1 = _egress(net, 1)["sent"]
            cross.apply("off")
            assert not _alive(sender) and cross.spec == CrossTrafficSpec()
            # the reset connections free the link: what follows is what the queue held
            # (at most 10 ms of the rate plus a burst: ~175 KB at 100 Mbit/s), then nothing
            stopped = _egress(net, 0)["sent"]
            time.sleep(0.3)
            settled = _egress(net, 0)["sent"]
            assert settled - stopped < 200_000
            time.sleep(0.3)
            assert _egress(net, 0)["sent"] - settled < 16 << 10
            assert _egress(net, 1)["sent"] - quiet_rank1 < 64 << 10  # rank 1 never carried them
            cross.apply("1flow@1")
            assert _wait_until(lambda: _egress(net, 1)["sent"] - quiet_rank1 > 2 << 20)
        finally:
            pids = cross.pids
            cross.close()
        assert pids and not any(_alive(p) for p in pids)
        assert cross.pids == []


@needs_host
def test_a_flow_that_cannot_start_raises_with_its_error_and_leaves_nothing(monkeypatch):
    with EmulatedNetwork(2, "100mbit") as net:
        cross = CrossTraffic(net)
        cross.apply("1flow")
        sink = cross._sink.pid
        cross.apply("off")
        # a sink that went away: the sender's connection is refused
        monkeypatch.setattr(cross, "_ensure_sink", lambda: None)
        cross._sink.kill()
        cross._sink.wait()
        with pytest.raises(RuntimeError, match=r"sender on rank 1's link did not start: .*refused"):
            cross.apply("1flow@1")
        assert cross.pids == [] and cross.spec == CrossTrafficSpec() and not _alive(sink)


@needs_host
def test_flows_die_with_a_killed_owner():
    code = (
        "from commgym.env.net import EmulatedNetwork\n"
        "from commgym.env.net.cross_traffic import CrossTraffic\n"
        "import time\n"
        "net = EmulatedNetwork(2, '100mbit')\n"
        "cross = CrossTraffic(net); cross.apply('1flow@all')\n"
        "print(net.name, *cross.pids, flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _name, *pids = child.stdout.readline().split()
        assert len(pids) == 3, child.stderr.read()  # sink + one sender per rank
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=10)
        assert _wait_until(lambda: not any(_alive(int(p)) for p in pids))
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=10)
        cleanup_leftovers()


@needs_host
def test_env_switches_cross_traffic_at_decision_boundaries():
    env = AllReduceEnv(
        workload="mlp-digits",
        world_size=2,
        steps_per_decision=4,
        network="1gbit",
        cross_traffic=[[0, "1flow"], [0.05, "off"]],
        time_budget_s=60.0,
        max_decisions=30,
        timeout_s=120.0,
    )
    try:
        env.reset(seed=3)
        assert [label for _, label in env.episode_phases] == [
            "1gbit, stragglers off, cross traffic 1flow@0",
            "1gbit, stragglers off, cross traffic off",
        ]
        _, _, _, _, info = env.step(env.menu.default_action())
        assert info["condition"].endswith("cross traffic 1flow@0")
        busy = env._cross.pids
        assert len(busy) == 2
        while env._train_time_s < 0.05:
            _, _, term, trunc, info = env.step(env.menu.default_action())
            assert not (term or trunc)
        _, _, _, _, info = env.step(env.menu.default_action())
        assert info["condition"].endswith("cross traffic off")
        assert len(env._cross.pids) == 1  # only the sink is left
    finally:
        env.close()
    assert not any(_alive(p) for p in busy)
