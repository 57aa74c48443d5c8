"""CommScheduler: policy replay inside a user's torchrun job.

Covers observation parity with the env (same per-rank dicts through both code paths),
refusal of a policy saved for another action menu, and the example script under torchrun
(configuration follows the policy, identical parameters at the end, decision time).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from commgym.agents import PPOAgent, StaticAgent
from commgym.agents.base import LayoutEnv, StepAgent
from commgym.agents.baselines import resolve_preset
from commgym.agents.scheduler import (
    EXCHANGED_FIELDS,
    CommScheduler,
    policy_time_budget,
    resolve_policy,
)
from commgym.env.measure import DecisionMeasurement
from commgym.env.spaces import OBSERVATION_FIELDS, ActionMenu, ObservationBuilder

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "experiments" / "examples" / "train_with_scheduler.py"
OTHER_MENU = ActionMenu(compression=("none", "fp16"), bucket_mb=(25.0,), sync_period=(1, 2))


def save_static(path: Path, preset: str, menu: ActionMenu | None = None) -> Path:
    return StaticAgent(LayoutEnv(menu or ActionMenu()), preset=preset).save(path)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _rank_dict(rank: int, decision: int) -> dict:
    """A worker-style per-rank reply with rank- and decision-dependent values."""
    r, d = rank + 1, decision + 1
    return {
        "train_time_s": 0.05 * r * d,
        "step_time_s": 0.004 + 0.001 * r,
        "steps": 5,
        "compute_s": 0.002 * r,
        "comm_wait_s": 0.0007 * r + 0.0001 * d,
        "compress_s": 0.0003 * r,
        "comm_s": 0.004 * r,
        "bytes_per_step": 104488.0 / d,
        "bytes_total": 5 * 104488.0 / d,
        "train_loss": 2.0 / d + 0.01 * r,
        "eval_loss": 2.1 / d + 0.02 * r,
        "eval_acc": 0.0,
        "eval_n": 1,
        "eval_s": 0.001,
        "grad_norm": 1.5 / d,
        "compression_error": None if d == 1 else 0.25,
        "nonfinite": False,
        "samples": 0,
        "bucket_bytes": [104488],
        "probe_s": 0.001 * r,
        "probe_bytes": 8192,
    }


# -- observation parity ---------------------------------------------------------------
def rank_parity(rank, world):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = CommScheduler(
        model,
        opt,
        "static:ddp-default",
        decision_every=5,
        eval_fn=lambda: 2.3,
        time_budget_s=1.0,
    )
    env_builder = ObservationBuilder(sched.menu, world, sum(p.numel() for p in model.parameters()))
    env_obs = [env_builder.reset(2.3, sched.menu.default_action())]
    sched_obs = [sched.observation]
    env_train = 0.0
    for d in range(3):
        replies = [_rank_dict(r, d) for r in range(world)]
        # the env path: DecisionMeasurement.from_ranks + ObservationBuilder.build
        m = DecisionMeasurement.from_ranks(replies)
        env_train += m.train_time_s
        env_obs.append(env_builder.build(m, sched._action, min(1.0, env_train / 1.0)))
        # the scheduler path: real all-gather of this rank's dict, then its _observe
        per_rank = sched._exchange(replies[rank])
        _, obs = sched._observe(per_rank)
        sched_obs.append(obs)
    sched.close()
    return [o.tolist() for o in env_obs], [o.tolist() for o in sched_obs]


def test_observation_parity_with_env(dist2):
    for env_obs, sched_obs in dist2.run(rank_parity):
        assert np.array_equal(np.array(env_obs, np.float32), np.array(sched_obs, np.float32))
        # the prev-dependent fields were exercised (loss_change, grad-norm change, error)
        assert env_obs[2][7] != 0.0 and env_obs[2][9] != 0.0 and env_obs[2][10] == 0.25


def rank_norm_per_window(rank, world, user_ddp):
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    width = next(model.parameters()).shape[1]
    if user_ddp:  # the user's own DDP model: CommScheduler drives it through its comm hook
        model = DistributedDataParallel(model)
    sched = CommScheduler(
        model, opt, "static:ddp-default", decision_every=3, eval_fn=lambda: 2.3, time_budget_s=60.0
    )
    gen = torch.Generator().manual_seed(rank)
    norms = []
    for _ in range(9):
        x = torch.randn(8, width, generator=gen)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        norms.append(sched.synchronize().grad_norm)
        sched.step(loss)
    measured = [r.measured["grad_norm"] for r in sched.records]
    sched.close()
    return norms, measured


@pytest.mark.parametrize("user_ddp", [False, True])
def test_the_gradient_norm_is_measured_on_each_windows_last_step_only(dist2, user_ddp):
    """The observation reads the last step's norm; the steps before it skip that pass."""
    for norms, measured in dist2.run(rank_norm_per_window, user_ddp):
        assert [n is None for n in norms] == [True, True, False] * 3
        assert len(measured) == 3 and all(math.isfinite(m) and m > 0 for m in measured)
        assert measured == pytest.approx([norms[2], norms[5], norms[8]])


