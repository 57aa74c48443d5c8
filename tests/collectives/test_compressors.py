"""Compressors simulated for W ranks in one process (no torch.distributed).

The simulation does exactly what the communicator does: inputs are pre-divided by the
world size; ``summable`` payloads are summed element-wise (in the payload dtype, as an
all-reduce SUM would) and written back into every rank's payload tensors, then each rank
decompresses once; non-summable payloads are "all-gathered" (copied) and decompressed
rank by rank with ``accumulate=True`` into a zeroed output.
"""

from __future__ import annotations

import math

import pytest
import torch

from commgym.collectives import BucketLayout, make_compressor
from commgym.collectives.kernels import reference as R

EPS = torch.finfo(torch.float32).eps


def _make_powersgd(rank, world, **kw):
    return make_compressor(f"powersgd:{rank}", world_size=world, **kw)


def _randn(shape, seed: int, mag: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * mag


def _layout(*shapes, key: str = "b0") -> BucketLayout:
    return BucketLayout(key, tuple(torch.Size(s) for s in shapes))


def _all_reduce(payloads: list[list[torch.Tensor]]) -> None:
    """In-place SUM over ranks of every payload tensor (rank order, payload dtype)."""
    for i in range(len(payloads[0])):
        total = payloads[0][i].clone()
        for p in payloads[1:]:
            total += p[i]
        for p in payloads:
            p[i].copy_(total)


def _simulate(comps, flats, layout, residuals=None):
    """One step of W ranks; returns each rank's decompressed output."""
    world = len(comps)
    residuals = residuals or [None] * world
    n = flats[0].numel()
    payloads, ctxs = [], []
    for r in range(world):
        p, c = comps[r].compress(flats[r], layout, residuals[r])
        payloads.append(p)
        ctxs.append(c)
    if comps[0].summable:
        _all_reduce(payloads)
        for rnd in range(1, comps[0].rounds):
            payloads = [comps[r].advance(rnd, payloads[r], ctxs[r]) for r in range(world)]
            _all_reduce(payloads)
        outs = []
        for r in range(world):
            out = torch.full((n,), float("nan"))
            comps[r].decompress(payloads[r], ctxs[r], out)
            outs.append(out)
        return outs
    gathered = [[t.clone() for t in p] for p in payloads]
    outs = []
    for r in range(world):
        out = torch.zeros(n)
        for q in range(world):
            comps[r].decompress(gathered[q], ctxs[r], out, accumulate=True)
        outs.append(out)
    return outs


def _seq_sum(ts):
    total = torch.zeros_like(ts[0])
    for t in ts:
        total = total + t
    return total


# =========================================================================== none / 16-bit


@pytest.mark.parametrize("world", [1, 2, 4])
def test_none_is_exact_sum(world):
    n = 777
    layout = _layout((n,))
    flats = [_randn(n, r) / world for r in range(world)]
    outs = _simulate(
        [make_compressor("none") for _ in range(world)], [f.clone() for f in flats], layout
    )
    for out in outs:
        assert torch.equal(out, _seq_sum(flats))


@pytest.mark.parametrize("method", ["fp16", "bf16"])
@pytest.mark.parametrize("world", [2, 4])
def test_half_precision_sum_within_16_bit_tolerance(method, world):
    n = 1000
    flats = [_randn(n, r) / world for r in range(world)]
    comps = [make_compressor(method) for _ in range(world)]
    outs = _simulate(comps, flats, _layout((n,)))
    exact = _seq_sum(flats)
    # one cast per rank plus W-1 16-bit additions: relative error <= W * unit roundoff
    u = 2**-11 if method == "fp16" else 2**-8
    bound = (world + 1) * u * _seq_sum([f.abs() for f in flats])
    assert bool(((outs[0] - exact).abs() <= bound).all())
    assert comps[0].wire_bytes(_layout((n,))) == 2 * n


def test_fp16_pre_division_avoids_overflow():
    """Four ranks with gradients of 60000 (< fp16 max 65504): the mean stays finite."""
    world, n = 4, 64
    flats = [torch.full((n,), 60000.0) / world for _ in range(world)]
    outs = _simulate([make_compressor("fp16") for _ in range(world)], flats, _layout((n,)))
    assert bool(torch.isfinite(outs[0]).all())
    torch.testing.assert_close(outs[0], torch.full((n,), 60000.0), rtol=2**-10, atol=0)


# =========================================================================== top-k


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1001])
@pytest.mark.parametrize("density", [1e-6, 0.01, 0.1, 0.25, 0.5, 0.999, 1.0])
def test_topk_sends_exactly_k_largest(n, density):
    k = max(1, math.floor(density * n + 0.5))
    assert R.topk_k(n, density) == min(n, k)
    k = min(n, k)
    comp = make_compressor(f"topk:{density}")
    layout = _layout((n,))
    x = _randn(n, n) + 0.01  # distinct magnitudes
    (buf,), ctx = comp.compress(x, layout, None)
    assert ctx == k and buf.dtype == torch.int32 and buf.numel() == 2 * k
    assert comp.wire_bytes(layout) == 8 * k == buf.numel() * buf.element_size()
    idx = buf[k:].long()
    assert len(set(idx.tolist())) == k and int(idx.min()) >= 0 and int(idx.max()) < n
    assert torch.equal(buf[:k].view(torch.float32), x[idx])
    out = torch.full((n,), 5.0)
    comp.decompress([buf], ctx, out)
    assert int((out != 0).sum()) == k
    unsent = torch.ones(n, dtype=torch.bool)
    unsent[idx] = False
    if unsent.any():
        assert float(x[idx].abs().min()) >= float(x[unsent].abs().max())


