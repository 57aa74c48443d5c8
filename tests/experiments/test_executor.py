"""``--executor ray``: the same leaderboard rows and MLflow runs as the local path, errors, signals.

The Ray runs start a real local Ray instance from the CLI (the machine's 2 CPUs, bound to
127.0.0.1) as a user's command does (train, Ctrl-C); the multi-node tests share two Ray nodes
built with ``ray.cluster_utils.Cluster`` (a leaderboard sweep on both, joined by
``--ray-address`` and compared with the local leaderboard; a driver's SIGTERM; a node lost
mid-episode).
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from commgym.experiments.config import load_run_config
from commgym.experiments.leaderboard import read_leaderboard_csv
from tests.experiments.cli_helpers import cli, cli_ok, networks_of, ranks_among
from tests.experiments.cli_helpers import cmdline as _cmdline

#: 2 ranks on loopback, 2 menu entries, a target every entry reaches in its first decisions
#: (so no column but the times depends on the machine's speed).
TINY = {
    "env": {
        "workload": "mlp-digits",
        "world_size": 2,
        "steps_per_decision": 2,
        "time_budget_s": 30.0,
        "max_decisions": 4,
        "reward": "time_to_target",
        "target_loss": 1.5,
        "action_menu": {"compression": ["none", "fp16"], "bucket_mb": [25.0], "sync_period": [1]},
    },
    "experiment": "commgym-executor-test",
}
AGENTS = "static:ddp-default,static:fp16-dense"
#: Columns of the leaderboard CSV that do not depend on timing.
TIMING_FREE = ("scenario", "agent", "role", "seed", "reached", "final_eval_loss",
               "final_eval_acc", "bytes_per_step", "decisions")  # fmt: skip


def test_executor_ray_without_ray_is_one_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ValueError, match=r"pip install 'commgym\[ray\]'"):
        load_run_config(None, {"executor": "ray"})
    with pytest.raises(ValueError, match=r"executor must be one of \['local', 'ray'\]"):
        load_run_config(None, {"executor": "slurm"})
    with pytest.raises(ValueError, match="take effect with executor 'ray' only"):
        load_run_config(None, {"ray_envs": 2})


def test_bad_executor_is_one_error_line(tmp_path):
    proc = cli(["leaderboard", "--executor", "slurm", "--scenarios", "default"], tmp_path, 120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: executor must be one of")


# a single-machine Ray instance on loopback only (read when Ray is imported)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
pytest.importorskip("ray", reason="needs the commgym[ray] extra")


def _board(tmp, executor: str, *extra: str) -> tuple[list[dict], str, str]:
    (tmp / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    uri = f"sqlite:///{tmp}/mlflow-{executor}.db"
    out = cli_ok(
        ["leaderboard", "--scenarios", str(tmp / "tiny.yaml"), "--agents", AGENTS,
         "--seeds", "1", "--tracking-uri", uri, "--output-dir", str(tmp / executor),
         "--executor", executor, *extra],
        tmp, timeout_s=600,
    )  # fmt: skip
    return read_leaderboard_csv(tmp / executor / "leaderboard-tiny.csv"), out, uri


def test_a_ray_address_where_nothing_listens_is_one_error_line_not_a_hang(tmp_path):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    args = ["leaderboard", "--scenarios", str(tmp_path / "tiny.yaml"), "--agents",
            "static:ddp-default", "--seeds", "1", "--output-dir", str(tmp_path / "b"),
            "--executor", "ray", "--ray-address", "127.0.0.1:1"]  # fmt: skip
    t0 = time.monotonic()
    proc = cli(args, tmp_path, 180)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: cannot connect to the Ray cluster at '127.0.0.1:1'")
    assert "Connection refused" in lines[0]
    assert time.monotonic() - t0 < 120


def test_train_on_ray_learns_on_an_env_actor_and_evaluates_there(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = cli_ok(
        ["train", "--config", "smoke", "--tracking-uri", uri, "--output-dir",
         str(tmp_path / "out"), "--executor", "ray", "--episodes", "1", "--baselines",
         "static:ddp-default"],
        tmp_path, timeout_s=900,
    )  # fmt: skip
    assert "executor: ray, a local Ray instance" in out
    assert "episodes ran on 1 Ray node(s)" in out
    assert (tmp_path / "out" / "policy.zip").is_file()
    rows = (tmp_path / "out" / "learning-decisions.csv").read_text().splitlines()
    assert len(rows) >= 1 + 16  # header + the decisions PPO learned from, logged here


def _ctrl_c_as_at_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("sig", "status"),
    [
        # SIGTERM raises cli.Terminated, a KeyboardInterrupt: the very cleanup Ctrl-C runs
        # (the default run's SIGINT case here, with the local Ray instance the driver
        # started); SIGTERM's own route and its 143 are the default run's two-node SIGTERM
        # test (test_sigterm_of_a_driver_on_two_nodes_leaves_nothing_on_either)
        pytest.param(signal.SIGTERM, 143, marks=pytest.mark.expensive),
        (signal.SIGINT, 130),
    ],
)
def test_sigterm_or_ctrl_c_of_the_driver_leaves_no_actor_rank_or_network(tmp_path, sig, status):
    from commgym.env.net import netem_available
    from tests.experiments.cli_helpers import OutputReader as _Reader
    from tests.experiments.cli_helpers import alive as _alive
    from tests.experiments.cli_helpers import descendants as _children

    ok, _ = netem_available()
    net = ["--network", "1gbit"] if ok else []
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [
        sys.executable, "-m", "commgym.experiments.cli", "collect", "--config", "smoke",
        "--decisions", "100000", "--no-bench", "--out", str(tmp_path / "t.csv"),
        "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--executor", "ray", *net,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C as at a terminal: a suite started in the background of a shell without job
        # control inherits SIGINT ignored, and a program keeps an ignored SIGINT ignored
        preexec_fn=_ctrl_c_as_at_a_terminal,  # noqa: PLW1509 - one signal() call, no locks
    )
    reader = _Reader(proc)
    try:
        deadline = time.monotonic() + 240
        ranks: set[int] = set()
        while time.monotonic() < deadline and proc.poll() is None:
            kids = _children(proc.pid)
            ranks = ranks_among(kids)
            if len(ranks) >= 2:
                break
            time.sleep(0.5)
        assert len(ranks) >= 2, reader.text[-3000:]
        everything = _children(proc.pid)
        networks = networks_of(everything)
        time.sleep(1.0)
        proc.send_signal(sig)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            stack = (
                subprocess.run(
                    ["py-spy", "dump", "--pid", str(proc.pid)],
                    check=False,
                    capture_output=True,
                    text=True,
                ).stdout
                if shutil.which("py-spy")
                else "(no stack: py-spy is not installed; the dev extra has it)"
            )
            pytest.fail(f"still running 120 s after {sig!r}:\n{reader.text[-3000:]}\n{stack}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == status, reader.text[-3000:]
    time.sleep(2.0)
    left = _alive(everything)
    assert not left, f"left running: {[_cmdline(p)[:120] for p in left]}"
    if ok:
        assert networks, "the ranks ran in no emulated network"
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
        left = [ns for ns in out.stdout.split() if ns.split("-")[0] in networks]
        assert not left, f"namespaces left behind: {left}"


@pytest.fixture(scope="module")
def two_nodes():
    """Two Ray nodes of 2 CPUs each on loopback (Ray's ``Cluster``): ``(cluster, worker)``.

    Started once for the two-node tests below (each start costs a head and a node); they
    run in file order, the last one removes the worker node. While it runs, a plain
    ``ray.init()`` would join it (Ray's ``Cluster`` writes the machine's current-cluster
    address); the executor's local instance asks for ``address="local"`` and is checked
    to stay its own by ``test_a_local_instance_is_its_own_while_a_cluster_runs``. The CLI
    tests of the local instance still come first in this file (one cluster at a time on
    2 cores).
    """
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    worker = cluster.add_node(num_cpus=2, node_ip_address="127.0.0.1")
    yield cluster, worker
    cluster.shutdown()


@pytest.fixture(scope="module")
def boards(tmp_path_factory, two_nodes):
    """The leaderboard run locally, and on the two-node cluster by ``--ray-address``.

    Run once for the three tests below (each run is a driver and, on Ray, two env actors and
    their ranks). The Ray driver joins from a shell without Ray's loopback switch.
    Returns ``(local rows, ray rows, ray driver's output, ray run's tracking URI)``.
    """
    cluster, _ = two_nodes
    tmp = tmp_path_factory.mktemp("boards")
    local, _, _ = _board(tmp, "local")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
        mp.delenv("RAY_ADDRESS", raising=False)
        remote, out, uri = _board(tmp, "ray", "--ray-address", cluster.address)
    return local, remote, out, uri


def test_leaderboard_on_ray_gives_the_local_rows_and_runs(boards):
    from mlflow import MlflowClient

    local, remote, _, uri = boards

    def key(rows):
        return [
            tuple(round(r[c], 12) if isinstance(r[c], float) else r[c] for c in TIMING_FREE)
            for r in rows
        ]

    assert key(remote) == key(local)
    assert all(math.isfinite(r["final_eval_loss"]) for r in remote)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("commgym-leaderboard")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("commgym.command") == "leaderboard"]
    children = [r for r in runs if r.data.tags.get("commgym.role") == "evaluation"]
    assert len(parent) == 1 and len(children) == 2
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent[0].info.run_id}
    assert all(c.data.tags.get("commgym.ray_node") for c in children)
    assert all(c.info.status == "FINISHED" for c in runs)
    # every child holds its per-decision metrics, as a local episode's does
    for c in children:
        hist = client.get_metric_history(c.info.run_id, "comm/bytes_per_step")
        assert len(hist) == int(c.data.metrics["eval/decisions"]) >= 1


def test_ray_address_joins_a_running_cluster_on_loopback(boards):
    """``--ray-address`` of a cluster listening on 127.0.0.1, from a shell without Ray's
    loopback switch (the leaderboard of :func:`boards`): the driver stays on loopback (Ray
    would otherwise rewrite the address to the host's routable one, where nothing listens,
    and retry forever). (A local Ray instance the CLI starts: the train and Ctrl-C tests.)"""
    from commgym.experiments.executors import on_loopback

    assert on_loopback("127.0.0.1:6379") and on_loopback("localhost:6379")
    assert on_loopback("ray://127.0.0.1:10001") and on_loopback("[::1]:6379")
    assert not on_loopback("10.1.2.3:6379") and not on_loopback("ray://head:10001")
    _, remote, out, _ = boards
    assert "executor: ray, the Ray cluster (2 node(s), 4 CPUs)" in out
    assert all(math.isfinite(r["final_eval_loss"]) for r in remote)


def test_a_sweep_lands_on_both_nodes_of_a_two_node_cluster(boards):
    """The leaderboard's two cells on the two nodes: one env actor of 2 CPUs fits each node,
    and each actor takes a cell."""
    from mlflow import MlflowClient

    _, _, out, uri = boards
    assert "2 episodes ran on 2 Ray node(s)" in out
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("commgym-leaderboard")
    children = [
        r
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("commgym.role") == "evaluation"
    ]
    assert len({c.data.tags["commgym.ray_node"] for c in children}) == 2, children


def test_sigterm_of_a_driver_on_two_nodes_leaves_nothing_on_either(tmp_path, two_nodes):
    """The driver joins a two-node cluster (``--ray-address``), an env actor recording on
    each node; its SIGTERM leaves no actor, rank or namespace on either node (they are not
    the driver's children: the nodes' cleanup tasks remove them)."""
    from commgym.agents.ray_env import TAG_VARIABLE
    from commgym.env.net import netem_available
    from tests.agents.test_ray_env import _netns
    from tests.experiments.cli_helpers import OutputReader as _Reader
    from tests.experiments.cli_helpers import alive as _alive

    ok, _ = netem_available()
    net = ["--network", "1gbit"] if ok else []
    cluster, _ = two_nodes
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    cmd = [
        sys.executable, "-m", "commgym.experiments.cli", "collect", "--config", "smoke",
        "--decisions", "100000", "--no-bench", "--out", str(tmp_path / "t.csv"),
        "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--executor", "ray",
        "--ray-address", cluster.address, *net,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    reader = _Reader(proc)
    try:
        deadline = time.monotonic() + 240
        tagged: dict[str, set[int]] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            tagged = _by_tag(TAG_VARIABLE)
            if len([t for t, pids in tagged.items() if len(ranks_among(pids)) >= 2]) >= 2:
                break
            time.sleep(0.5)
        assert len(tagged) >= 2, reader.text[-3000:]
        actors = {p for p in _pids() if _cmdline(p).startswith("ray::EnvRunner")}
        raylets = {_ppid(p) for p in actors}
        everything = set().union(*tagged.values()) | actors
        networks = networks_of(everything)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, reader.text[-3000:]
    assert len(raylets) == 2, raylets  # an env actor under each node's raylet
    time.sleep(2.0)
    left = _alive(everything)
    assert not left, f"left running: {[_cmdline(p)[:120] for p in left]}"
    assert not set(_by_tag(TAG_VARIABLE)) & set(tagged)
    if ok:
        assert len(networks) >= 2, "the ranks ran in no emulated network"
        left_ns = [ns for ns in _netns() if ns.split("-")[0] in networks]
        assert not left_ns, f"namespaces left behind: {left_ns}"


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _by_tag(variable: str) -> dict[str, set[int]]:
    """Processes whose environment carries ``variable``, by its value."""
    found: dict[str, set[int]] = {}
    prefix = f"{variable}=".encode()
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue
        for e in entries:
            if e.startswith(prefix):
                found.setdefault(e[len(prefix) :].decode(), set()).add(pid)
    return found


def test_a_local_instance_is_its_own_while_a_cluster_runs(two_nodes):
    """No address: a new local instance (``ray.init(address="local")``), never the cluster
    Ray's current-cluster file names (another user's ``ray start --head``, a test's).

    In a driver process of its own: this process joins the cluster in the next test.
    """
    code = (
        "import ray\n"
        "from commgym.experiments.executors.ray import RayExecutor\n"
        "with RayExecutor(num_cpus=1) as ex:\n"
        "    print('started', ex.started, 'nodes', len(ray.nodes()),"
        " 'cpus', ray.cluster_resources().get('CPU'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "started True nodes 1 cpus 1.0" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_a_node_lost_mid_episode_is_that_episodes_failure_and_the_sweep_goes_on(two_nodes):
    import threading

    import ray

    from commgym.agents.base import LayoutEnv
    from commgym.agents.baselines import StaticAgent
    from commgym.env import EnvConfig
    from commgym.env.net import netem_available
    from commgym.experiments.executors import RayExecutor, policy_bytes
    from tests.agents.test_ray_env import _netns, _tagged

    ok, _ = netem_available()
    # on an emulated network when the host allows: the lost actor's namespaces must go too
    extra = {"network": "1gbit"} if ok else {}
    cluster, worker = two_nodes  # removed below: the last test of the fixture
    networks: set[str] = set()
    try:
        ray.init(address=cluster.address, logging_level="WARNING")
        cfg = EnvConfig(**{**TINY["env"], "target_loss": None, "reward": "log_progress",
                           "max_decisions": 500, "time_budget_s": 600.0, **extra})  # fmt: skip
        policy = policy_bytes(StaticAgent(LayoutEnv(cfg.menu), preset="none/25MB/H1"))
        # one actor of 2 CPUs per node: the lost node's actor cannot be restarted elsewhere
        with RayExecutor(resources={"CPU": 2}) as executor:
            executor.actors(cfg, 2)
            [doomed] = [t for t, n in executor.nodes.items() if n == worker.node_id]

            def lose_the_node() -> None:
                deadline = time.monotonic() + 180
                while time.monotonic() < deadline and len(ranks_among(_tagged([doomed]))) < 2:
                    time.sleep(0.2)  # the ranks start at the episode's first reset
                time.sleep(3.0)  # inside the episode
                networks.update(networks_of(_tagged([doomed])))
                cluster.remove_node(worker)

            lose = threading.Thread(target=lose_the_node, daemon=True)
            lose.start()
            cells = [("none", 1000 + i) for i in range(3)]
            played = [p for _, p in executor.episodes(cfg, cells, {"none": policy}, None)]
            lose.join(timeout=5)
        for (_, seed), p in zip(cells, played, strict=True):  # shown with -s
            print(f"seed {seed}: {p.episode.reason} after {p.episode.decisions} decisions on "
                  f"node {p.node_id[:8]}, actor {p.actor}, {p.actor_s:.1f} s")  # fmt: skip
        failed = [p for p in played if p.episode.reason == "failure"]
        assert [(p.actor, p.node_id) for p in failed] == [(doomed, worker.node_id)]
        assert "died" in failed[0].episode.final_info["failure"]
        # the sweep went on: the other two episodes whole, on the head node's actor
        rest = [p for p in played if p.episode.reason != "failure"]
        assert [p.episode.decisions for p in rest] == [500] * 2
        assert {p.actor for p in rest} == set(executor.nodes) - {doomed}
        assert doomed not in {p.actor for p in rest}
        time.sleep(1.0)
        assert not _tagged([doomed]), "ranks of the lost node's actor are still running"
        if ok:
            assert networks, "the lost actor's ranks ran in no emulated network"
            left = {ns for ns in _netns() if ns.split("-")[0] in networks}
            assert not left, f"namespaces left behind: {left}"
    finally:
        ray.shutdown()
