"""GradientSynchronizer keeps DDP's guarantees: compared with plain torch DDP (gloo, 2/4 ranks).

The reference is ``DistributedDataParallel(find_unused_parameters=True)`` on the same
model, data and optimizer: commgym's ``none`` must give the same parameters, buffers,
gradients (``None`` included) and optimizer state bit for bit, with a CNN with BatchNorm,
a frozen layer, a branch that is unused on some steps or some ranks, AdamW, gradient
accumulation, clipping after ``synchronize()`` and bf16 autocast.
"""

from __future__ import annotations

import copy
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from commgym.collectives import CollectiveTimeout, CommConfig, GradientSynchronizer
from tests.collectives.test_synchronizer import _batch, mlp
from tests.dist_pool import DistPool


class BNNet(torch.nn.Module):
    """Conv + BatchNorm blocks, a frozen layer and a branch used only when asked."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 6, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(6)
        self.frozen = torch.nn.Linear(6, 6)
        self.frozen.requires_grad_(False)
        self.head = torch.nn.Linear(6, 5)
        self.branch = torch.nn.Linear(6, 5)

    def forward(self, x: torch.Tensor, use_branch: bool = True) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = self.frozen(h.mean((2, 3)))
        out = self.head(h)
        return out + self.branch(h) if use_branch else out


def _images(rank: int, step: int, micro: int = 0, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * rank + 100 * step + micro)
    return torch.randn(n, 1, 6, 6, generator=g) * (1 + rank), torch.randint(0, 5, (n,), generator=g)


def _uses_branch(rank: int, step: int) -> bool:
    # used everywhere, nowhere, on rank 0 only, nowhere
    return (step % 4 == 0) or (step % 4 == 2 and rank == 0)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return torch.equal(a, b)


def _flat_state(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([t.detach().double().reshape(-1) for t in model.state_dict().values()])


def rank_vs_ddp(rank, world, mode):
    torch.manual_seed(rank)  # replicas differ at start: construction must broadcast
    base = BNNet()
    ours, ref = copy.deepcopy(base), copy.deepcopy(base)
    ddp = DDP(ref, find_unused_parameters=True)
    opt_a = torch.optim.AdamW([p for p in ours.parameters() if p.requires_grad], lr=0.05)
    opt_b = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=0.05)
    sync = GradientSynchronizer(ours, CommConfig("none"), optimizer=opt_a)
    micro = 2 if mode.startswith("accum") else 1
    # accum-keep: gradients zeroed in place (they are bucket views after the first step, so
    # backward accumulates into the bucket itself), and after step 0 the branch used only in
    # the first micro-batch: its gradient, a bucket view since step 0, reaches the bucket
    # from no_sync(), not from the last backward
    keep = mode == "accum-keep"
    out = []
    for step in range(6):
        opt_a.zero_grad(set_to_none=not keep)
        opt_b.zero_grad(set_to_none=not keep)
        for m in range(micro):
            x, y = _images(rank, step, m)
            last = m == micro - 1
            use = _uses_branch(rank, step) and not (keep and last and step > 0)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
                if last:
                    loss_a = F.cross_entropy(ours(x, use), y)
                    loss_b = F.cross_entropy(ddp(x, use), y)
                else:
                    with sync.no_sync():
                        loss_a = F.cross_entropy(ours(x, use), y)
                    with ddp.no_sync():
                        loss_b = F.cross_entropy(ddp(x, use), y)
            if last:
                loss_a.backward()
                loss_b.backward()
            else:
                with sync.no_sync():
                    loss_a.backward()
                with ddp.no_sync():
                    loss_b.backward()
        sync.synchronize()
        if mode == "clip":  # on the synchronised gradient, as DDP users clip after backward
            torch.nn.utils.clip_grad_norm_(ours.parameters(), 0.05)
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        grads = [
            _same(a.grad, b.grad) for a, b in zip(ours.parameters(), ref.parameters(), strict=True)
        ]
        opt_a.step()
        sync.after_optimizer_step()
        opt_b.step()
        # an evaluation forward: it broadcasts rank 0's BN statistics first (the previous
        # forward was a training one), so buffers are identical on every rank afterwards
        ours.eval(), ref.eval()
        with torch.no_grad():
            ours(x[:2], use)
            ddp(x[:2], use)
        ours.train(), ref.train()
        state_a, state_b = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
        flat = _flat_state(ours)
        rows = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(rows, flat)
        out.append(
            {
                "grads": all(grads),
                "branch_grad_none": ours.branch.weight.grad is None,
                "state_dict": all(
                    torch.equal(a, b)
                    for a, b in zip(
                        ours.state_dict().values(), ref.state_dict().values(), strict=True
                    )
                ),
                "optimizer": state_a.keys() == state_b.keys()
                and all(_same(state_a[k][n], state_b[k][n]) for k in state_a for n in state_a[k]),
                "ranks_identical": all(torch.equal(r, rows[0]) for r in rows),
            }
        )
    return out


@pytest.mark.parametrize("mode", ["plain", "accum", "accum-keep", "clip", "bf16"])
def test_none_is_bit_identical_to_ddp(dist_any, mode):
    for rank, steps in enumerate(dist_any.run(rank_vs_ddp, mode)):
        for step, r in enumerate(steps):
            assert r["grads"], (rank, step, "gradients (None included) differ from DDP")
            assert r["state_dict"], (rank, step, "parameters or BN buffers differ from DDP")
            assert r["optimizer"], (rank, step, "AdamW state differs from DDP")
            assert r["ranks_identical"], (rank, step, "replicas differ across ranks")
            # the branch is unused on every rank at steps 1, 3, 5: grad stays None (zeros
            # where gradients are zeroed in place)
            assert r["branch_grad_none"] == (step % 2 == 1 and mode != "accum-keep"), (rank, step)


def test_none_is_bit_identical_to_ddp_at_three_ranks():
    # 1/W is not a power of two: DDP multiplies by it (dividing differs in the last bit)
    pool = DistPool(3)
    try:
        out = pool.run(rank_vs_ddp, "accum")
    finally:
        pool.close()
    for steps in out:
        assert all(r["grads"] and r["state_dict"] and r["optimizer"] for r in steps)
        assert all(r["ranks_identical"] for r in steps)


# ---------------------------------------------------------------------------------
def _raises(fn, exc, match) -> str:
    try:
        fn()
    except exc as err:
        if match not in str(err):
            return f"wrong message: {err}"
        return "raised"
    return "did not raise"


def _step(model, rank, step=0):
    x, y = _batch(rank, step)
    F.cross_entropy(model(x), y).backward()


def rank_misuse(rank, world):
    out = {}
    torch.manual_seed(0)

    # optimizer.step() before synchronize()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sync = GradientSynchronizer(model, CommConfig("none"))
    _step(model, rank)
    opt.step()
    out["step_before_sync"] = _raises(sync.synchronize, RuntimeError, "before synchronize()")

    # clipping local gradients between backward and synchronize()
    for spec in ("none", "int8"):
        model = mlp()
        sync = GradientSynchronizer(model, CommConfig(spec))
        model.zero_grad(set_to_none=True)
        _step(model, rank)
        sync.synchronize()  # first step: gradients become bucket views
        model.zero_grad(set_to_none=False)
        _step(model, rank, 1)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        out[f"clip_before_sync_{spec}"] = _raises(
            sync.synchronize, RuntimeError, "clip / unscale the synchronised gradient"
        )

    # local SGD without after_optimizer_step()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sync = GradientSynchronizer(model, CommConfig("none", sync_period=2))
    _step(model, rank)
    sync.synchronize()
    opt.step()
    model.zero_grad()
    _step(model, rank, 1)
    out["missing_after_optimizer_step"] = _raises(
        sync.synchronize, RuntimeError, "after_optimizer_step()"
    )

    # a second backward without no_sync()
    model = mlp()
    sync = GradientSynchronizer(model, CommConfig("none"))
    _step(model, rank)
    out["second_backward"] = _raises(lambda: _step(model, rank, 1), RuntimeError, "no_sync()")
    sync._drain()

    # synchronize() forgotten: optimizer.step() on local gradients, then the next backward
    # says so (not "accumulate with no_sync()", the other cause of a second backward)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sync = GradientSynchronizer(model, CommConfig("none"))
    _step(model, rank)
    opt.step()
    opt.zero_grad()
    out["forgot_synchronize"] = _raises(
        lambda: _step(model, rank, 1), RuntimeError, "synchronize() was not called"
    )
    sync._drain()

    # seeds, configurations, models or reconfigurations that differ across ranks
    out["seed"] = _raises(
        lambda: GradientSynchronizer(mlp(), CommConfig("randomk:0.1"), seed=rank),
        ValueError,
        "seed: rank 0=0, rank 1=1",
    )
    out["config"] = _raises(
        lambda: GradientSynchronizer(mlp(), CommConfig("fp16" if rank == 0 else "bf16")),
        ValueError,
        "config",
    )
    width = 64 if rank == 0 else 65
    out["model"] = _raises(
        lambda: GradientSynchronizer(torch.nn.Linear(width, 2), CommConfig()),
        ValueError,
        "parameters",
    )
    model = mlp()
    sync = GradientSynchronizer(model, CommConfig("none"))
    out["reconfigure"] = _raises(
        lambda: sync.reconfigure(CommConfig("int8", bucket_mb=1.0 + rank)),
        ValueError,
        "reconfigure",
    )
    # after all of that the group still works
    t = torch.ones(1)
    dist.all_reduce(t)
    out["group_usable"] = float(t) == world
    return out


def test_every_misuse_raises_on_every_rank(dist_any):
    for rank, out in enumerate(dist_any.run(rank_misuse)):
        assert out.pop("group_usable")
        assert out == {k: "raised" for k in out}, (rank, out)


def rank_harmless_misuse(rank, world):
    # ranks seeded differently: construction broadcasts rank 0's replica (as DDP)
    torch.manual_seed(rank)
    model = BNNet()
    GradientSynchronizer(model, CommConfig("none"))
    flat = _flat_state(model)
    rows = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(rows, flat)
    return all(torch.equal(r, rows[0]) for r in rows)


def test_unseeded_replicas_are_made_identical(dist2):
    assert all(dist2.run(rank_harmless_misuse))


# ---------------------------------------------------------------------------------
def rank_grad_scaler(rank, world, spec):
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sync = GradientSynchronizer(model, CommConfig(spec, bucket_mb=0.004))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    out = []
    for step in range(3):
        opt.zero_grad(set_to_none=True)
        x, y = _batch(rank, step)
        if step == 1 and rank == world - 1:
            x[0, :] = float("inf")  # one rank overflows
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        stats = sync.synchronize()
        before = _flat_state(model)
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        sync.after_optimizer_step()
        after = _flat_state(model)
        rows = [torch.empty_like(after) for _ in range(world)]
        dist.all_gather(rows, after)
        out.append(
            {
                "flagged": stats.nonfinite,
                "skipped": torch.equal(before, after),
                "scale": scaler.get_scale(),
                "identical": all(torch.equal(r, rows[0]) for r in rows),
                "finite": bool(torch.isfinite(after).all()),
            }
        )
    return out


@pytest.mark.parametrize("spec", ["none", "int8", "topk:0.05", "randomk:0.05", "powersgd:2"])
def test_grad_scaler_skips_an_overflow_on_every_rank(dist_any, spec):
    for steps in dist_any.run(rank_grad_scaler, spec):
        assert [s["flagged"] for s in steps] == [False, True, False]
        assert [s["skipped"] for s in steps] == [False, True, False]
        assert steps[1]["scale"] == steps[0]["scale"] / 2
        assert all(s["identical"] and s["finite"] for s in steps)


# ---------------------------------------------------------------------------------
def rank_stall(rank, world):
    model = mlp()
    sync = GradientSynchronizer(model, CommConfig("none"), timeout_s=1.0)
    if rank == 1:
        time.sleep(3.0)  # stalled before its backward: its collectives never start
        return "stalled"
    _step(model, rank)
    t0 = time.perf_counter()
    try:
        sync.synchronize()
    except CollectiveTimeout as err:
        return f"timeout after {time.perf_counter() - t0:.1f}s: {err}"
    return "no error"


def test_a_stalled_rank_becomes_a_timeout_error():
    pool = DistPool(2)  # its own ranks: the abandoned collective must not leak into others
    try:
        out = pool.run(rank_stall, timeout_s=60)
    finally:
        pool.close()
    assert out[1] == "stalled"
    assert out[0].startswith("timeout after") and "timeout_s=1" in out[0], out[0]
    assert float(out[0].split()[2].rstrip("s:")) < 3.0


# ---------------------------------------------------------------------------------
def rank_sync_twice(rank, world):
    # accumulation done wrong: synchronize() after each micro-batch under local SGD
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sync = GradientSynchronizer(model, CommConfig("none", sync_period=2), optimizer=opt)
    _step(model, rank)
    sync.synchronize()
    _step(model, rank, 1)
    try:
        sync.synchronize()
    except RuntimeError as err:
        return str(err)
    return "did not raise"


def test_synchronize_twice_under_local_sgd_names_no_sync(dist2):
    for msg in dist2.run(rank_sync_twice):
        assert "no_sync()" in msg and "after_optimizer_step()" in msg, msg
        assert msg.index("no_sync()") < msg.index("after_optimizer_step() once"), msg
