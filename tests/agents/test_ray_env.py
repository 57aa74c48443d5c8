"""Env actors on a real local Ray instance (2 CPUs, loopback): RayVecEnv, PPO, faults."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

# a single-machine Ray instance on loopback only (read when Ray is imported)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray", reason="needs the commgym[ray] extra")

from commgym.agents.ray_env import TAG_VARIABLE, EnvActors, RayVecEnv  # noqa: E402
from commgym.env import EnvConfig  # noqa: E402
from commgym.env.net import netem_available  # noqa: E402
from tests.experiments.cli_helpers import namespaces_of, networks_of, ranks_among  # noqa: E402

#: Deterministic compressors only: the same seed and actions give the same bytes and losses.
MENU = {
    "compression": ["none", "fp16", "topk:0.01"],
    "bucket_mb": [1.0, 25.0],
    "sync_period": [1, 2],
}
CONFIG = dict(
    workload="mlp-digits", world_size=2, steps_per_decision=2, time_budget_s=60.0,
    max_decisions=6, action_menu=MENU,
)  # fmt: skip
ACTIONS = [(0, 1, 0), (1, 0, 0), (2, 1, 1), (1, 1, 1), (0, 0, 0), (2, 0, 0)]


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance of 2 logical CPUs bound to 127.0.0.1 (started here, shut down)."""
    # "local": a new instance even while another Ray cluster runs on this host. Without it
    # ray.init joins whatever $RAY_ADDRESS or Ray's current-cluster file names (another
    # job's `ray start --head`, a concurrent test run's cluster) and refuses num_cpus: the
    # CI run of cb67bda failed all five tests here that way
    ray.init(
        address="local", num_cpus=2, _node_ip_address="127.0.0.1",
        include_dashboard=False, logging_level="WARNING",
    )  # fmt: skip
    yield ray
    ray.shutdown()


def _tagged(tags) -> list[int]:
    wanted = {f"{TAG_VARIABLE}={t}".encode() for t in tags}
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if wanted.intersection(f.read().split(b"\0")):
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _measured(info):
    m = info["measured"]
    return info["config"], m["bytes_per_step"], m["train_loss"], m["eval_loss"]


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in out.stdout.splitlines() if line.split()}


def test_a_killed_actor_is_that_episodes_failure_and_leaves_nothing(local_ray, tmp_path):
    from commgym.agents.baselines import StaticAgent
    from commgym.experiments.executors import RayExecutor, policy_bytes

    ok, _ = netem_available()
    # on an emulated network when the host allows: its namespaces must go too
    extra = {"network": "1gbit"} if ok else {}
    cfg = EnvConfig(**{**CONFIG, "max_decisions": 150, "time_budget_s": 600.0, **extra})
    networks: set[str] = set()
    executor = RayExecutor(envs=1)
    try:
        [(actor, tag)] = executor.actors(cfg, 1)
        pid = ray.get(actor.describe.remote())["pid"]
        policy = policy_bytes(StaticAgent(_layout(cfg), preset="none/25MB/H1"))
        killed: list[int] = []

        def kill_when_ranks_run() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and len(ranks_among(_tagged([tag]))) < 2:
                time.sleep(0.2)
            time.sleep(1.0)  # inside the episode
            killed.extend(_tagged([tag]))
            networks.update(networks_of(killed))
            os.kill(pid, signal.SIGKILL)

        t = threading.Thread(target=kill_when_ranks_run, daemon=True)
        t.start()
        results = list(executor.episodes(cfg, [("none", 1), ("none", 2)], {"none": policy}, None))
        t.join(timeout=5)
        first, second = results[0][1], results[1][1]
        assert first.episode.reason == "failure"
        assert "died" in first.episode.final_info["failure"]
        assert killed  # there were ranks to leave behind
        # the sweep went on, on the actor Ray restarted (which cleaned up after its old self)
        assert second.episode.reason == "max_decisions" and second.episode.decisions == 150
    finally:
        executor.close()
    time.sleep(1.0)
    assert not _tagged([tag]), "ranks of the killed actor are still running"
    if ok:
        assert networks, "the killed actor's ranks ran in no emulated network"
        left = {ns for ns in _netns() if ns.split("-")[0] in networks}
        assert not left, f"namespaces left behind: {left}"


def _layout(cfg):
    from commgym.agents.base import LayoutEnv

    return LayoutEnv(cfg.menu)


def test_more_env_actors_than_the_cluster_holds_is_a_clear_error(local_ray):
    cfg = EnvConfig(**CONFIG)
    with pytest.raises(ValueError, match=r"need 6 CPU; the Ray cluster has 2 in total"):
        EnvActors(cfg, 3)