def test_topk_empty_bucket():
    comp = make_compressor("topk:0.5")
    (buf,), k = comp.compress(torch.zeros(0), _layout((0,)), torch.zeros(0))
    assert k == 0 and buf.numel() == 0
    out = torch.zeros(0)
    comp.decompress([buf], k, out)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_topk_density_one_is_exact_dense_sum(world):
    n = 513
    flats = [_randn(n, 40 + r) / world for r in range(world)]
    comps = [make_compressor("topk:1.0") for _ in range(world)]
    residuals = [torch.zeros(n) for _ in range(world)]
    outs = _simulate(comps, flats, _layout((n,)), residuals)
    for out in outs:
        assert torch.equal(out, _seq_sum(flats))
    assert all(bool((res == 0).all()) for res in residuals)


@pytest.mark.parametrize("density", [0.01, 0.1, 0.5])
def test_topk_error_feedback_conserves_every_step(density):
    """sent + residual_new == x + residual_old element-wise, exactly, for 6 steps."""
    n = 1000
    layout = _layout((n,))
    comp = make_compressor(f"topk:{density}")
    residual = torch.zeros(n)
    total_in, total_sent = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for step in range(6):
        x = _randn(n, step)
        expected = x + residual  # the fp32 sum the kernel forms
        payload, ctx = comp.compress(x, layout, residual)
        sent = torch.zeros(n)
        comp.decompress(payload, ctx, sent)
        assert torch.equal(sent + residual, expected)
        assert int((sent != 0).sum()) == R.topk_k(n, density)
        total_in += x.double()
        total_sent += sent.double()
    # over all steps: everything that went in was sent or is still in the residual
    torch.testing.assert_close(total_sent + residual.double(), total_in, rtol=0, atol=1e-5)


