"""int8/int4/int2 quantisation: reference kernels and the quantising compressors.

Bounds used below (``scale = chunk max|v| / qmax``, fp32 ``eps = 2**-23``):

* deterministic rounding: ``|v - dequant| <= scale * (1/2 + 4 * qmax * eps)``; the
  ``4 * qmax * eps`` slack covers the fp32 rounding of ``v * (qmax / max)``, of the scale
  and of ``q * scale`` (at most ~6e-5 * scale for int8);
* stochastic rounding: ``|v - dequant| < scale * (1 + 4 * qmax * eps)``.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from commgym.collectives import BucketLayout, make_compressor
from commgym.collectives.kernels import reference as R

BITS = [8, 4, 2]
CHUNK = R.CHUNK_SIZE
EPS = torch.finfo(torch.float32).eps
PROP = settings(max_examples=30, deadline=None)

# lengths that matter: empty, 1, below/at/above a chunk, not multiples of 4 (= 8/2 bits)
_lengths = st.one_of(
    st.sampled_from([0, 1, 2, 3, 5, 7, 511, 512, 513, 1023, 1025, 1537]), st.integers(0, 1600)
)


def _qmax(bits: int) -> int:
    return (1 << (bits - 1)) - 1


def _unpack(codes: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Independent unpacker: element j of a byte sits at bit offset j * bits."""
    per = 8 // bits
    mask = (1 << bits) - 1
    c = codes.to(torch.int64)
    fields = [(c >> (j * bits)) & mask for j in range(per)]
    return torch.stack(fields, dim=1).reshape(-1)[:count]


def _per_elem_scale(scales: torch.Tensor, n: int) -> torch.Tensor:
    return scales.repeat_interleave(CHUNK)[:n]


def _dequant(codes, scales, bits, n):
    out = torch.zeros(n)
    R.dequantize_accumulate(codes, scales, bits, out)
    return out


def _randn(n: int, seed: int, mag: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * mag


# --------------------------------------------------------------------------- sizes


@PROP
@given(n=_lengths, bits=st.sampled_from(BITS))
@example(n=0, bits=2)
@example(n=1, bits=4)
@example(n=513, bits=2)
def test_packed_and_scale_sizes(n, bits):
    codes, scales = R.quantize_ef(_randn(n, n), None, bits)
    assert codes.dtype == torch.uint8 and scales.dtype == torch.float32
    assert codes.numel() == math.ceil(n * bits / 8) == R.packed_nbytes(n, bits)
    assert scales.numel() == math.ceil(n / CHUNK) == R.num_chunks(n)


# --------------------------------------------------------------------------- error bounds


@PROP
@given(
    n=_lengths,
    bits=st.sampled_from(BITS),
    seed=st.integers(0, 2**31 - 1),
    log_mag=st.integers(-20, 20),
)
def test_deterministic_error_at_most_half_a_step(n, bits, seed, log_mag):
    x = _randn(n, seed, 10.0**log_mag)
    codes, scales = R.quantize_ef(x, None, bits)
    deq = _dequant(codes, scales, bits, n)
    scale = _per_elem_scale(scales, n)
    qmax = _qmax(bits)
    # the scale formula itself: chunk max / qmax
    for c in range(R.num_chunks(n)):
        chunk = x[c * CHUNK : (c + 1) * CHUNK]
        assert scales[c] == chunk.abs().max() / qmax
    bound = scale * (0.5 + 4 * qmax * EPS)
    assert bool(((x - deq).abs() <= bound).all())


@PROP
@given(
    n=_lengths,
    bits=st.sampled_from(BITS),
    seed=st.integers(0, 2**31 - 1),
    rseed=st.integers(0, 2**32 - 1),
)
def test_stochastic_error_below_one_step(n, bits, seed, rseed):
    x = _randn(n, seed)
    codes, scales = R.quantize_ef(x, None, bits, stochastic=True, seed=rseed)
    deq = _dequant(codes, scales, bits, n)
    bound = _per_elem_scale(scales, n) * (1 + 4 * _qmax(bits) * EPS)
    assert bool(((x - deq).abs() < bound).all())


# --------------------------------------------------------------------------- packing


@PROP
@given(
    n=_lengths, bits=st.sampled_from(BITS), seed=st.integers(0, 2**31 - 1), exp=st.integers(-30, 30)
)
@example(n=0, bits=8, seed=0, exp=0)
@example(n=1, bits=2, seed=0, exp=0)
@example(n=515, bits=4, seed=3, exp=-3)
def test_grid_values_round_trip_exactly(n, bits, seed, exp):
    """Values already on the grid (``q * 2**exp``, a ±qmax in each chunk) decode exactly."""
    qmax = _qmax(bits)
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-qmax, qmax + 1, (n,), generator=g)
    q[::CHUNK] = qmax  # every chunk holds its max, so scale == 2**exp exactly
    x = q.float() * 2.0**exp
    codes, scales = R.quantize_ef(x, None, bits)
    assert bool((scales == 2.0**exp).all())
    assert torch.equal(_unpack(codes, bits, n), q + qmax)
    assert torch.equal(_dequant(codes, scales, bits, n), x)


