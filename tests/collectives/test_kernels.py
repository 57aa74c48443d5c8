"""Parity of the Triton kernels with ``kernels/reference.py`` (which defines the semantics).

How these tests run:

* Triton's CPU interpreter is chosen when ``triton`` is *first imported*
  (``TRITON_INTERPRET=1``), so it cannot be switched on inside a pytest process that may
  already have imported Triton. ``triton_kernels.INTERPRETED`` says which mode this
  process got.
* ``TRITON_INTERPRET=1 pytest tests/collectives/test_kernels.py``: the ``interpreter``
  parity tests run in-process on CPU tensors.
* plain ``pytest`` (the whole suite in one process): those tests skip, and
  :func:`test_parity_under_interpreter_in_subprocess` re-runs this file in a fresh
  interpreter process with ``TRITON_INTERPRET=1`` and fails with its output if any
  check fails. The plain process also compiles the kernels for sm_90 (no GPU needed) and
  checks the PTX for FMA contraction and flush-to-zero, which would break bitwise
  parity on the GPU.
* ``-m gpu`` on a CUDA machine (without ``TRITON_INTERPRET``): the same parity matrix
  against the compiled CUDA kernels, plus large sizes, a side stream and a check that
  no function synchronises with the host.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from commgym.collectives.kernels import reference as R

try:
    import triton

    from commgym.collectives.kernels import triton_kernels as T

    _SKIP_REASON = ""
except ImportError as exc:  # pragma: no cover - depends on the environment
    triton = None
    T = None
    _SKIP_REASON = f"triton is not importable ({exc}); the reference is used everywhere"

needs_triton = pytest.mark.skipif(T is None, reason=_SKIP_REASON or "triton importable")

# The interpreter evaluates with numpy, which warns about the overflow, NaN and NaN -> int
# cases these tests provoke on purpose (the kernels define every such result).
pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning"),
]

#: The long length: several blocks of every kernel and a partial last one. Under the
#: interpreter (numpy runs each program in Python, ~90 % of the parity run's time at 100,003)
#: three top-k blocks of 4,096 and a partial fourth keep the multi-block paths; a GPU runs
#: the full length.
LONG = 3 * 4096 + 7 if T is not None and T.INTERPRETED else 100003
LENGTHS = [0, 1, 1023, 1025, LONG]
KINDS = ["normal", "extreme", "nonfinite"]
CHUNK = R.CHUNK_SIZE
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["interpreter", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> torch.device:
    """Where the Triton kernels run: CPU under the interpreter, or a real CUDA GPU."""
    if T is None:
        pytest.skip(_SKIP_REASON)
    if request.param == "interpreter":
        if not T.INTERPRETED:
            pytest.skip(
                "Triton interpreter is off in this process (TRITON_INTERPRET=1 must be set "
                "before triton is imported); test_parity_under_interpreter_in_subprocess "
                "runs these checks"
            )
        return torch.device("cpu")
    if T.INTERPRETED:
        pytest.skip("real CUDA kernels need a process without TRITON_INTERPRET=1")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    return torch.device("cuda")


# -- helpers -------------------------------------------------------------------------


def assert_same_bits(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Bitwise equality (signed zeros distinguished); any NaN equals any NaN."""
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    assert actual.dtype == expected.dtype, (what, actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    if not actual.is_floating_point():
        bad = (actual != expected).nonzero().flatten()
        assert bad.numel() == 0, f"{what}: {bad.numel()} mismatches, first at {bad[:5].tolist()}"
        return
    nan_a, nan_e = torch.isnan(actual), torch.isnan(expected)
    assert torch.equal(nan_a, nan_e), f"{what}: NaN positions differ"
    a = torch.where(nan_a, 0.0, actual).view(torch.int32)
    e = torch.where(nan_e, 0.0, expected).view(torch.int32)
    bad = (a != e).nonzero().flatten()
    assert bad.numel() == 0, (
        f"{what}: {bad.numel()} mismatches, first at {bad[:5].tolist()}: "
        f"{actual[bad[:5]].tolist()} vs {expected[bad[:5]].tolist()}"
    )


def make_data(kind: str, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, residual)`` fp32 on CPU; the residual is always finite.

    ``normal``: per-chunk magnitudes from 1e-6 to 1e2. ``extreme``: +-3e38 and FLT_MAX,
    subnormals down to 1e-45, all-zero and all-subnormal chunks, and residuals that make
    ``x + residual`` overflow to inf. ``nonfinite``: NaN/+-inf scattered plus a whole
    chunk of inf.
    """
    g = torch.Generator().manual_seed(1000 * seed + n)
    nch = max(1, math.ceil(n / CHUNK))
    if kind == "normal":
        mag = 10 ** (torch.rand(nch, generator=g) * 8 - 6)
        x = torch.randn(n, generator=g) * mag.repeat_interleave(CHUNK)[:n]
        r = torch.randn(n, generator=g) * mag.repeat_interleave(CHUNK)[:n] * 0.1
        return x, r
    if kind == "extreme":
        pool = torch.tensor(
            [3e38, -3e38, 3.4028235e38, -3.4028235e38, 1e-45, -1e-45, 1e-40, -3e-39,
             1.1754944e-38, 0.0, -0.0, 1.0, -2.5, 6.1e-5],
        )  # fmt: skip
        x = pool[torch.randint(len(pool), (n,), generator=g)]
        for c in range(nch):
            lo, hi = c * CHUNK, min(n, (c + 1) * CHUNK)
            m = hi - lo
            if m <= 0:
                break
            if c % 4 == 1:
                x[lo:hi] = 0.0
            elif c % 4 == 2:  # all subnormal (exact multiples of 2**-149), zeros included
                x[lo:hi] = torch.randint(-3000, 3000, (m,), generator=g).float() * 2.0**-149
            elif c % 4 == 3:  # normal/subnormal boundary
                x[lo:hi] = torch.randn(m, generator=g) * 1e-38
        r = torch.randn(n, generator=g) * 1e-3
        big = torch.rand(n, generator=g) < 0.02
        r = torch.where(big, torch.full_like(r, 3e38), r)  # x + r overflows where x ~ 3e38
        return x, r
    if kind == "nonfinite":
        x = torch.randn(n, generator=g)
        u = torch.rand(n, generator=g)
        x = torch.where(u < 0.002, float("nan"), x)
        x = torch.where((u >= 0.002) & (u < 0.004), float("inf"), x)
        x = torch.where((u >= 0.004) & (u < 0.006), float("-inf"), x)
        if nch > 1:
            x[CHUNK : 2 * CHUNK] = float("inf")
        r = torch.randn(n, generator=g) * 1e-2
        return x, r
    raise ValueError(kind)


def _chunks_nonfinite(v: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    n = v.numel()
    nch = R.num_chunks(n, chunk)
    pad = torch.nn.functional.pad(v, (0, nch * chunk - n))
    return (~torch.isfinite(pad)).view(nch, chunk).any(dim=1)


# -- 1./2. quantise + dequantise -----------------------------------------------------


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", LENGTHS)
def test_quantize_dequantize_parity(device, n, kind, bits, stochastic):
    x, r0 = make_data(kind, n)
    seed = 0xDEADBEEF  # >= 2**31: exercises the signed/unsigned seed path
    r_ref = r0.clone()
    c_ref, s_ref = R.quantize_ef(x, r_ref, bits, stochastic=stochastic, seed=seed)
    x_tri, r_tri = x.to(device, copy=True), r0.to(device, copy=True)
    c_tri, s_tri = T.quantize_ef(x_tri, r_tri, bits, stochastic=stochastic, seed=seed)
    assert c_tri.device == x_tri.device and s_tri.device == x_tri.device
    assert_same_bits(x_tri, x, "x must not be modified")
    assert_same_bits(c_tri, c_ref, "codes")
    assert_same_bits(s_tri, s_ref, "scales")
    assert_same_bits(r_tri, r_ref, "residual")
    # NaN/inf never reaches the residual; chunks holding it are flagged by their scale.
    assert torch.isfinite(r_tri.cpu()).all()
    flagged = _chunks_nonfinite(x + r0)
    assert torch.equal(~torch.isfinite(s_tri.cpu()), flagged)

    out0 = torch.randn(n, generator=torch.Generator().manual_seed(7))
    out_ref = R.dequantize_accumulate(c_ref, s_ref, bits, out0.clone())
    out_tri = T.dequantize_accumulate(
        c_ref.to(device, copy=True), s_ref.to(device, copy=True), bits, out0.to(device, copy=True)
    )
    assert_same_bits(out_tri, out_ref, "dequantized")


@pytest.mark.parametrize("n", [1, 1025, LONG])
@pytest.mark.parametrize("bits", [8, 2])
def test_quantize_without_residual_and_into_wire_buffer(device, n, bits):
    """No error feedback, destinations as views into one uint8 buffer (as the compressor)."""
    x, _ = make_data("normal", n, seed=3)
    nch, nbytes = R.num_chunks(n), R.packed_nbytes(n, bits)
    buf = torch.zeros(4 * nch + nbytes + 3, dtype=torch.uint8, device=device)
    scales = buf[: 4 * nch].view(torch.float32)
    codes = buf[4 * nch : 4 * nch + nbytes]
    T.quantize_ef(
        x.to(device, copy=True), None, bits, out_codes=codes, out_scales=scales, stochastic=True
    )
    c_ref, s_ref = R.quantize_ef(x, None, bits, stochastic=True)
    assert_same_bits(codes, c_ref, "codes")
    assert_same_bits(scales, s_ref, "scales")
    assert (buf[4 * nch + nbytes :] == 0).all()  # nothing written past the codes


@pytest.mark.parametrize("chunk_size", [4, 12, 1024])
@pytest.mark.parametrize("bits", [8, 4, 2])
def test_quantize_other_chunk_sizes(device, chunk_size, bits):
    n = 1025
    x, r0 = make_data("normal", n, seed=5)
    r_ref, r_tri = r0.clone(), r0.to(device, copy=True)
    c_ref, s_ref = R.quantize_ef(x, r_ref, bits, chunk_size=chunk_size)
    c_tri, s_tri = T.quantize_ef(x.to(device, copy=True), r_tri, bits, chunk_size=chunk_size)
    assert_same_bits(c_tri, c_ref, "codes")
    assert_same_bits(s_tri, s_ref, "scales")
    assert_same_bits(r_tri, r_ref, "residual")
    out = T.dequantize_accumulate(
        c_tri, s_tri, bits, torch.zeros(n, device=device), chunk_size=chunk_size
    )
    ref = R.dequantize_accumulate(c_ref, s_ref, bits, torch.zeros(n), chunk_size=chunk_size)
    assert_same_bits(out, ref, "dequantized")


# -- 3. top-k ------------------------------------------------------------------------


def _pairs(values: torch.Tensor, indices: torch.Tensor) -> dict[int, int]:
    """index -> value bits (NaN canonicalised), checking indices are unique."""
    idx = indices.cpu().long().tolist()
    assert len(set(idx)) == len(idx), "duplicate indices"
    vals = values.cpu()
    bits = torch.where(torch.isnan(vals), float("nan"), vals).view(torch.int32).tolist()
    return dict(zip(idx, bits, strict=True))


def _distinct_magnitudes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x, residual`` with ``x + residual`` (exact) of pairwise-distinct magnitudes."""
    g = torch.Generator().manual_seed(seed)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    v = sign * (torch.randperm(n, generator=g) + 1).float() / 8
    r = torch.randint(-4, 5, (n,), generator=g).float() / 2
    return v - r, r  # exact: small multiples of 1/8


def _distinct_extreme(n: int, seed: int) -> torch.Tensor:
    """Distinct finite magnitudes over the whole fp32 range (subnormals to FLT_MAX)."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.unique(torch.randint(0, 0x7F7FFFFF, (2 * n + 16,), generator=g))
    keys = keys[torch.randperm(keys.numel(), generator=g)][:n]
    sign = (torch.rand(n, generator=g) < 0.5).long() << 31
    return (keys | sign).to(torch.int64).to(torch.int32).view(torch.float32)


def _ks(n: int) -> list[int]:
    return sorted({1, max(1, n // 100), max(1, n // 2), n}) if n else [0]


@pytest.mark.parametrize("with_residual", [True, False], ids=["ef", "no-ef"])
@pytest.mark.parametrize("n", LENGTHS)
def test_topk_parity_distinct(device, n, with_residual):
    x, r0 = _distinct_magnitudes(n, seed=n)
    if not with_residual:
        x = x + r0  # distinct magnitudes without error feedback too
    for k in _ks(n):
        r_ref = r0.clone() if with_residual else None
        r_tri = r0.to(device, copy=True) if with_residual else None
        v_ref, i_ref = R.topk_ef(x, r_ref, k)
        v_tri, i_tri = T.topk_ef(x.to(device, copy=True), r_tri, k)
        assert v_tri.dtype == torch.float32 and i_tri.dtype == torch.int32
        assert v_tri.shape == (k,) and i_tri.shape == (k,)
        assert _pairs(v_tri, i_tri) == _pairs(v_ref, i_ref), f"k={k}"
        if with_residual:
            assert_same_bits(r_tri, r_ref, f"residual k={k}")


@pytest.mark.parametrize("n", [1, 1025, LONG])
def test_topk_parity_extreme_magnitudes(device, n):
    x = _distinct_extreme(n, seed=11)
    for k in _ks(n):
        r_ref, r_tri = torch.zeros(n), torch.zeros(n, device=device)
        v_ref, i_ref = R.topk_ef(x, r_ref, k)
        v_tri, i_tri = T.topk_ef(x.to(device, copy=True), r_tri, k)
        assert _pairs(v_tri, i_tri) == _pairs(v_ref, i_ref), f"k={k}"
        assert_same_bits(r_tri, r_ref, f"residual k={k}")


@pytest.mark.parametrize("n", [1023, LONG])
def test_topk_nonfinite(device, n):
    """NaN ranks first, then inf (as torch.topk); non-finite never enters the residual."""
    x, r0 = _distinct_magnitudes(n, seed=3)
    g = torch.Generator().manual_seed(4)
    pos = torch.randperm(n, generator=g)[:9]
    x[pos[:3]] = float("nan")
    x[pos[3:6]] = float("inf")
    x[pos[6:]] = float("-inf")
    for k in (6, 9, 50):
        r_ref, r_tri = r0.clone(), r0.to(device, copy=True)
        v_ref, i_ref = R.topk_ef(x, r_ref, k)
        v_tri, i_tri = T.topk_ef(x.to(device, copy=True), r_tri, k)
        if k == 6:  # the 3 NaN, then 3 of the 6 tied infinite magnitudes (any 3)
            assert set(i_tri.cpu().tolist()) >= set(pos[:3].tolist())
        else:
            assert _pairs(v_tri, i_tri) == _pairs(v_ref, i_ref), f"k={k}"
            assert_same_bits(r_tri, r_ref, f"residual k={k}")
        assert torch.isfinite(r_tri.cpu()).all()


def _expected_tie_selection(v: torch.Tensor, k: int) -> set[int]:
    """Documented rule: larger magnitude first, ties by lowest index."""
    key = v.abs().view(torch.int32).long()
    order = sorted(range(v.numel()), key=lambda i: (-int(key[i]), i))
    return set(order[:k])


@pytest.mark.parametrize("pattern", ["zeros", "few-levels", "constant"])
def test_topk_ties(device, pattern):
    n = 5000
    g = torch.Generator().manual_seed(8)
    if pattern == "zeros":
        x, r0 = torch.zeros(n), torch.zeros(n)
    elif pattern == "few-levels":
        x = torch.randint(-2, 3, (n,), generator=g).float()
        r0 = torch.randint(-1, 2, (n,), generator=g).float() * 0.5
    else:
        x, r0 = torch.full((n,), -0.25), torch.zeros(n)
    v = x + r0
    for k in (1, 37, 1000, n):
        r_tri = r0.to(device, copy=True)
        vals, idx = T.topk_ef(x.to(device, copy=True), r_tri, k)
        vals, idx, r_tri = vals.cpu(), idx.cpu().long(), r_tri.cpu()
        assert idx.numel() == k and idx.unique().numel() == k
        assert set(idx.tolist()) == _expected_tie_selection(v, k)
        sent = torch.zeros(n).index_put_((idx,), vals)
        assert torch.equal(sent + r_tri, v)  # sent + residual == x + old residual
        assert torch.equal(vals, v[idx])
        unsent = torch.ones(n, dtype=torch.bool)
        unsent[idx] = False
        if unsent.any():
            assert v[idx].abs().min() >= v[unsent].abs().max()


def test_topk_edges(device):
    empty = torch.empty(0, device=device)
    vals, idx = T.topk_ef(empty, torch.empty(0, device=device), 0)
    assert vals.shape == (0,) and idx.shape == (0,) and idx.dtype == torch.int32
    with pytest.raises(ValueError, match="k must be"):
        T.topk_ef(torch.ones(4, device=device), None, 0)
    with pytest.raises(ValueError, match="k must be"):
        T.topk_ef(torch.ones(4, device=device), None, 5)
    # half-precision input is upcast like x.float() in the reference
    x16 = torch.linspace(-3, 2, 1000).half()
    v_ref, i_ref = R.topk_ef(x16, None, 10)
    v_tri, i_tri = T.topk_ef(x16.to(device, copy=True), None, 10)
    assert _pairs(v_tri, i_tri) == _pairs(v_ref, i_ref)


# -- 4. random-k ---------------------------------------------------------------------


@pytest.mark.parametrize("n", LENGTHS)
def test_randomk_indices_parity(device, n):
    for k in _ks(n):
        for seed in (0, 1, 2**31, 2**32 - 1, R.seed_mix(3, 4, 5)):
            i_ref, s_ref = R.randomk_indices(n, k, seed)
            i_tri, s_tri = T.randomk_indices(n, k, seed, device)
            assert i_tri.device.type == device.type
            assert_same_bits(i_tri, i_ref, f"indices n={n} k={k} seed={seed}")
            assert_same_bits(s_tri, s_ref, f"sizes n={n} k={k} seed={seed}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 1023, 1025, LONG])
def test_randomk_gather_scatter_parity(device, n, kind):
    x, r0 = make_data(kind, n, seed=9)
    k = R.topk_k(n, 0.05)
    idx, sizes = R.randomk_indices(n, k, R.seed_mix(1, 2))
    r_ref, r_tri = r0.clone(), r0.to(device, copy=True)
    v_ref = R.randomk_gather_ef(x, r_ref, idx)
    v_tri = T.randomk_gather_ef(x.to(device, copy=True), r_tri, idx.to(device, copy=True))
    assert_same_bits(v_tri, v_ref, "values")
    assert_same_bits(r_tri, r_ref, "residual")
    assert torch.isfinite(r_tri.cpu()).all()
    assert_same_bits(
        T.randomk_gather_ef(x.to(device, copy=True), None, idx.to(device, copy=True)),
        x[idx],
        "no-ef",
    )

    for weights in (None, sizes, sizes.float() * 0.5):
        out_ref = R.randomk_scatter(v_ref, idx, torch.randn(n), weights)
        out_tri = T.randomk_scatter(
            v_ref.to(device, copy=True),
            idx.to(device, copy=True),
            torch.randn(n, device=device),
            None if weights is None else weights.to(device, copy=True),
        )
        assert_same_bits(out_tri, out_ref, "scatter")


def test_randomk_empty(device):
    i, s = T.randomk_indices(0, 0, 5, device)
    assert i.shape == (0,) and s.shape == (0,) and i.dtype == torch.int64
    with pytest.raises(ValueError, match="k must be"):
        T.randomk_indices(10, 0, 5, device)


# -- argument checking (any mode) -----------------------------------------------------


@needs_triton
def test_bad_arguments_raise():
    dev = "cpu" if T.INTERPRETED else ("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.ones(10, device=dev)
    with pytest.raises(ValueError, match="bits"):
        T.quantize_ef(x, None, 3)
    with pytest.raises(ValueError, match="chunk_size"):
        T.quantize_ef(x, None, 8, chunk_size=6)
    with pytest.raises(ValueError, match="destinations"):
        T.quantize_ef(x, None, 8, out_codes=torch.empty(3, dtype=torch.uint8, device=dev))
    with pytest.raises(ValueError, match="expected"):
        T.dequantize_accumulate(
            torch.empty(3, dtype=torch.uint8, device=dev), torch.empty(1, device=dev), 8, x
        )


@needs_triton
def test_cpu_tensors_rejected_outside_interpreter():
    if T.INTERPRETED:
        pytest.skip("the interpreter accepts CPU tensors by design")
    with pytest.raises(ValueError, match="CUDA"):
        T.quantize_ef(torch.ones(10), None, 8)
    with pytest.raises(ValueError, match="CUDA"):
        T.randomk_indices(10, 2, 0, "cpu")


# -- the interpreter run, from a plain process ----------------------------------------


@needs_triton
@pytest.mark.timeout(1500)
def test_parity_under_interpreter_in_subprocess():
    """Run this file's interpreter parity tests in a fresh process with TRITON_INTERPRET=1."""
    if T.INTERPRETED:
        pytest.skip("this process already runs the kernels in the interpreter")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    cmd = [
        sys.executable, "-m", "pytest", str(Path(__file__).resolve()), "-q",
        "-p", "no:cacheprovider", "-m", "not gpu and not expensive",
        "-k", "not in_subprocess", "-o", "addopts=", "--timeout=0",
    ]  # fmt: skip
    try:
        proc = subprocess.run(
            cmd, check=False, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200
        )
    except subprocess.TimeoutExpired as exc:
        # a hang, not slowness: the run takes minutes on an idle 2-core machine and
        # several times that next to other CPU-heavy jobs
        pytest.fail(f"interpreter parity run exceeded 1200 s:\n{(exc.stdout or '')[-4000:]}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"interpreter parity run failed:\n{out[-8000:]}"
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 100, f"too few parity tests ran:\n{out[-3000:]}"


# -- CUDA code generation without a GPU ------------------------------------------------


def _ptx(kernel, ptr_types: dict[str, str], constexprs: dict[str, object], **opts) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {}
    for p in kernel.params:
        sig[p.name] = "constexpr" if p.is_constexpr else ptr_types.get(p.name, "i32")
    src = ASTSource(kernel, sig, constexprs)
    options = dict(T._OPTS, **opts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


@needs_triton
def test_kernels_compile_for_sm90_without_fma_or_ftz():
    """Bitwise parity on GPU needs IEEE rounding: no FMA contraction, no flush-to-zero."""
    if T.INTERPRETED:
        pytest.skip("kernels are interpreted in this process; nothing to compile")
    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("triton has no NVIDIA backend in this installation")
    f32, u8, i32, i64 = "*fp32", "*u8", "*i32", "*i64"
    ptx = {
        "quantize4_stochastic": _ptx(
            T._quantize_ef_kernel,
            {"x_ptr": f32, "r_ptr": f32, "codes_ptr": u8, "scales_ptr": f32},
            {"CHUNK": 512, "ROWS": 256, "PER": 2, "BITS": 4, "QMAX": 7, "CPB": 4,
             "HAS_RES": True, "STOCHASTIC": True},
        ),
        "dequantize2": _ptx(
            T._dequantize_accumulate_kernel,
            {"codes_ptr": u8, "scales_ptr": f32, "out_ptr": f32},
            {"CHUNK": 512, "ROWS": 128, "PER": 4, "BITS": 2, "QMAX": 1, "CPB": 4},
        ),
        "topk_hist": _ptx(
            T._topk_hist_kernel,
            {"x_ptr": f32, "r_ptr": f32, "work_ptr": f32, "state_ptr": i32, "hist_ptr": i32},
            {"MATCH_SHIFT": 31, "DIGIT_SHIFT": 23, "NB": 256, "FIRST": True, "HAS_RES": True,
             "WRITE_WORK": True, "BLOCK": 4096},
            num_warps=8,
        ),
        "topk_select": _ptx(
            T._topk_select_kernel,
            {"hist_ptr": i32, "state_ptr": i32},
            {"NB": 128, "DIGIT_BITS": 7, "FIRST": False},
        ),
        "topk_write": _ptx(
            T._topk_write_kernel,
            {"work_ptr": f32, "r_ptr": f32, "state_ptr": i32, "off_ptr": i32,
             "values_ptr": f32, "indices_ptr": i32},
            {"HAS_RES": True, "BLOCK": 4096},
            num_warps=8,
        ),
        "randomk_indices": _ptx(
            T._randomk_indices_kernel, {"idx_ptr": i64, "size_ptr": i64}, {"BLOCK": 1024}
        ),
        "scatter": _ptx(
            T._scatter_kernel,
            {"out_ptr": f32, "idx_ptr": i64, "values_ptr": f32, "w_ptr": i64},
            {"HAS_VALUES": True, "HAS_W": True, "BLOCK": 1024},
        ),
    }  # fmt: skip
    for name, text in ptx.items():
        assert ".entry" in text, name
        assert not re.search(r"\bfma\.", text), f"{name}: FMA contraction in PTX"
        assert not re.search(r"\.ftz\b", text), f"{name}: flush-to-zero in PTX"
    assert "div.rn.f32" in ptx["quantize4_stochastic"]


# -- GPU-only: large sizes, streams, no host syncs -------------------------------------


@pytest.mark.gpu
@needs_triton
def test_gpu_large_buffers_side_stream_no_sync():
    if T.INTERPRETED or not torch.cuda.is_available():
        pytest.skip("needs compiled kernels on a CUDA GPU")
    n = (1 << 22) + 5
    x, r0 = make_data("normal", n, seed=21)
    k = R.topk_k(n, 0.01)
    xd, rq, rt, rr = x.cuda(), r0.cuda(), r0.cuda(), r0.cuda()
    idx_ref, _ = R.randomk_indices(n, k, 99)
    for bits in (8, 4, 2):  # compile outside the sync-checked region
        T.quantize_ef(xd[:10], rq[:10].clone(), bits)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(stream):
            c, s = T.quantize_ef(xd, rq, 4, stochastic=True, seed=5)
            out = T.dequantize_accumulate(c, s, 4, torch.zeros(n, device="cuda"))
            vals, idx = T.topk_ef(xd, rt, k)
            ridx, _ = T.randomk_indices(n, k, 99, "cuda")
            rvals = T.randomk_gather_ef(xd, rr, ridx)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream.synchronize()
    r_ref = r0.clone()
    c_ref, s_ref = R.quantize_ef(x, r_ref, 4, stochastic=True, seed=5)
    assert_same_bits(c, c_ref, "codes")
    assert_same_bits(s, s_ref, "scales")
    assert_same_bits(rq, r_ref, "residual")
    assert_same_bits(out, R.dequantize_accumulate(c_ref, s_ref, 4, torch.zeros(n)), "deq")
    rt_ref = r0.clone()
    v_ref, i_ref = R.topk_ef(x, rt_ref, k)
    assert _pairs(vals, idx) == _pairs(v_ref, i_ref)
    assert_same_bits(rt, rt_ref, "topk residual")
    assert_same_bits(ridx, idx_ref, "randomk indices")
    rr_ref = r0.clone()
    assert_same_bits(rvals, R.randomk_gather_ef(x, rr_ref, idx_ref), "randomk values")
    assert_same_bits(rr, rr_ref, "randomk residual")
