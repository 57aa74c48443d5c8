"""DDPHookSynchronizer: a user's DDP model resumes bit-identically around DDP's bucket rebuild.

DDP (``find_unused_parameters=False``) starts with one bucket and rebuilds its buckets
once, at the second synchronising forward, in the order the gradients became ready. A
checkpoint taken right after the first iteration saved the one bucket the hook had seen,
so the resumed job compressed its first iteration in that bucket while the uninterrupted
job used the rebuilt ones: layout-dependent compressors (int8 scales per block, top-k per
bucket, PowerSGD per matrix) deviated (found by the training-loop fuzzer). The
synchronizer now saves the buckets DDP uses next, predicted from the recorded ready
order while the rebuild is pending, so a resume at any step is bit-identical, also at
three ranks.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from commgym.collectives import CommConfig
from commgym.collectives.ddp_sync import DDPHookSynchronizer
from tests.collectives.test_ddp_semantics import BNNet, _images
from tests.dist_pool import shared_pool


def _job(spec: str):
    torch.manual_seed(0)
    model = BNNet()
    ddp = DDP(model, bucket_cap_mb=0.001)  # one bucket, several after the rebuild
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    sync = DDPHookSynchronizer(ddp, CommConfig(spec), seed=2, optimizer=opt)
    return model, ddp, opt, sync


def _train(rank, ddp, opt, sync, steps):
    for step in steps:
        opt.zero_grad(set_to_none=True)
        x, y = _images(rank, step)
        F.cross_entropy(ddp(x), y).backward()
        sync.synchronize()
        opt.step()
        sync.after_optimizer_step()


def rank_resume(rank, world, spec, stop_at, total=5):
    model, ddp, opt, sync = _job(spec)
    _train(rank, ddp, opt, sync, range(stop_at))
    ckpt = copy.deepcopy(
        {"model": model.state_dict(), "opt": opt.state_dict(), "sync": sync.state_dict()}
    )
    _train(rank, ddp, opt, sync, range(stop_at, total))
    reference = [p.detach().clone() for p in model.parameters()]
    rebuilt = list(sync.state.layouts)  # what DDP handed the hook after its rebuild
    model, ddp, opt, sync = _job(spec)  # a fresh job: one initial bucket
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    sync.load_state_dict(ckpt["sync"])
    _train(rank, ddp, opt, sync, range(stop_at, total))
    return {
        "saved_layouts": [tuple(x) for x in ckpt["sync"]["hook"]["layouts"]],
        "rebuilt": [tuple(x) for x in rebuilt],
        "identical": all(
            torch.equal(a, b) for a, b in zip(model.parameters(), reference, strict=True)
        ),
    }


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("spec", ["int8", "topk:0.1", "powersgd:1", "none"])
@pytest.mark.parametrize("stop_at", [1, 3], ids=["pending-rebuild", "after-rebuild"])
def test_ddp_hook_resume_is_bit_identical_around_the_rebuild(world, spec, stop_at):
    for r in shared_pool(world).run(rank_resume, spec, stop_at):
        assert len(r["rebuilt"]) > 1, r["rebuilt"]
        assert r["saved_layouts"] == r["rebuilt"], r  # also when the rebuild was pending
        assert r["identical"], f"{spec}: resumed at step {stop_at} deviates"