@pytest.fixture(scope="module")
def two_actors(local_ray):
    """Two env actors of one CPU each on the 2-CPU instance, shared by the tests below.

    Started once (each start is two actor processes and their ranks): on an emulated network
    where the host allows, so the one launch also shows each actor its own network. They hold
    both CPUs, so the tests needing an actor of their own (a killed actor) come first in this
    file. Closing them leaves no rank and no namespace (checked here, at teardown).
    """
    ok, _ = netem_available()
    extra = {"network": "1gbit"} if ok else {}
    cfg = EnvConfig(**{**CONFIG, **extra})
    vec = RayVecEnv(cfg, 2, resources={"CPU": 1})
    names: set[str] = set()
    try:
        yield vec
        # an actor's network exists once its ranks run (the first reset)
        names = {d["network"]["name"] for d in vec.group.describe() if d["network"]}
    finally:
        vec.close()
    time.sleep(1.0)
    assert not _tagged(vec.tags), "ranks of the env actors are still running"
    left = {ns for ns in _netns() if ns.split("-")[0] in names}
    assert not left, f"namespaces left behind: {left}"


def test_two_env_actors_in_parallel_match_the_same_seeds_run_sequentially(two_actors):
    import gymnasium as gym
    from ray.util import placement_group_table

    import commgym.env  # noqa: F401 - registers the env
    from commgym.agents.ray_env import actor_resources

    vec = two_actors
    cfg = vec.group.config
    assert actor_resources(cfg) == {"CPU": 2.0}  # by default: world size x threads per rank
    # two actors of one CPU each: both fit the 2-CPU instance, so they step at once
    for group in vec.group.groups:  # one bundle each, its ranks on one host
        table = placement_group_table(group)
        assert table["strategy"] == "STRICT_PACK", table
        assert list(table["bundles"].values()) == [{"CPU": 1.0}], table
        assert table["state"] == "CREATED", table
    where = vec.group.describe()
    assert len({d["pid"] for d in where}) == 2
    vec.seed(11)  # seeds 11 and 12
    vec.reset()
    parallel: list[list[tuple]] = [[], []]
    for a in ACTIONS[:-1]:  # max_decisions ends the episode at the 6th
        _, _, dones, infos = vec.step(np.array([a, a]))
        assert not dones.any()
        for i in range(2):
            parallel[i].append(_measured(infos[i]))
    where = vec.group.describe()
    ports = {tuple(d["control_address"]) for d in where}
    assert len(ports) == 2  # each actor's own control listener
    assert all(d["rank_pids"] for d in where)
    env = gym.make("commgym/AllReduce-v1", config=cfg)
    try:
        for i, seed in enumerate((11, 12)):
            env.reset(seed=seed)
            sequential = [_measured(env.step(np.array(a))[4]) for a in ACTIONS[:-1]]
            assert sequential == parallel[i]  # configs, bytes and losses, exactly
    finally:
        env.close()


def test_two_env_actors_on_one_node_get_their_own_networks(two_actors):
    ok, why = netem_available()
    if not ok:
        pytest.skip(f"no emulated network on this host: {why}")
    vec = two_actors
    vec.seed(21)
    vec.reset()
    _, _, _, infos = vec.step(np.array([ACTIONS[0], ACTIONS[0]]))
    where = vec.group.describe()
    assert len({d["node_id"] for d in where}) == 1  # one node, two actors
    nets = [d["network"] for d in where]
    assert all(n is not None for n in nets)
    assert len({n["name"] for n in nets}) == 2
    assert len({n["subnet"] for n in nets}) == 2
    spaces = [set(n["namespaces"]) for n in nets]
    assert not spaces[0] & spaces[1]
    # each actor's ranks run (and rendezvous) inside its own network's namespaces
    ranks = [ranks_among(_tagged([d["tag"]])) for d in where]
    assert all(len(r) == 2 for r in ranks)
    assert [namespaces_of(r) for r in ranks] == spaces
    assert all(i["measured"]["bytes_per_step"] > 0 for i in infos)
    # the namespaces go with the actors: checked when the fixture closes them


def test_ppo_learns_through_ray_vec_env(two_actors):
    from commgym.agents import make_agent
    from commgym.agents.base import LayoutEnv

    vec = two_actors
    decisions = vec.group.config.max_decisions
    steps = []
    agent = make_agent(
        "ppo", LayoutEnv(vec.group.config.menu), seed=0, vec_env=vec, n_steps=32, batch_size=32,
        n_epochs=2,
    )  # fmt: skip
    before = [p.detach().clone() for p in agent.model.policy.parameters()]
    agent.learn(128, callback=steps.append)
    after = list(agent.model.policy.parameters())
    assert agent.model.num_timesteps >= 128
    assert len(steps) >= 128 and {s["env"] for s in steps} == {0, 1}
    assert sum(s["truncated"] for s in steps) >= 2 * (128 // 2 // decisions) - 2  # whole episodes
    assert all("measured" in s["info"] for s in steps)
    assert any(not bool((b == a).all()) for b, a in zip(before, after, strict=True))
