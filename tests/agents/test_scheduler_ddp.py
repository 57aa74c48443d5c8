"""CommScheduler inside a user's own DistributedDataParallel job (gloo, 2 and 4 ranks).

A deterministic policy switches compression and period every decision through ONE comm
hook on the user's DDP model (default ``find_unused_parameters=False``, several buckets,
so DDP rebuilds them after iteration 1). Replicas stay identical, and a job checkpointed
per rank at any step and resumed in fresh DDP wrapper/optimizer/scheduler objects ends
bit-identical to the uninterrupted one.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from commgym.agents.base import LayoutEnv, StepAgent
from commgym.agents.scheduler import CommScheduler, policy_mismatch
from commgym.env.spaces import ActionMenu
from tests.collectives.test_ddp_semantics import BNNet, _images

#: (compression, bucket, period) menu indices the test policy cycles through
CYCLE = [(2, 0, 0), (3, 1, 0), (4, 0, 0), (0, 0, 1), (1, 2, 0)]


class CyclePolicy(StepAgent):
    """Answers CYCLE[decision % len]; the decision count is its recurrent state."""

    name = "cycle-test"

    def _act(self, obs, state, deterministic):
        n = 0 if state is None else int(state)
        return np.array(CYCLE[n % len(CYCLE)], dtype=np.int64), n + 1


def _build(rank, wrapper="ddp"):
    torch.manual_seed(0)
    model = BNNet()
    if wrapper == "ddp":
        ddp = DDP(model, bucket_cap_mb=0.0005)  # several buckets, rebuilt after iteration 1
    else:  # CommScheduler wraps the plain module with a GradientSynchronizer
        ddp = model
    opt = torch.optim.AdamW(ddp.parameters(), lr=0.02, weight_decay=0.01)
    policy = CyclePolicy(LayoutEnv(ActionMenu()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no time budget; bucket size stays DDP's
        sched = CommScheduler(ddp, opt, policy, decision_every=2, seed=5)
    return model, ddp, opt, sched


def _train(rank, ddp, opt, sched, steps):
    for step in steps:
        opt.zero_grad(set_to_none=True)
        with sched.no_sync():  # two micro-batches per step
            x, y = _images(rank, step, 0)
            F.cross_entropy(ddp(x), y).backward()
        x, y = _images(rank, step, 1)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        sched.synchronize()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        sched.step(loss)


def _flat(model):
    return torch.cat([t.detach().double().reshape(-1) for t in model.state_dict().values()])


def rank_ddp_resume(rank, world, stop_at, total, wrapper="ddp"):
    model, ddp, opt, sched = _build(rank, wrapper)
    _train(rank, ddp, opt, sched, range(total))
    sched.close()
    configs = [r.config for r in sched.records]
    reference = _flat(model)
    # the DDP buckets the hook saw (after the rebuild)
    buckets = sched.sync.state.layouts if wrapper == "ddp" else [0, 1]

    model, ddp, opt, sched = _build(rank, wrapper)
    _train(rank, ddp, opt, sched, range(stop_at))
    ckpt = copy.deepcopy(
        {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
    )  # this rank's checkpoint (saved per rank)
    del model, ddp, opt, sched
    # a fresh job: new DDP wrapper (pre-rebuild buckets), optimizer and scheduler
    model, ddp, opt, sched = _build(rank, wrapper)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    sched.load_state_dict(ckpt["sched"])
    _train(rank, ddp, opt, sched, range(stop_at, total))
    sched.close()
    resumed = _flat(model)
    # BN statistics are rank-local until the next forward broadcasts them (as in DDP)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    rows = [torch.empty_like(params) for _ in range(world)]
    dist.all_gather(rows, params)
    return {
        "configs": configs,
        "resumed_configs": [r.config for r in sched.records],
        "bit_identical": torch.equal(resumed, reference),
        "max_diff": float((resumed - reference).abs().max()),
        "ranks_identical": all(torch.equal(r, rows[0]) for r in rows),
        "buckets": buckets,
    }


@pytest.mark.parametrize("stop_at", [1, 5])
def test_policy_switches_inside_ddp_and_resume_is_bit_identical(dist2, stop_at):
    for r in dist2.run(rank_ddp_resume, stop_at, 8):
        assert len(r["buckets"]) > 1, r["buckets"]  # DDP had several buckets
        assert len(set(r["configs"])) >= 3, r["configs"]  # the policy switched compression
        assert r["resumed_configs"] == r["configs"]
        assert r["ranks_identical"], "replicas differ across ranks"
        assert r["bit_identical"], f"resume deviates by {r['max_diff']}"


def test_scheduler_resume_is_bit_identical_without_ddp(dist2):
    for r in dist2.run(rank_ddp_resume, 5, 8, "sync"):
        assert len(set(r["configs"])) >= 3, r["configs"]
        assert r["resumed_configs"] == r["configs"]
        assert r["ranks_identical"], "replicas differ across ranks"
        assert r["bit_identical"], f"resume deviates by {r['max_diff']}"


def rank_ddp_replicas(rank, world):
    model, ddp, opt, sched = _build(rank)
    out = []
    for step in range(10):
        _train(rank, ddp, opt, sched, [step])
        sched.sync.consensus()  # local-SGD windows: compare the consensus model
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        rows = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(rows, flat)
        out.append(all(torch.equal(r, rows[0]) for r in rows))
    sched.close()
    return out, [r.config for r in sched.records]


def test_ddp_replicas_identical_on_four_ranks(dist4):
    for identical, configs in dist4.run(rank_ddp_replicas):
        assert all(identical)
        assert len(set(configs)) >= 3


def test_policy_mismatch_names_both_values():
    msgs = policy_mismatch(
        {"num_params": 1_100_000, "steps_per_decision": 10}, num_params=100_000, decision_every=5
    )
    assert "1,100,000" in msgs[0] and "100,000" in msgs[0]
    assert "10 steps per decision" in msgs[1] and "decision_every=5" in msgs[1]
    assert policy_mismatch({"num_params": 1000, "steps_per_decision": 5}, num_params=1500,
                           decision_every=5) == []  # fmt: skip
    assert policy_mismatch(None, num_params=1, decision_every=1) == []