def test_exchanged_fields_cover_aggregation():
    # every field from_ranks reads travels in the all-gather (bucket_bytes stays local)
    needed = set(_rank_dict(0, 0)) - {"bucket_bytes"}
    assert needed == set(EXCHANGED_FIELDS)


# -- compatibility -------------------------------------------------------------------------
def test_policy_for_other_menu_is_refused(tmp_path):
    path = save_static(tmp_path / "other.zip", "fp16-dense", OTHER_MENU)
    with pytest.raises(ValueError, match="action menu 'compression'") as err:
        resolve_policy(path, ActionMenu())
    msg = str(err.value)
    assert "['none', 'fp16']" in msg and "bucket_mb" in msg and "sync_period" in msg
    assert str(resolve_policy(path, OTHER_MENU).config) == "fp16/25MB/H1"


def rank_refused(rank, world, path):
    model = _model()
    try:
        CommScheduler(model, torch.optim.SGD(model.parameters(), lr=0.1), path, time_budget_s=1.0)
    except ValueError as err:
        return str(err)
    return None


def test_scheduler_refuses_on_every_rank(dist2, tmp_path):
    path = str(save_static(tmp_path / "other.zip", "fp16-dense", OTHER_MENU))
    for msg in dist2.run(rank_refused, path):
        assert msg is not None and "action menu 'compression'" in msg, msg


def test_unknown_agent_name_is_refused():
    with pytest.raises(ValueError, match="unknown agent"):
        resolve_policy("not-an-agent", ActionMenu())


# -- the example script under torchrun -----------------------------------------------------
def _torchrun(policy: Path, out: Path, steps: int = 40) -> subprocess.CompletedProcess:
    env = dict(os.environ, TMPDIR=str(out.parent))  # torchrun's temp folders land there
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(EXAMPLE),
        "--policy",
        str(policy),
        "--steps",
        str(steps),
        "--decision-every",
        "10",
        "--json",
        str(out),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env=env, cwd=out.parent, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_example_follows_policy_and_ranks_agree(tmp_path):
    policy = save_static(tmp_path / "int8.zip", "int8/4MB/H2")
    out = tmp_path / "result.json"
    proc = _torchrun(policy, out)
    res = json.loads(out.read_text())
    # a static preset is in force from the first step, not only after the first decision
    assert res["world_size"] == 2 and res["initial_config"] == "int8/4MB/H2"
    decisions = res["decisions"]
    assert len(decisions) == 4
    assert all(d["config"] == "int8/4MB/H2" and not d["changed"] for d in decisions)
    assert res["params_identical"] is True
    assert math.isfinite(res["final_loss"]) and res["final_accuracy"] > 0.2
    assert "start config int8/4MB/H2" in proc.stdout
    assert "parameters identical across 2 ranks: True" in proc.stdout


def test_example_with_saved_ppo_policy_decides_fast(tmp_path):
    policy = PPOAgent(LayoutEnv(ActionMenu()), seed=0).save(tmp_path / "ppo.zip")
    out = tmp_path / "result.json"
    _torchrun(policy, out, steps=60)
    res = json.loads(out.read_text())
    assert res["params_identical"] is True
    assert len(res["decisions"]) == 6
    # the decision time is a benchmark figure (README), not a default-test assertion: a
    # loaded machine would fail it; here it only has to be measured
    assert res["summary"]["policy_ms_median"] >= 0.0, res["summary"]
    print(f"PPO policy decision time: median {res['summary']['policy_ms_median']:.3f} ms")