@pytest.mark.parametrize("pattern", ["ones", "alternating", "zeros"])
def test_topk_ties_select_exactly_k(pattern):
    n, density = 300, 0.1
    k = R.topk_k(n, density)
    if pattern == "ones":
        x = torch.ones(n)
    elif pattern == "alternating":
        x = torch.tensor([1.0, -1.0]).repeat(n // 2)
    else:
        x = torch.zeros(n)
    comp = make_compressor(f"topk:{density}")
    residual = torch.zeros(n)
    for _ in range(3):
        expected = x + residual
        (buf,), ctx = comp.compress(x, _layout((n,)), residual)
        assert ctx == k and len(set(buf[k:].tolist())) == k
        sent = torch.zeros(n)
        comp.decompress([buf], ctx, sent)
        assert torch.equal(sent + residual, expected)


@pytest.mark.parametrize("world", [2, 4])
def test_topk_gather_sum_equals_sum_of_sparse_vectors(world):
    n, density = 800, 0.05
    layout = _layout((n,))
    flats = [_randn(n, 60 + r) / world for r in range(world)]
    comps = [make_compressor(f"topk:{density}") for _ in range(world)]
    sparse = []
    for r in range(world):
        c = make_compressor(f"topk:{density}")
        p, ctx = c.compress(flats[r], layout, None)
        s = torch.zeros(n)
        c.decompress(p, ctx, s)
        sparse.append(s)
    outs = _simulate(comps, flats, layout)
    for out in outs:
        assert torch.equal(out, _seq_sum(sparse))


def test_topk_nonfinite_input_never_stored_in_residual():
    n = 50
    x = _randn(n, 1)
    x[3] = float("nan")
    x[7] = float("inf")
    old = _randn(n, 2, 0.1)
    residual = old.clone()
    (buf,), k = make_compressor("topk:0.1").compress(x, _layout((n,)), residual)
    assert bool(torch.isfinite(residual).all())
    sent = set(buf[k:].tolist())
    for i in (3, 7):
        # a sent element leaves 0 behind, an unsent one keeps its old residual
        assert residual[i] == (0.0 if i in sent else old[i])


# =========================================================================== random-k


@pytest.mark.parametrize("n,density", [(10, 0.3), (1000, 0.01), (1000, 0.37), (7, 1.0), (1, 0.5)])
def test_randomk_indices_distinct_sorted_in_range_one_per_stratum(n, density):
    k = R.topk_k(n, density)
    idx, sizes = R.randomk_indices(n, k, seed=1234)
    assert idx.dtype == torch.int64 and idx.numel() == k
    assert int(sizes.sum()) == n and int(sizes.min()) >= 1
    assert bool((idx[1:] > idx[:-1]).all())  # sorted and distinct
    assert int(idx.min()) >= 0 and int(idx.max()) < n
    lo = torch.cumsum(sizes, 0) - sizes
    assert bool(((idx >= lo) & (idx < lo + sizes)).all())


def test_randomk_same_seed_same_indices_across_ranks():
    world, n = 4, 2000
    layout = _layout((n,))
    comps = [make_compressor("randomk:0.05", seed=77) for _ in range(world)]
    for step in range(3):
        ctxs = [
            comps[r].compress(_randn(n, 10 * step + r), layout, torch.zeros(n))[1]
            for r in range(world)
        ]
        for c in ctxs[1:]:
            assert torch.equal(c[0], ctxs[0][0]) and torch.equal(c[1], ctxs[0][1])
        if step == 0:
            first = ctxs[0][0]
    # later calls draw new indices; another seed or another bucket key draws others
    assert not torch.equal(ctxs[0][0], first)
    other_seed = make_compressor("randomk:0.05", seed=78).compress(_randn(n, 0), layout, None)[1]
    other_key = make_compressor("randomk:0.05", seed=77).compress(
        _randn(n, 0), _layout((n,), key="b1"), None
    )[1]
    assert not torch.equal(other_seed[0], first)
    assert not torch.equal(other_key[0], first)


@pytest.mark.parametrize("error_feedback", [True, False])
@pytest.mark.parametrize("world", [2, 4])
def test_randomk_summed_payload_equals_sum_of_sparse_vectors(error_feedback, world):
    n, density = 900, 0.1
    layout = _layout((n,))
    flats = [_randn(n, 80 + r) / world for r in range(world)]
    comps = [
        make_compressor(f"randomk:{density}", seed=3, error_feedback=error_feedback)
        for _ in range(world)
    ]
    solo = [
        make_compressor(f"randomk:{density}", seed=3, error_feedback=error_feedback)
        for _ in range(world)
    ]
    sparse = []
    for r in range(world):
        p, ctx = solo[r].compress(flats[r], layout, None)
        s = torch.zeros(n)
        solo[r].decompress(p, ctx, s)
        assert int((s != 0).sum()) == R.topk_k(n, density)
        sparse.append(s)
    outs = _simulate(comps, flats, layout)
    assert comps[0].summable is True
    assert comps[0].wire_bytes(layout) == 4 * R.topk_k(n, density)
    for out in outs:
        # same additions in the same order without weights (exact); with stratum weights
        # (a + b) * s vs a * s + b * s: within W ulps of sum |a_r * s|
        if error_feedback:
            assert torch.equal(out, _seq_sum(sparse))
        else:
            bound = world * EPS * _seq_sum([t.abs() for t in sparse])
            assert bool(((out - _seq_sum(sparse)).abs() <= bound).all())


def test_randomk_accumulate_adds():
    n = 100
    comp = make_compressor("randomk:0.2", error_feedback=False)
    x = _randn(n, 5)
    p, ctx = comp.compress(x, _layout((n,)), None)
    dense = torch.zeros(n)
    comp.decompress(p, ctx, dense)
    base = _randn(n, 6)
    acc = base.clone()
    comp.decompress(p, ctx, acc, accumulate=True)
    assert torch.equal(acc, base + dense)


def test_randomk_scaled_estimator_is_unbiased():
    """Without error feedback the mean of T estimates approaches x.

    Per element the estimate is ``s * x`` with probability ``1/s`` (stratum size
    ``s = 4``), variance ``(s - 1) x**2``; over T = 4000 calls the mean has std
    ``|x| sqrt(3 / T) ~= 0.027 |x|``. Tolerance: 0.15 |x| per element (5.5 std) and a
    relative L2 error below 0.05 (expected ~0.027).
    """
    n, trials = 64, 4000
    x = _randn(n, 9) + torch.sign(_randn(n, 10)) * 0.5  # keep |x| away from 0
    comp = make_compressor("randomk:0.25", seed=11, error_feedback=False)
    layout = _layout((n,))
    acc = torch.zeros(n)
    for _ in range(trials):
        p, ctx = comp.compress(x, layout, None)
        comp.decompress(p, ctx, acc, accumulate=True)
    mean = acc / trials
    assert bool(((mean - x).abs() <= 0.15 * x.abs()).all())
    assert float((mean - x).norm() / x.norm()) < 0.05


@pytest.mark.parametrize("density", [0.01, 0.3])
def test_randomk_error_feedback_conserves_every_step(density):
    n = 500
    comp = make_compressor(f"randomk:{density}", seed=2)
    residual = torch.zeros(n)
    for step in range(6):
        x = _randn(n, 200 + step)
        expected = x + residual
        p, ctx = comp.compress(x, _layout((n,)), residual)
        sent = torch.zeros(n)
        comp.decompress(p, ctx, sent)
        assert torch.equal(sent + residual, expected)


def test_randomk_empty_bucket():
    comp = make_compressor("randomk:0.5")
    p, ctx = comp.compress(torch.zeros(0), _layout((0,)), torch.zeros(0))
    assert p[0].numel() == 0
    comp.decompress(p, ctx, torch.zeros(0))


# =========================================================================== PowerSGD


def _low_rank_grads(world, n, m, rank, seed, step=0, noise=0.1):
    """Per-rank ``U (A + noise * N_w)^T``: one column space ``U``, so the mean has rank r.

    ``U`` and ``A`` are fixed by ``seed``; the per-rank noise ``N_w`` changes with ``step``
    (small, so consecutive gradients share most of their row space and PowerSGD's warm
    start stays informative).
    """
    u = _randn((n, rank), seed)
    a = _randn((m, rank), seed + 1)
    return [
        u @ (a + noise * _randn((m, rank), 1000 * step + seed + 2 + w)).t() for w in range(world)
    ]


def _powersgd_steps(world, rank, steps, *, error_feedback, shapes=((40, 30),), seed=0):
    """Run `steps` steps; returns per step (outputs of all ranks, exact mean, residuals)."""
    layout = _layout(*shapes)
    comps = [_make_powersgd(rank, world, seed=seed) for _ in range(world)]
    numel = layout.numel
    residuals = [torch.zeros(numel) for _ in range(world)] if error_feedback else None
    history = []
    for step in range(steps):
        grads = [torch.zeros(numel) for _ in range(world)]
        off = 0
        for i, shape in enumerate(shapes):
            size = math.prod(shape)
            if size == 0:
                continue
            if len(shape) >= 2:
                mats = _low_rank_grads(world, shape[0], size // shape[0], rank, seed + 7 * i, step)
            else:
                mats = [_randn(shape, 1000 * step + 10 * i + w) for w in range(world)]
            for w in range(world):
                grads[w][off : off + size] = mats[w].reshape(-1)
            off += size
        mean = _seq_sum(grads) / world
        flats = [g / world for g in grads]
        outs = _simulate(comps, flats, layout, residuals)
        history.append((outs, mean, residuals, flats))
    return comps, history


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("rank", [1, 2])
def test_powersgd_exact_on_low_rank_without_error_feedback(world, rank):
    _, history = _powersgd_steps(world, rank, 3, error_feedback=False)
    for outs, mean, _, _ in history:
        for out in outs:
            assert _rel(out, mean.reshape(-1)) < 1e-4
        for out in outs[1:]:
            assert torch.equal(out, outs[0])  # every rank decodes the same estimate


@pytest.mark.parametrize("rank", [1, 3])
def test_powersgd_exact_on_low_rank_with_error_feedback_single_rank(rank):
    _, history = _powersgd_steps(1, rank, 5, error_feedback=True)
    for outs, mean, residuals, _ in history[2:]:
        assert _rel(outs[0], mean) < 1e-4
        assert float(residuals[0].norm()) < 1e-4 * float(mean.norm())


@pytest.mark.parametrize("world", [2, 4])
def test_powersgd_exact_on_low_rank_with_error_feedback_multi_rank(world):
    _, history = _powersgd_steps(world, 2, 6, error_feedback=True)
    for outs, mean, _, _ in history[2:]:
        for out in outs:
            assert _rel(out, mean) < 1e-4


@pytest.mark.parametrize("world", [1, 2, 4])
def test_powersgd_error_feedback_conserves_in_aggregate(world):
    """Summed over ranks: estimate + sum_w residual_new == sum_w (x_w + residual_old_w).

    PowerSGD's estimate is shared, so the identity holds for the sum over ranks (within
    1e-5 of the norm of sum_w v_w), on full-rank gradients where the estimate is lossy.
    """
    n, m, rank = 40, 30, 2
    layout = _layout((n, m))
    comps = [_make_powersgd(rank, world) for _ in range(world)]
    residuals = [torch.zeros(n * m) for _ in range(world)]
    for step in range(4):
        flats = [_randn(n * m, 500 + 10 * step + w) / world for w in range(world)]
        v = _seq_sum([flats[w] + residuals[w] for w in range(world)])
        out = _simulate(comps, flats, layout, residuals)[0]
        assert _rel(out, v) > 0.1  # genuinely lossy
        lhs = out + _seq_sum(residuals)
        assert float((lhs - v).norm()) <= 1e-5 * float(v.norm())


@pytest.mark.parametrize("world", [1, 2, 4])
def test_powersgd_small_and_1d_tensors_are_sent_uncompressed(world):
    rank = 2
    # (3, 3): 9 < 2*2*6; (5, 1): 5 < 2*2*6; (10,) is 1-D; (0, 4) empty; (40, 30) compressed
    shapes = ((10,), (3, 3), (40, 30), (5, 1), (0, 4))
    comps, history = _powersgd_steps(world, rank, 2, error_feedback=True, shapes=shapes)
    layout = _layout(*shapes)
    assert comps[0].wire_bytes(layout) == 4 * (10 + 9 + 5) + 4 * rank * (40 + 30)
    dense = [slice(0, 19), slice(1219, 1224)]
    for outs, _, residuals, flats in history:
        exact = _seq_sum(flats)
        for out in outs:
            for sl in dense:
                assert torch.equal(out[sl], exact[sl])
        for res in residuals:
            for sl in dense:
                assert bool((res[sl] == 0).all())  # nothing of them was left unsent


def test_powersgd_payload_sizes_match_wire_bytes():
    rank = 3
    shapes = ((64, 20), (7,), (2, 2))
    layout = _layout(*shapes)
    comp = make_compressor(f"powersgd:{rank}")
    payload, ctx = comp.compress(_randn(layout.numel, 0), layout, None)
    round2 = comp.advance(1, payload, ctx)
    sent = sum(t.numel() * t.element_size() for t in payload + round2)
    assert sent == comp.wire_bytes(layout) == 4 * (7 + 4) + 4 * rank * (64 + 20)
    assert comp.summable is True and comp.rounds == 2


def test_powersgd_rank_change_uses_a_new_compressor():
    n, m = 40, 30
    layout = _layout((n, m))
    g = _low_rank_grads(1, n, m, 3, 5)[0].reshape(-1)
    low = make_compressor("powersgd:1")
    out1 = _simulate([low], [g.clone()], layout)[0]
    assert _rel(out1, g) > 1e-2  # a rank-3 gradient is not captured by rank 1
    high = make_compressor("powersgd:3")
    out3 = _simulate([high], [g.clone()], layout)[0]
    assert _rel(out3, g) < 1e-4
    with pytest.raises(ValueError, match="powersgd:1"):
        high.load_state_dict(low.state_dict())


@pytest.mark.parametrize("load_before_first_use", [True, False])
def test_powersgd_state_dict_restores_warm_start(load_before_first_use):
    n, m = 48, 36
    layout = _layout((n, m))
    # a full-rank gradient: the estimate depends on the warm-started Q
    grads = [_randn(n * m, 300 + s) for s in range(4)]
    a = make_compressor("powersgd:2", seed=1)
    for g in grads[:3]:
        _simulate([a], [g], layout)
    state = a.state_dict()
    assert set(state["q"]) == {layout.key}
    assert state["q"][layout.key].numel() == 2 * m
    b = make_compressor("powersgd:2", seed=1)
    if not load_before_first_use:
        _simulate([b], [grads[0]], layout)  # builds the bucket, then gets overwritten
    b.load_state_dict(state)
    fresh = make_compressor("powersgd:2", seed=1)
    out_a = _simulate([a], [grads[3]], layout)[0]
    out_b = _simulate([b], [grads[3]], layout)[0]
    out_fresh = _simulate([fresh], [grads[3]], layout)[0]
    assert torch.equal(out_a, out_b)
    assert not torch.allclose(out_a, out_fresh)


def test_powersgd_bad_warm_start_size_raises():
    comp = make_compressor("powersgd:2")
    comp.load_state_dict({"spec": "powersgd:2", "calls": {}, "q": {"b0": torch.zeros(5)}})
    with pytest.raises(ValueError, match="warm start"):
        comp.compress(torch.zeros(40 * 30), _layout((40, 30)), None)


def test_powersgd_protocol_errors():
    comp = make_compressor("powersgd:1")
    layout = _layout((40, 30))
    payload, ctx = comp.compress(_randn(1200, 0), layout, None)
    with pytest.raises(RuntimeError):
        comp.advance(2, payload, ctx)
    with pytest.raises(RuntimeError):
        comp.decompress(payload, ctx, torch.zeros(1200), accumulate=True)
    with pytest.raises(RuntimeError):
        make_compressor("topk:0.1").advance(1, [], None)


def test_powersgd_same_seed_same_initial_q_across_ranks():
    layout = _layout((40, 30))
    a, b = make_compressor("powersgd:2", seed=4), make_compressor("powersgd:2", seed=4)
    x = _randn(1200, 1)
    pa, _ = a.compress(x, layout, None)
    pb, _ = b.compress(x, layout, None)
    assert torch.equal(pa[1], pb[1])
    pc, _ = make_compressor("powersgd:2", seed=5).compress(x, layout, None)
    assert not torch.equal(pa[1], pc[1])
