"""Parity of the fused CPU (numba) kernels with ``kernels/reference.py``.

The reference defines the semantics; the fused CPU path must match it bit for bit
(quantise, dequantise, random-k, PowerSGD's residual) or, for top-k, select the same set
of ``(index, value)`` pairs with the documented tie rule (larger magnitude first, ties by
lowest index; NaN above +inf). Same data matrix as the Triton parity tests: lengths that
are not multiples of the chunk, 0 and 1 element, NaN/inf, subnormals, every bit width,
densities from 1e-4 to 1.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commgym.collectives import kernels
from commgym.collectives.kernels import cpu_kernels as C
from commgym.collectives.kernels import reference as R
from tests.collectives.test_kernels import (
    KINDS,
    LENGTHS,
    _chunks_nonfinite,
    _distinct_extreme,
    _distinct_magnitudes,
    _expected_tie_selection,
    _ks,
    _pairs,
    assert_same_bits,
    make_data,
)

DENSITIES = [1e-4, 1e-3, 0.01, 0.1, 0.5, 1.0]


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", LENGTHS)
def test_quantize_dequantize_parity(n, kind, bits, stochastic):
    x, r0 = make_data(kind, n)
    seed = 0xDEADBEEF
    r_ref, r_cpu = r0.clone(), r0.clone()
    c_ref, s_ref = R.quantize_ef(x, r_ref, bits, stochastic=stochastic, seed=seed)
    x_in = x.clone()
    c_cpu, s_cpu = C.quantize_ef(x_in, r_cpu, bits, stochastic=stochastic, seed=seed)
    assert_same_bits(x_in, x, "x must not be modified")
    assert_same_bits(c_cpu, c_ref, "codes")
    assert_same_bits(s_cpu, s_ref, "scales")
    assert_same_bits(r_cpu, r_ref, "residual")
    assert torch.isfinite(r_cpu).all()
    assert torch.equal(~torch.isfinite(s_cpu), _chunks_nonfinite(x + r0))

    out0 = torch.randn(n, generator=torch.Generator().manual_seed(7))
    out_ref = R.dequantize_accumulate(c_ref, s_ref, bits, out0.clone())
    out_cpu = C.dequantize_accumulate(c_ref, s_ref, bits, out0.clone())
    assert_same_bits(out_cpu, out_ref, "dequantized")


@pytest.mark.parametrize("n", [1, 3, 1025, 100003])
@pytest.mark.parametrize("bits", [8, 4, 2])
def test_quantize_without_residual_into_wire_buffer(n, bits):
    x, _ = make_data("normal", n, seed=3)
    nch, nbytes = R.num_chunks(n), R.packed_nbytes(n, bits)
    buf = torch.zeros(4 * nch + nbytes + 3, dtype=torch.uint8)
    scales, codes = buf[: 4 * nch].view(torch.float32), buf[4 * nch : 4 * nch + nbytes]
    C.quantize_ef(x, None, bits, out_codes=codes, out_scales=scales, stochastic=True, seed=9)
    c_ref, s_ref = R.quantize_ef(x, None, bits, stochastic=True, seed=9)
    assert_same_bits(codes, c_ref, "codes")
    assert_same_bits(scales, s_ref, "scales")
    assert (buf[4 * nch + nbytes :] == 0).all()  # nothing written past the codes


@pytest.mark.parametrize("chunk_size", [4, 12, 1024])
@pytest.mark.parametrize("bits", [8, 4, 2])
def test_quantize_other_chunk_sizes(chunk_size, bits):
    x, r0 = make_data("extreme", 1025, seed=5)
    r_ref, r_cpu = r0.clone(), r0.clone()
    c_ref, s_ref = R.quantize_ef(x, r_ref, bits, chunk_size=chunk_size)
    c_cpu, s_cpu = C.quantize_ef(x, r_cpu, bits, chunk_size=chunk_size)
    assert_same_bits(c_cpu, c_ref, "codes")
    assert_same_bits(s_cpu, s_ref, "scales")
    assert_same_bits(r_cpu, r_ref, "residual")
    out = C.dequantize_accumulate(c_cpu, s_cpu, bits, torch.zeros(1025), chunk_size=chunk_size)
    ref = R.dequantize_accumulate(c_ref, s_ref, bits, torch.zeros(1025), chunk_size=chunk_size)
    assert_same_bits(out, ref, "dequantized")


@pytest.mark.parametrize(
    "amax", [2.0**125 * 0.99, 2.0**125, 3.0e38, torch.finfo(torch.float32).max]
)
def test_quantize_int8_both_sides_of_the_unguarded_loop(amax):
    """int8 + EF skips the keep-old-if-non-finite select below amax 2**125 (cpu_kernels'
    proof); at and above it the guarded loop runs. Both match the reference bit for bit,
    including where ``v - y * scale`` overflows near FLT_MAX."""
    g = torch.Generator().manual_seed(11)
    x = (torch.rand(2048, generator=g) * 2 - 1) * amax
    x[::512] = amax  # every chunk reaches amax
    r0 = (torch.rand(2048, generator=g) * 2 - 1) * amax * 1e-3
    r_ref, r_cpu = r0.clone(), r0.clone()
    c_ref, s_ref = R.quantize_ef(x, r_ref, 8)
    c_cpu, s_cpu = C.quantize_ef(x, r_cpu, 8)
    assert_same_bits(c_cpu, c_ref, "codes")
    assert_same_bits(s_cpu, s_ref, "scales")
    assert_same_bits(r_cpu, r_ref, "residual")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(
        st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
        min_size=0,
        max_size=1500,
    ),
    bits=st.sampled_from([8, 4, 2]),
    stochastic=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_quantize_parity_property(values, bits, stochastic, seed):
    x = torch.tensor(values, dtype=torch.float32)
    r0 = torch.linspace(-1e-3, 1e-3, x.numel())
    r_ref, r_cpu = r0.clone(), r0.clone()
    c_ref, s_ref = R.quantize_ef(x, r_ref, bits, stochastic=stochastic, seed=seed)
    c_cpu, s_cpu = C.quantize_ef(x, r_cpu, bits, stochastic=stochastic, seed=seed)
    assert_same_bits(c_cpu, c_ref, "codes")
    assert_same_bits(s_cpu, s_ref, "scales")
    assert_same_bits(r_cpu, r_ref, "residual")


def test_quantize_bad_arguments():
    x = torch.ones(10)
    with pytest.raises(ValueError, match="bits"):
        C.quantize_ef(x, None, 3)
    with pytest.raises(ValueError, match="chunk_size"):
        C.quantize_ef(x, None, 8, chunk_size=6)
    with pytest.raises(ValueError, match="destinations"):
        C.quantize_ef(x, None, 8, out_codes=torch.empty(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="expected"):
        C.dequantize_accumulate(torch.empty(3, dtype=torch.uint8), torch.empty(1), 8, x)
    with pytest.raises(ValueError, match="contiguous CPU"):
        C.quantize_ef(torch.ones(20)[::2], None, 8)


# -- top-k -------------------------------------------------------------------------------


def _ks_with_densities(n: int) -> list[int]:
    return sorted(set(_ks(n)) | {R.topk_k(n, d) for d in DENSITIES}) if n else [0]


@pytest.mark.parametrize("with_residual", [True, False], ids=["ef", "no-ef"])
@pytest.mark.parametrize("n", LENGTHS)
def test_topk_parity_distinct(n, with_residual):
    x, r0 = _distinct_magnitudes(n, seed=n)
    if not with_residual:
        x = x + r0
    for k in _ks_with_densities(n):
        r_ref = r0.clone() if with_residual else None
        r_cpu = r0.clone() if with_residual else None
        v_ref, i_ref = R.topk_ef(x, r_ref, k)
        v_cpu, i_cpu = C.topk_ef(x, r_cpu, k)
        assert v_cpu.dtype == torch.float32 and i_cpu.dtype == torch.int32
        assert v_cpu.shape == (k,) and i_cpu.shape == (k,)
        assert _pairs(v_cpu, i_cpu) == _pairs(v_ref, i_ref), f"k={k}"
        if with_residual:
            assert_same_bits(r_cpu, r_ref, f"residual k={k}")


@pytest.mark.parametrize("n", [1, 1025, 100003])
def test_topk_parity_extreme_magnitudes(n):
    x = _distinct_extreme(n, seed=11)
    for k in _ks_with_densities(n):
        r_ref, r_cpu = torch.zeros(n), torch.zeros(n)
        v_ref, i_ref = R.topk_ef(x, r_ref, k)
        v_cpu, i_cpu = C.topk_ef(x, r_cpu, k)
        assert _pairs(v_cpu, i_cpu) == _pairs(v_ref, i_ref), f"k={k}"
        assert_same_bits(r_cpu, r_ref, f"residual k={k}")


@pytest.mark.parametrize("n", [1023, 100003])
def test_topk_nonfinite(n):
    """NaN ranks first, then inf (as torch.topk); non-finite never enters the residual."""
    x, r0 = _distinct_magnitudes(n, seed=3)
    pos = torch.randperm(n, generator=torch.Generator().manual_seed(4))[:9]
    x[pos[:3]] = float("nan")
    x[pos[3:6]] = float("inf")
    x[pos[6:]] = float("-inf")
    for k in (3, 9, 50):
        r_ref, r_cpu = r0.clone(), r0.clone()
        v_ref, i_ref = R.topk_ef(x, r_ref, k)
        v_cpu, i_cpu = C.topk_ef(x, r_cpu, k)
        assert _pairs(v_cpu, i_cpu) == _pairs(v_ref, i_ref), f"k={k}"
        assert_same_bits(r_cpu, r_ref, f"residual k={k}")
        assert torch.isfinite(r_cpu).all()


@pytest.mark.parametrize("pattern", ["zeros", "few-levels", "constant", "one-hot-region"])
def test_topk_ties_and_fallback(pattern):
    """Ties across the bucket (the sampled threshold admits everything): exact selection,
    lowest index first, and ``sent + residual == x + old residual`` exactly."""
    n = 5000
    g = torch.Generator().manual_seed(8)
    if pattern == "zeros":
        x, r0 = torch.zeros(n), torch.zeros(n)
    elif pattern == "few-levels":
        x = torch.randint(-2, 3, (n,), generator=g).float()
        r0 = torch.randint(-1, 2, (n,), generator=g).float() * 0.5
    elif pattern == "constant":
        x, r0 = torch.full((n,), -0.25), torch.zeros(n)
    else:  # all mass in a region the strided sample barely sees
        x, r0 = torch.zeros(n), torch.zeros(n)
        x[1234:1240] = torch.arange(1.0, 7.0)
    v = x + r0
    for k in (1, 6, 37, 1000, n):
        r_cpu = r0.clone()
        vals, idx = C.topk_ef(x, r_cpu, k)
        idx = idx.long()
        assert idx.numel() == k and idx.unique().numel() == k
        assert set(idx.tolist()) == _expected_tie_selection(v, k)
        sent = torch.zeros(n).index_put_((idx,), vals)
        assert torch.equal(sent + r_cpu, v)
        assert torch.equal(vals, v[idx])


@pytest.mark.parametrize("nan_at", [None, 30, 700])
def test_topk_fallback_after_the_pass_wrote_part_of_the_residual(nan_at):
    """The threshold misses values the strided sample never sees: the candidates overflow
    after the one pass has written ``v`` into part of the residual (up to the block where
    they overflowed, or where a NaN was), and the exact fallback still equals the
    reference."""
    n = 100003
    stride = n // C.TOPK_SAMPLES
    x, r0 = _distinct_magnitudes(n, seed=5)
    x, r0 = x * 1e-3, r0 * 1e-3
    start = 20000 if nan_at is not None else 1000
    unseen = torch.arange(start + 1, n, stride)  # never a multiple of the stride
    x[unseen] = 10.0 + torch.arange(unseen.numel(), dtype=torch.float32) * 1e-3
    if nan_at is not None:
        x[nan_at] = float("nan")
    for k in (1, 10, 300):
        r_ref, r_cpu = r0.clone(), r0.clone()
        v_ref, i_ref = R.topk_ef(x, r_ref, k)
        v_cpu, i_cpu = C.topk_ef(x, r_cpu, k)
        assert _pairs(v_cpu, i_cpu) == _pairs(v_ref, i_ref), f"k={k}"
        assert_same_bits(r_cpu, r_ref, f"residual k={k}")


def test_topk_edges():
    vals, idx = C.topk_ef(torch.empty(0), torch.empty(0), 0)
    assert vals.shape == (0,) and idx.shape == (0,) and idx.dtype == torch.int32
    with pytest.raises(ValueError, match="k must be"):
        C.topk_ef(torch.ones(4), None, 0)
    with pytest.raises(ValueError, match="k must be"):
        C.topk_ef(torch.ones(4), None, 5)
    x16 = torch.linspace(-3, 2, 1000).half()
    assert _pairs(*C.topk_ef(x16, None, 10)) == _pairs(*R.topk_ef(x16, None, 10))


def test_topk_scratch_is_reused():
    """No bucket-sized temporary per call: scratch buffers are kept per size."""
    x, r = torch.randn(50000), torch.zeros(50000)
    C.topk_ef(x, r, 500)
    before = {key: buf.ctypes.data for key, buf in C._scratch.items()}
    for _ in range(3):
        C.topk_ef(x, r, 500)
    after = {key: buf.ctypes.data for key, buf in C._scratch.items()}
    assert after == before


# -- random-k ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", LENGTHS)
def test_randomk_indices_parity(n):
    for k in _ks_with_densities(n):
        for seed in (0, 1, 2**31, 2**32 - 1, R.seed_mix(3, 4, 5)):
            i_ref, s_ref = R.randomk_indices(n, k, seed)
            i_cpu, s_cpu = C.randomk_indices(n, k, seed)
            assert_same_bits(i_cpu, i_ref, f"indices n={n} k={k}")
            assert_same_bits(s_cpu, s_ref, f"sizes n={n} k={k}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 1023, 1025, 100003])
def test_randomk_gather_scatter_parity(n, kind):
    x, r0 = make_data(kind, n, seed=9)
    for density in (1e-4, 0.01, 1.0):
        k = R.topk_k(n, density)
        idx, sizes = R.randomk_indices(n, k, R.seed_mix(1, 2))
        r_ref, r_cpu = r0.clone(), r0.clone()
        v_ref = R.randomk_gather_ef(x, r_ref, idx)
        v_cpu = C.randomk_gather_ef(x, r_cpu, idx)
        assert_same_bits(v_cpu, v_ref, "values")
        assert_same_bits(r_cpu, r_ref, "residual")
        assert_same_bits(C.randomk_gather_ef(x, None, idx), x[idx], "no-ef")
        for weights in (None, sizes):
            out_ref = R.randomk_scatter(v_ref, idx, torch.randn(n), weights)
            out_cpu = C.randomk_scatter(v_ref, idx, torch.randn(n), weights)
            assert_same_bits(out_cpu, out_ref, "scatter")


# -- PowerSGD residual -----------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("kind", KINDS)
def test_powersgd_residual_parity(world_size, kind):
    n = 10007
    work, r0 = make_data(kind, n, seed=world_size)
    estimate = torch.randn(n, generator=torch.Generator().manual_seed(1)) * 3
    dense = torch.zeros(n, dtype=torch.bool)
    dense[100:700] = True
    r_ref = R.powersgd_residual(work, estimate, world_size, r0.clone(), dense)
    r_cpu = C.powersgd_residual(work, estimate, world_size, r0.clone(), dense)
    assert_same_bits(r_cpu, r_ref, "residual")
    assert torch.isfinite(r_cpu).all()


# -- dispatch ----------------------------------------------------------------------------------


def test_dispatch_picks_fused_for_contiguous_cpu():
    x = torch.ones(16)
    assert kernels.backend_for(x) is C
    assert kernels.backend_for(x, torch.ones(32)[::2]) is R  # strided operand: reference


def test_reference_switch_in_a_fresh_process():
    code = (
        "import torch; from commgym.collectives import kernels; "
        "from commgym.collectives.kernels import reference; "
        "assert kernels.backend_for(torch.ones(4)) is reference; print('ok')"
    )
    env = {**os.environ, "COMMGYM_CPU_KERNELS": "reference"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