def rank_sync_twice(rank, world, period):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = CommScheduler(
        model, opt, f"static:none/25MB/H{period}", decision_every=5, time_budget_s=1.0
    )
    x = torch.randn(4, 8)
    model(x).sum().backward()
    sched.synchronize()
    try:
        sched.synchronize()  # e.g. once per micro-batch instead of no_sync()
    except RuntimeError as err:
        return str(err)
    finally:
        sched.step()
        sched.close()
    return "did not raise"


@pytest.mark.parametrize("period", [1, 2])
def test_synchronize_twice_names_no_sync(dist2, period):
    for msg in dist2.run(rank_sync_twice, period):
        assert "called twice" in msg and "sched.no_sync()" in msg, msg


def rank_unclosed(rank, world, period, close, wrap_ddp=False):
    import gc

    model = _model()
    if wrap_ddp:  # the DDP comm-hook path (DDPHookSynchronizer)
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = CommScheduler(
        model, opt, f"static:none/25MB/H{period}", decision_every=5, time_budget_s=1.0
    )
    torch.manual_seed(rank)  # each rank its own data: local steps move the replicas apart
    for _ in range(3):  # not a multiple of the period: the last steps are un-averaged
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        sched.step()
    if close:
        sched.close()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    torch.distributed.all_gather(gathered, flat)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del sched, model, opt  # the model's hooks hold the scheduler
        gc.collect()
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    return {"same": same, "warnings": [str(w.message) for w in caught]}


@pytest.mark.parametrize(
    ("period", "close", "wrap_ddp"),
    [(4, False, False), (4, True, False), (1, False, False), (4, False, True)],
)
def test_a_scheduler_dropped_unclosed_with_replicas_apart_warns_on_every_rank(
    dist2, period, close, wrap_ddp
):
    for res in dist2.run(rank_unclosed, period, close, wrap_ddp):
        msgs = res["warnings"]
        if period > 1 and not close:
            # local SGD: replicas apart, and every rank says so and what to do
            assert not res["same"]
            assert any("without close()" in m and "sched.close() on every rank" in m for m in msgs)
        else:
            assert res["same"] and not any("without close()" in m for m in msgs), msgs


# -- the training-time budget the policy was trained with ---------------------------------
def _policy_trained_with_budget(path: Path, budget_s: float) -> Path:
    """A policy saved from a real env of budget ``budget_s`` (no rank is started)."""
    import gymnasium as gym

    from commgym.env import EnvConfig

    env = gym.make("commgym/AllReduce-v1", config=EnvConfig(time_budget_s=budget_s))
    try:
        return StaticAgent(env, preset="int8/4MB/H1").save(path)
    finally:
        env.close()


def rank_budget_warnings(rank, world, path, budget_s):
    import warnings

    model = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sched = CommScheduler(
            model, torch.optim.SGD(model.parameters(), lr=0.1), path, time_budget_s=budget_s
        )
    sched.close()
    return [str(w.message) for w in caught]


def test_policy_file_records_its_budget_and_the_scheduler_warns_when_it_differs(dist2, tmp_path):
    path = str(_policy_trained_with_budget(tmp_path / "p.zip", 2.0))
    assert policy_time_budget(path) == 2.0
    assert policy_time_budget("static:int8/4MB/H1") is None  # a preset has no budget
    warned = dist2.run(rank_budget_warnings, path, 600.0)
    budget = [m for m in warned[0] if "training-time budget" in m]
    assert len(budget) == 1 and "time_budget_s=2 s" in budget[0]
    assert "time_budget_s=600 s" in budget[0]
    for same in dist2.run(rank_budget_warnings, path, 2.0):
        assert not [m for m in same if "training-time budget" in m]


def rank_oracle_adaptive_refused(rank, world):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        CommScheduler(model, opt, "oracle-adaptive", time_budget_s=1.0)
    except ValueError as err:
        return str(err)
    return None


def test_a_bound_in_hindsight_cannot_steer_a_job(dist2):
    for msg in dist2.run(rank_oracle_adaptive_refused):
        assert msg is not None and "hindsight" in msg and "for_seed" in msg, msg