@PROP
@given(
    n=_lengths, bits=st.sampled_from(BITS), seed=st.integers(0, 2**31 - 1), stochastic=st.booleans()
)
def test_packing_layout_range_and_pad_bits(n, bits, seed, stochastic):
    qmax = _qmax(bits)
    x = _randn(n, seed)
    codes, scales = R.quantize_ef(x, None, bits, stochastic=stochastic, seed=seed)
    per = 8 // bits
    u = _unpack(codes, bits, codes.numel() * per)
    # codes never outside [0, 2 * qmax] (levels -qmax..qmax), e.g. nibble 15 never appears
    assert bool((u[:n] >= 0).all()) and bool((u[:n] <= 2 * qmax).all())
    # pad fields beyond n are zero
    assert bool((u[n:] == 0).all())
    # decoded value == (u - qmax) * scale exactly, element by element
    expect = (u[:n] - qmax).float() * _per_elem_scale(scales, n)
    assert torch.equal(_dequant(codes, scales, bits, n), expect)
    if not stochastic and n:
        # deterministic code == clamp(floor(v * (qmax / max) + 1/2)), as documented
        amax = torch.nn.functional.pad(x.abs(), (0, -n % CHUNK)).view(-1, CHUNK).amax(1)
        inv = (qmax / amax).repeat_interleave(CHUNK)[:n]
        q = torch.floor(x * inv + 0.5).clamp(-qmax, qmax).long()
        assert torch.equal(u[:n], q + qmax)


@pytest.mark.parametrize("bits", BITS)
def test_dequantize_accumulates_into_out(bits):
    x = _randn(700, 1)
    codes, scales = R.quantize_ef(x, None, bits)
    base = _randn(700, 2)
    out = base.clone()
    R.dequantize_accumulate(codes, scales, bits, out)
    torch.testing.assert_close(out - base, _dequant(codes, scales, bits, 700), rtol=0, atol=1e-6)


@pytest.mark.parametrize("bits", BITS)
def test_out_buffers_are_used(bits):
    n = 1000
    codes = torch.full((R.packed_nbytes(n, bits),), 255, dtype=torch.uint8)
    scales = torch.full((R.num_chunks(n),), -1.0)
    c, s = R.quantize_ef(_randn(n, 0), None, bits, out_codes=codes, out_scales=scales)
    assert c.data_ptr() == codes.data_ptr() and s.data_ptr() == scales.data_ptr()
    ref_c, ref_s = R.quantize_ef(_randn(n, 0), None, bits)
    assert torch.equal(codes, ref_c) and torch.equal(scales, ref_s)