class _FailingPolicy(StaticAgent):
    """A policy whose third answer raises (a bug in a user's agent)."""

    def __init__(self, env):
        super().__init__(env, preset="none/25MB/H1")
        self.calls = 0

    def _act(self, obs, state, deterministic):
        self.calls += 1
        if self.calls == 3:
            raise KeyError("a bug in the policy")
        return super()._act(obs, state, deterministic)


def rank_policy_raises(rank, world):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    policy = _FailingPolicy(LayoutEnv(ActionMenu()))
    # a short collective timeout: a rank left waiting would raise CollectiveTimeout instead
    sched = CommScheduler(model, opt, policy, decision_every=1, time_budget_s=1.0, timeout_s=20.0)
    try:
        for _ in range(6):
            model(torch.randn(4, 8)).sum().backward()
            sched.step()
            opt.zero_grad()
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    finally:
        sched.close()
    return "did not raise"


def test_a_policy_that_raises_stops_every_rank_at_the_same_decision(dist2):
    rank0, rank1 = dist2.run(rank_policy_raises)
    assert rank0.startswith("KeyError") and "a bug in the policy" in rank0, rank0
    assert rank1.startswith("RuntimeError") and "raised in predict on rank 0" in rank1, rank1


def rank_bad_policy(rank, world, policy):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        CommScheduler(model, opt, policy, time_budget_s=1.0)
    except ValueError as err:
        ok = _group_usable_after()
        return f"{type(err).__name__}: {err}", ok
    return "did not raise", None


def _group_usable_after():
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item() == dist.get_world_size()


@pytest.mark.parametrize(
    "policy, says",
    [
        ("static:int9/4MB/H1", "unknown static preset 'int9/4MB/H1': use one of"),
        ("no-such-policy.zip", "FileNotFoundError: policy file no-such-policy.zip does not exist"),
    ],
)
def test_a_bad_policy_raises_on_every_rank_naming_it_once(dist2, policy, says):
    # rank 0 alone reads the policy; every rank must refuse it (none may go on to train)
    for msg, usable in dist2.run(rank_bad_policy, policy):
        assert msg.startswith(f"ValueError: CommScheduler cannot use policy {policy!r}: "), msg
        assert says in msg, msg
        assert msg.count("ValueError") == 1, msg  # the type is not repeated inside
        assert usable, "the group is not usable after the refusal"


def rank_probe(rank, world, trained_on, probe_bytes):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    policy = StaticAgent(LayoutEnv(ActionMenu()), preset="none/25MB/H1")
    policy.trained_on = trained_on
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sched = CommScheduler(
            model, opt, policy, decision_every=2, time_budget_s=1.0, probe_bytes=probe_bytes
        )
    for _ in range(4):
        model(torch.randn(4, 8)).sum().backward()
        sched.step()
        opt.zero_grad()
    sched.close()
    probe_field = [f.name for f in OBSERVATION_FIELDS].index("log10_probe_gbps")
    return {
        "probe_bytes": sched.probe_bytes,
        "measured": [(r.measured["probe_bytes"], r.measured["probe_s"]) for r in sched.records],
        "obs": [r.observation[probe_field] for r in sched.records],
        "warnings": [str(w.message) for w in caught],
    }


def test_replay_runs_the_probe_the_policy_was_trained_with(dist2):
    facts = {"num_params": 212, "steps_per_decision": 2, "probe_bytes": 4096}
    for res in dist2.run(rank_probe, facts, None):
        assert res["probe_bytes"] == 4096
        assert [b for b, _ in res["measured"]] == [4096, 4096]
        assert all(s > 0 for _, s in res["measured"]) and all(o != 0 for o in res["obs"])
    for res in dist2.run(rank_probe, facts, 0):  # explicitly off
        assert res["measured"] == [(0, 0.0), (0, 0.0)] and res["obs"] == [0.0, 0.0]


def test_replay_warns_about_a_policy_trained_with_privileged_fields(dist2):
    facts = {"num_params": 212, "steps_per_decision": 2, "privileged_obs": True}
    rank0, _ = dist2.run(rank_probe, facts, None)
    assert any("privileged" in w for w in rank0["warnings"]), rank0["warnings"]


def rank_bad_probe(rank, world):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        CommScheduler(model, opt, "static:ddp-default", probe_bytes=-1)
    except ValueError as err:
        return str(err)
    return None