def test_bad_arguments_raise_value_error():
    x = torch.ones(10)
    with pytest.raises(ValueError, match="bits"):
        R.quantize_ef(x, None, 3)
    with pytest.raises(ValueError, match="need"):
        R.quantize_ef(x, None, 8, out_codes=torch.empty(9, dtype=torch.uint8))
    with pytest.raises(ValueError, match="need"):
        R.quantize_ef(x, None, 8, out_scales=torch.empty(2))
    codes, scales = R.quantize_ef(x, None, 4)
    with pytest.raises(ValueError, match="expected"):
        R.dequantize_accumulate(codes, scales, 4, torch.zeros(11))
    with pytest.raises(ValueError, match="bits"):
        R.dequantize_accumulate(codes, scales, 1, torch.zeros(10))


# --------------------------------------------------------------------------- special chunks


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("stochastic", [False, True])
def test_all_zero_chunks(bits, stochastic):
    n = 3 * CHUNK + 17
    x = _randn(n, 5)
    x[CHUNK : 2 * CHUNK] = 0.0  # a whole middle chunk
    x[3 * CHUNK :] = 0.0  # the short final chunk
    residual = torch.zeros(n)
    codes, scales = R.quantize_ef(x, residual, bits, stochastic=stochastic, seed=9)
    assert scales[1] == 0.0 and scales[3] == 0.0
    deq = _dequant(codes, scales, bits, n)
    assert bool((deq[CHUNK : 2 * CHUNK] == 0).all()) and bool((deq[3 * CHUNK :] == 0).all())
    assert bool((residual[CHUNK : 2 * CHUNK] == 0).all())
    assert bool((_unpack(codes, bits, n)[CHUNK : 2 * CHUNK] == _qmax(bits)).all())
    assert bool(torch.isfinite(deq).all())


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_chunk_decodes_nan_and_residual_is_kept(bits, bad):
    n = 2 * CHUNK + 100
    x = _randn(n, 7)
    x[CHUNK + 3] = bad  # inside chunk 1
    old = _randn(n, 8, 0.01)
    residual = old.clone()
    codes, scales = R.quantize_ef(x, residual, bits)
    deq = _dequant(codes, scales, bits, n)
    assert bool(torch.isnan(deq[CHUNK : 2 * CHUNK]).all())
    # the other chunks are unaffected and within the deterministic bound
    for sl in (slice(0, CHUNK), slice(2 * CHUNK, n)):
        v = x[sl] + old[sl]
        bound = _per_elem_scale(scales, n)[sl] * (0.5 + 4 * _qmax(bits) * EPS)
        assert bool(((v - deq[sl]).abs() <= bound).all())
    assert bool(torch.isfinite(residual).all())
    assert torch.equal(residual[CHUNK + 3], old[CHUNK + 3])
    assert torch.equal(residual[CHUNK : 2 * CHUNK], old[CHUNK : 2 * CHUNK])


@pytest.mark.parametrize("bits", BITS)
def test_tiny_chunk_max_encodes_finite_zeros_and_keeps_residual(bits):
    # Documented semantics: a chunk whose max is below qmax / FLT_MAX would need an
    # infinite inverse scale; it encodes zeros (finite), and error feedback keeps it all.
    x = torch.tensor([1e-39, 5e-40, 0.0, -2.5e-40])  # subnormal fp32
    residual = torch.zeros(4)
    codes, scales = R.quantize_ef(x, residual, bits)
    deq = _dequant(codes, scales, bits, 4)
    assert bool(torch.isfinite(deq).all()) and bool((deq == 0).all()), deq
    assert torch.equal(residual, x)


# --------------------------------------------------------------------------- stochastic


@pytest.mark.parametrize("bits", BITS)
def test_stochastic_rounding_is_reproducible_per_seed(bits):
    x = _randn(1300, 3)
    a = R.quantize_ef(x, None, bits, stochastic=True, seed=123)
    b = R.quantize_ef(x.clone(), None, bits, stochastic=True, seed=123)
    c = R.quantize_ef(x, None, bits, stochastic=True, seed=124)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("bits", BITS)
def test_stochastic_rounding_is_unbiased(bits):
    """Mean of N stochastic decodes is within 3 * scale / sqrt(N) of x.

    Per element the rounding error has variance <= scale**2 / 4, so the mean over N
    seeds has std <= scale / (2 sqrt(N)); 3 * scale / sqrt(N) is 6 standard deviations
    (and the hash generator is deterministic, so the test cannot flake).
    """
    n, trials = 600, 1500
    x = _randn(n, 11)
    acc = torch.zeros(n)
    for s in range(trials):
        codes, scales = R.quantize_ef(x, None, bits, stochastic=True, seed=R.seed_mix(7, s))
        R.dequantize_accumulate(codes, scales, bits, acc)
    mean = acc / trials
    scale = _per_elem_scale(R.quantize_ef(x, None, bits)[1], n)
    tol = 3 * scale / math.sqrt(trials)
    assert bool(((mean - x).abs() <= tol).all()), float(((mean - x).abs() / scale).max())
    # deterministic rounding is biased by up to half a step; stochastic averages it away
    det = _dequant(*R.quantize_ef(x, None, bits), bits, n)
    assert float((mean - x).abs().mean()) < 0.25 * float((det - x).abs().mean())


def test_hash_uniform_range_and_determinism():
    idx = torch.arange(100_000)
    u = R.hash_uniform(42, idx)
    assert u.dtype == torch.float32
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01
    assert torch.equal(u, R.hash_uniform(42, idx.clone()))
    assert not torch.equal(u, R.hash_uniform(43, idx))


# --------------------------------------------------------------------------- error feedback


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("stochastic", [False, True])
def test_error_feedback_conserves_every_step(bits, stochastic):
    """dequant + residual_new == x + residual_old within 1 ulp of max(|v|, |dequant|)."""
    n = 1100
    residual = torch.zeros(n)
    for step in range(5):
        x = _randn(n, 100 + step)
        v = x + residual
        codes, scales = R.quantize_ef(x, residual, bits, stochastic=stochastic, seed=step)
        deq = _dequant(codes, scales, bits, n)
        ulp = EPS * torch.maximum(v.abs(), deq.abs())
        assert bool(((deq + residual - v).abs() <= ulp).all())
        # residual is bounded by one quantisation step
        bound = _per_elem_scale(scales, n) * (
            (0.5 if not stochastic else 1) + 4 * _qmax(bits) * EPS
        )
        assert bool((residual.abs() <= bound).all())


# --------------------------------------------------------------------------- compressors


def _layout(n: int) -> BucketLayout:
    return BucketLayout(f"q{n}", (torch.Size([n]),))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("n", [0, 1, 3, 512, 1029])
def test_compressor_payload_size_and_alignment(bits, n):
    comp = make_compressor(f"int{bits}")
    assert comp.summable is False
    payload, _ = comp.compress(_randn(n, 0), _layout(n), None)
    (buf,) = payload
    assert buf.dtype == torch.uint8
    assert buf.numel() == comp.wire_bytes(_layout(n))
    assert buf.numel() % 4 == 0
    assert buf.numel() == math.ceil((4 * R.num_chunks(n) + R.packed_nbytes(n, bits)) / 4) * 4


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("stochastic", [False, True])
def test_compressor_all_gather_sum_matches_mean(bits, world, stochastic):
    """W ranks: all-gather payloads, decompress each with accumulate=True into zeros."""
    n = 1300
    layout = _layout(n)
    grads = [_randn(n, 20 + r) for r in range(world)]
    comps = [
        make_compressor(f"int{bits}", seed=5, stochastic_rounding=stochastic) for _ in range(world)
    ]
    residuals = [torch.zeros(n) for _ in range(world)]
    for _step in range(3):
        payloads, ctxs, vs = [], [], []
        for r in range(world):
            flat = grads[r] / world
            vs.append(flat + residuals[r])
            p, c = comps[r].compress(flat, layout, residuals[r])
            payloads.append([t.clone() for t in p])  # the all-gather copies each rank's slice
            ctxs.append(c)
        out = torch.zeros(n)
        for r in range(world):
            comps[0].decompress(payloads[r], ctxs[0], out, accumulate=True)
        # bound: sum over ranks of one (stochastic) or half (deterministic) step
        bound = torch.zeros(n)
        for r in range(world):
            scale = vs[r].abs().view(-1).split(CHUNK)
            per = torch.cat([s.max().expand(len(s)) for s in scale]) / _qmax(bits)
            bound += per * ((1.0 if stochastic else 0.5) + 4 * _qmax(bits) * EPS)
        assert bool(((out - sum(vs)).abs() <= bound * 1.0001).all())