def test_a_negative_probe_is_refused_on_every_rank(dist2):
    for msg in dist2.run(rank_bad_probe):
        assert msg is not None and "probe_bytes must be an integer >= 0" in msg and "-1" in msg


class _ProbeReader(StepAgent):
    """Plays int8/4MB/H2 where the observation's probe field reads a link, else the
    default; remembers every observation it was asked about."""

    name = "probe-reader"

    def __init__(self, env):
        super().__init__(env)
        self.seen = []

    def _act(self, obs, state, deterministic):
        self.seen.append(np.asarray(obs).copy())
        field = [f.name for f in OBSERVATION_FIELDS].index("log10_probe_gbps")
        preset = "int8/4MB/H2" if obs[field] != 0.0 else "none/25MB/H1"
        return self.menu.encode(resolve_preset(self.menu, preset)), state


def rank_first_decision(rank, world, trained_on, initial_config):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    policy = _ProbeReader(LayoutEnv(ActionMenu()))
    policy.trained_on = trained_on
    sched = CommScheduler(
        model, opt, policy, decision_every=2, time_budget_s=1.0, initial_config=initial_config
    )
    start = {"config": str(sched.config), "clock": sched.train_time_s}
    first_obs = sched.observation.tolist()
    for _ in range(4):
        model(torch.randn(4, 8)).sum().backward()
        sched.step()
        opt.zero_grad()
    sched.close()
    field = [f.name for f in OBSERVATION_FIELDS].index("log10_probe_gbps")
    return {
        **start,
        "probe_at": sched.probe_at,
        "asked": [o.tolist() for o in policy.seen] if rank == 0 else None,
        "first_obs": first_obs,
        "records": [
            (r.previous_config, r.measured["probe_bytes"], r.observation[field])
            for r in sched.records
        ],
        "params": [p.detach().clone() for p in model.parameters()],
    }


def test_the_policy_chooses_the_first_window_from_the_reset_observation(dist2):
    """As in the env, where the first decision's entry is the policy's answer to the reset
    observation: a policy file's first entry is in force from the first step (here the
    probe-reading policy sees no probe, so it answers the default); ``initial_config``, where
    given, runs the first window instead."""
    facts = {"num_params": 212, "steps_per_decision": 2}
    rank0, rank1 = dist2.run(rank_first_decision, facts, None)
    for res in (rank0, rank1):
        assert res["config"] == "none/25MB/H1" and res["records"][0][0] == "none/25MB/H1"
        assert res["probe_at"] == "decision" and res["clock"] == 0.0
    # asked at construction, about the reset observation, then once per decision
    assert len(rank0["asked"]) == 3 and rank0["asked"][0] == rank0["first_obs"]
    start = resolve_preset(ActionMenu(), "fp16/4MB/H1")
    rank0, _ = dist2.run(rank_first_decision, facts, start)
    assert rank0["config"] == "fp16/4MB/H1" and rank0["records"][0][0] == "fp16/4MB/H1"
    assert len(rank0["asked"]) == 2  # one answer per decision, none before the first window


def test_a_policy_trained_with_one_probe_at_reset_gets_it_at_construction(dist2):
    """probe_at="reset" (the policy file's ``trained_on``): one probe when the scheduler is
    built; the first observation reads it and the policy's first entry follows from it; the
    clock starts at its time; the decisions run no probe; replicas stay identical."""
    facts = {"num_params": 212, "steps_per_decision": 2, "probe_bytes": 65536,
             "probe_at": "reset"}  # fmt: skip
    rank0, rank1 = dist2.run(rank_first_decision, facts, None)
    field = [f.name for f in OBSERVATION_FIELDS].index("log10_probe_gbps")
    for res in (rank0, rank1):
        assert res["probe_at"] == "reset" and res["clock"] > 0.0
        assert res["first_obs"][field] != 0.0
        assert res["config"] == "int8/4MB/H2" and res["records"][0][0] == "int8/4MB/H2"
        assert [(b, o) for _, b, o in res["records"]] == [(0, 0.0), (0, 0.0)]
    assert rank0["asked"][0] == rank0["first_obs"]  # asked about the reset observation
    assert rank0["first_obs"] == rank1["first_obs"]
    for a, b in zip(rank0["params"], rank1["params"], strict=True):
        assert torch.equal(a, b)