@pytest.mark.parametrize("bits", BITS)
def test_compressor_decompress_overwrites_without_accumulate(bits):
    comp = make_compressor(f"int{bits}")
    x = _randn(600, 4)
    payload, ctx = comp.compress(x, _layout(600), None)
    out = torch.full((600,), 1e6)
    comp.decompress(payload, ctx, out)
    codes, scales = R.quantize_ef(x, None, bits)
    assert torch.equal(out, _dequant(codes, scales, bits, 600))


def test_stochastic_compressor_same_seed_same_codes_across_ranks():
    layout = _layout(900)
    x = _randn(900, 2)
    a = make_compressor("int4", seed=3, stochastic_rounding=True)
    b = make_compressor("int4", seed=3, stochastic_rounding=True)
    for _ in range(3):
        pa, _ = a.compress(x, layout, None)
        pb, _ = b.compress(x, layout, None)
        assert torch.equal(pa[0], pb[0])
    # the seed advances per call: a fourth call differs from the first
    first = make_compressor("int4", seed=3, stochastic_rounding=True).compress(x, layout, None)
    assert not torch.equal(a.compress(x, layout, None)[0][0], first[0][0])


def test_no_wraparound_four_ranks_near_max():
    """Why quantisers all-gather: int8 sums of 4 codes near +127 wrap; fp32 decode does not."""
    world, n = 4, CHUNK
    layout = _layout(n)
    g = torch.Generator().manual_seed(0)
    grads = [1.0 - 0.001 * torch.rand(n, generator=g) for _ in range(world)]  # all near +max
    flats = [gr / world for gr in grads]
    comps = [make_compressor("int8") for _ in range(world)]
    payloads, ctxs = [], []
    for r in range(world):
        p, c = comps[r].compress(flats[r], layout, None)
        payloads.append([t.clone() for t in p])
        ctxs.append(c)
    # 1) what the design does: decode each rank's payload in fp32 and add
    out = torch.zeros(n)
    for r in range(world):
        comps[r].decompress(payloads[r], ctxs[r], out, accumulate=True)
    exact = sum(flats)
    assert float((out - exact).abs().max()) <= world * (0.25 / 127) * (0.5 + 1e-4)
    assert float(out.min()) > 0.99
    # 2) what an int8 SUM all-reduce would do: codes q = u - 127 near +127 wrap negative
    qs = [(_unpack(p[0][4:], 8, n) - 127).to(torch.int8) for p in payloads]
    assert bool((qs[0] >= 125).all())
    wrapped = qs[0].clone()
    for q in qs[1:]:
        wrapped += q  # int8 arithmetic, as a collective SUM on int8 would do
    true_sum = sum(q.long() for q in qs)
    assert bool((true_sum > 127).all())
    assert bool((wrapped.long() != true_sum).all())
    assert bool((wrapped < 0).all())  # 4 * ~127 = ~508 wraps to about -4
