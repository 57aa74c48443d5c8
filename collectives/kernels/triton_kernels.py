"""Fused Triton (CUDA) implementations of commgym's compression kernels.

Every public function has the signature and the semantics of its twin in
:mod:`commgym.collectives.kernels.reference`, which *defines* them (rounding, clamping,
scale formula, NaN policy, packing layout, hash-based randomness). Outputs are bitwise
equal to the reference's run on CPU (NaN scales are NaN, payload bits unspecified; top-k
returns the same set of pairs, see :func:`topk_ef` for order and ties);
``tests/collectives/test_kernels.py`` checks this under Triton's interpreter on CPU and,
with ``-m gpu``, against the compiled CUDA kernels.

Importing this module raises :class:`ImportError` when Triton is not installed, so
:mod:`commgym.collectives.kernels` falls back to the reference.

Execution model:

* Kernels are launched on the current CUDA stream of the tensors' device; no function
  synchronises with the host (no ``.item()``, no pageable host-to-device copies), so
  they can sit inside measured regions and inside autograd hooks.
* Floating-point contraction and libdevice flush-to-zero are disabled at launch
  (``enable_fp_fusion=False``, ``enable_reflect_ftz=False``) and divisions use IEEE
  round-to-nearest (``tl.math.div_rn``), so every fp32 operation, subnormals included,
  rounds exactly as the reference's separate torch ops do on CPU. Where torch evaluates
  an expression differently from how it reads, the kernel follows torch: the
  reference's ``qmax / amax`` (Python scalar over tensor) is ``amax.reciprocal() *
  qmax`` in torch, two roundings.
* With ``TRITON_INTERPRET=1`` in the environment *before* Triton is first imported, the
  kernels run in Triton's NumPy interpreter and the functions accept CPU tensors
  (:data:`INTERPRETED` is then True). This is how the parity tests run without a GPU.

Limits: flat buffers hold at most ``2**31 - 2**17`` elements (32-bit offsets and int32
top-k indices), far above any practical bucket size; larger ones raise ValueError.

The fused kernels:

1. :func:`quantize_ef`: one read of ``x`` and ``residual``, one write of ``residual``,
   codes and scales. Each program owns ``CPB`` whole chunks laid out as
   ``[CPB, bytes per chunk, elements per byte]``, so the per-chunk max, the rounding and
   the bit packing happen in registers.
2. :func:`dequantize_accumulate`: one read of codes and scales, one read-modify-write
   of ``out``.
3. :func:`topk_ef`: exact top-k by a device-side radix select on the fp32 magnitude bits
   (4 histogram levels of 8/8/8/7 bits), then a compaction pass that writes values,
   indices and the residual together. See :func:`topk_ef` for why the threshold is
   exact instead of estimated from a sample.
4. :func:`randomk_indices`, :func:`randomk_gather_ef`, :func:`randomk_scatter`: the
   reference's stratified counter-based index stream, computed on device.
"""

# Triton convention: compile-time (tl.constexpr) kernel parameters are UPPER_CASE, and
# kernels take their arguments positionally.
# ruff: noqa: N803

from __future__ import annotations

import contextlib
import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # pragma: no cover - exercised only without triton
    raise ImportError(
        "commgym.collectives.kernels.triton_kernels needs Triton (pip install commgym[kernels])"
    ) from exc

from commgym.collectives.kernels.reference import CHUNK_SIZE, num_chunks, packed_nbytes

__all__ = [
    "INTERPRETED",
    "dequantize_accumulate",
    "quantize_ef",
    "randomk_gather_ef",
    "randomk_indices",
    "randomk_scatter",
    "topk_ef",
]

_INF = tl.constexpr(float("inf"))
_NAN = tl.constexpr(float("nan"))
# Largest supported buffer: 32-bit offsets, with headroom for the masked tail of the last
# program (whose lanes may run up to one program's tile past n).
_MAX_NUMEL = 2**31 - 2**17

# -- device-side helpers ---------------------------------------------------------------


@triton.jit
def _mix32(x):
    # "lowbias32" (Chris Wellons, 2018) on uint32, wrapping multiplies: bit-exact with
    # reference._mix32.
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _hash_uniform(seed_u32, index):
    # reference.hash_uniform: u = (h >> 8) * 2**-24, h = mix32(mix32(index ^ seed) + seed).
    h = _mix32(index.to(tl.uint32) ^ seed_u32)
    h = _mix32(h + seed_u32)
    return (h >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def _is_finite(v):
    return tl.abs(v) < _INF  # False for +-inf and NaN


@triton.jit
def _magnitude_key(v):
    # Bits of |v| as int32: monotone in |v| for non-negative floats, +inf = 0x7F800000 and
    # every NaN above it (torch.topk also ranks NaN above everything). Always < 2**31.
    return tl.abs(v).to(tl.int32, bitcast=True)


# -- 1. error feedback + scale + quantise + pack ----------------------------------------


@triton.jit(do_not_specialize=["seed"])
def _quantize_ef_kernel(
    x_ptr,
    r_ptr,
    codes_ptr,
    scales_ptr,
    n,
    nbytes,
    nch,
    seed,
    CHUNK: tl.constexpr,
    ROWS: tl.constexpr,
    PER: tl.constexpr,
    BITS: tl.constexpr,
    QMAX: tl.constexpr,
    CPB: tl.constexpr,
    HAS_RES: tl.constexpr,
    STOCHASTIC: tl.constexpr,
):
    # Tile [CPB chunks, ROWS bytes per chunk, PER elements per byte].
    pid = tl.program_id(0)
    c = pid * CPB + tl.arange(0, CPB)
    row = tl.arange(0, ROWS)
    col = tl.arange(0, PER)
    within = row[None, :, None] * PER + col[None, None, :]
    idx = c[:, None, None] * CHUNK + within
    in_chunk = within < CHUNK
    valid = in_chunk & (idx < n)

    v = tl.load(x_ptr + idx, mask=valid, other=0.0).to(tl.float32)
    if HAS_RES:
        r_old = tl.load(r_ptr + idx, mask=valid, other=0.0)
        v = v + r_old

    a = tl.abs(v)
    amax = tl.max(tl.max(a, axis=2), axis=1)  # [CPB]
    # torch.amax propagates NaN, tl.max need not: flag NaN chunks explicitly.
    has_nan = tl.max(tl.max((a != a).to(tl.int32), axis=2), axis=1) > 0  # noqa: PLR0124
    amax = tl.where(has_nan, _NAN, amax)
    qmax_f = tl.full((CPB,), QMAX, tl.float32)
    scale = tl.math.div_rn(amax, qmax_f)
    ok = (amax > 0.0) & (amax < _INF)
    # The reference's ``qmax / amax`` is torch's scalar-by-tensor division, which torch
    # evaluates as ``amax.reciprocal() * qmax`` (two roundings): do exactly that.
    one = tl.full((CPB,), 1.0, tl.float32)
    inv = tl.math.div_rn(one, tl.where(ok, amax, 1.0)) * qmax_f
    # a max below qmax / FLT_MAX overflows the inverse: that chunk encodes zeros
    ok = ok & (inv < _INF)
    inv = tl.where(ok, inv, 0.0)
    y = tl.where(ok[:, None, None], v * inv[:, None, None], 0.0)
    if STOCHASTIC:
        y = tl.math.floor(y + _hash_uniform(seed.to(tl.uint32, bitcast=True), idx))
    else:
        y = tl.math.floor(y + 0.5)
    # NaN-propagating clamp, as torch.clamp (kept for parity; y is finite here).
    q = tl.where(y > QMAX, QMAX, tl.where(y < -QMAX, -QMAX, y))

    if HAS_RES:
        new = v - q * scale[:, None, None]
        tl.store(r_ptr + idx, tl.where(_is_finite(new), new, r_old), mask=valid)

    # The reference's NaN -> int32 cast leaves the low bits zero on every platform; make
    # that explicit (fptosi of NaN is undefined in LLVM).
    u = tl.where(q == q, (q + QMAX).to(tl.int32), 0) & ((1 << BITS) - 1)  # noqa: PLR0124
    u = tl.where(idx < n, u, 0)  # pad bits are zero
    shift = (col * BITS)[None, None, :]
    packed = tl.sum(u << shift, axis=2)  # [CPB, ROWS]
    bidx = c[:, None] * (CHUNK // PER) + row[None, :]
    tl.store(
        codes_ptr + bidx,
        packed.to(tl.uint8),
        mask=(row[None, :] < CHUNK // PER) & (bidx < nbytes),
    )
    tl.store(scales_ptr + c, scale, mask=c < nch)


# -- 2. unpack + dequantise + accumulate -----------------------------------------------


@triton.jit
def _dequantize_accumulate_kernel(
    codes_ptr,
    scales_ptr,
    out_ptr,
    n,
    nch,
    CHUNK: tl.constexpr,
    ROWS: tl.constexpr,
    PER: tl.constexpr,
    BITS: tl.constexpr,
    QMAX: tl.constexpr,
    CPB: tl.constexpr,
):
    pid = tl.program_id(0)
    c = pid * CPB + tl.arange(0, CPB)
    row = tl.arange(0, ROWS)
    col = tl.arange(0, PER)
    bidx = c[:, None] * (CHUNK // PER) + row[None, :]
    byte_ok = (row[None, :] < CHUNK // PER) & (bidx * PER < n)
    b = tl.load(codes_ptr + bidx, mask=byte_ok, other=0).to(tl.int32)
    s = tl.load(scales_ptr + c, mask=c < nch, other=0.0)
    u = (b[:, :, None] >> (col * BITS)[None, None, :]) & ((1 << BITS) - 1)
    q = (u - QMAX).to(tl.float32)
    idx = c[:, None, None] * CHUNK + row[None, :, None] * PER + col[None, None, :]
    valid = (row[None, :, None] < CHUNK // PER) & (idx < n)
    acc = tl.load(out_ptr + idx, mask=valid, other=0.0)
    tl.store(out_ptr + idx, acc + q * s[:, None, None], mask=valid)


# -- 3. top-k: radix select on magnitude bits, then compaction -------------------------

# Digit layout of the 31-bit magnitude key (bit 30 = top exponent bit): four levels.
_TOPK_LEVELS = ((23, 8), (15, 8), (7, 8), (0, 7))  # (digit shift, digit bits)


@triton.jit
def _topk_hist_kernel(
    x_ptr,
    r_ptr,
    work_ptr,
    state_ptr,
    hist_ptr,
    n,
    nblocks,
    MATCH_SHIFT: tl.constexpr,
    DIGIT_SHIFT: tl.constexpr,
    NB: tl.constexpr,
    FIRST: tl.constexpr,
    HAS_RES: tl.constexpr,
    WRITE_WORK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Histogram of one radix digit over the elements whose higher bits equal the prefix
    # selected so far. Persistent grid: one atomic flush of NB bins per program.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if FIRST:
        prefix = 0
    else:
        prefix = tl.load(state_ptr + 1)
    acc = tl.zeros((NB,), tl.int32)
    for blk in range(pid, nblocks, nprog):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        valid = offs < n
        if FIRST:
            v = tl.load(x_ptr + offs, mask=valid, other=0.0).to(tl.float32)
            if HAS_RES:
                v = v + tl.load(r_ptr + offs, mask=valid, other=0.0)
            if WRITE_WORK:
                tl.store(work_ptr + offs, v, mask=valid)
        else:
            v = tl.load(work_ptr + offs, mask=valid, other=0.0)
        key = _magnitude_key(v)
        match = valid & ((key >> MATCH_SHIFT) == prefix)
        digit = (key >> DIGIT_SHIFT) & (NB - 1)
        acc += tl.histogram(digit, NB, mask=match)
    tl.atomic_add(hist_ptr + tl.arange(0, NB), acc, mask=acc > 0)


@triton.jit(do_not_specialize=["k"])
def _topk_select_kernel(
    hist_ptr,
    state_ptr,
    k,
    NB: tl.constexpr,
    DIGIT_BITS: tl.constexpr,
    FIRST: tl.constexpr,
):
    # state = [k_rem, prefix, n_greater]: pick the digit d* holding the k_rem-th largest
    # matching key; elements with a larger digit are definitely selected.
    if FIRST:
        k_rem = k
        prefix = 0
        n_gt = 0
    else:
        k_rem = tl.load(state_ptr + 0)
        prefix = tl.load(state_ptr + 1)
        n_gt = tl.load(state_ptr + 2)
    b = tl.arange(0, NB)
    h = tl.load(hist_ptr + b)
    ge = tl.sum(h) - tl.cumsum(h, 0) + h  # matching elements with digit >= b
    dstar = tl.max(tl.where(ge >= k_rem, b, -1))
    above = tl.sum(tl.where(b > dstar, h, 0))
    tl.store(state_ptr + 0, k_rem - above)
    tl.store(state_ptr + 1, (prefix << DIGIT_BITS) | dstar)
    tl.store(state_ptr + 2, n_gt + above)


@triton.jit
def _topk_count_kernel(work_ptr, state_ptr, cnt_ptr, n, nblocks, BLOCK: tl.constexpr):
    # Per block: elements strictly above the threshold key T, and equal to it.
    pid = tl.program_id(0)
    t = tl.load(state_ptr + 1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    key = _magnitude_key(tl.load(work_ptr + offs, mask=valid, other=0.0))
    tl.store(cnt_ptr + pid, tl.sum((valid & (key > t)).to(tl.int32)))
    tl.store(cnt_ptr + nblocks + pid, tl.sum((valid & (key == t)).to(tl.int32)))


@triton.jit
def _topk_write_kernel(
    work_ptr,
    r_ptr,
    state_ptr,
    off_ptr,
    values_ptr,
    indices_ptr,
    n,
    nblocks,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Elements above T go to [0, n_gt) in index order; the first k_rem elements equal to
    # T (lowest indices) to [n_gt, k). Residual: 0 where sent, v elsewhere, old where the
    # new value would be non-finite.
    pid = tl.program_id(0)
    k_rem = tl.load(state_ptr + 0)
    t = tl.load(state_ptr + 1)
    n_gt = tl.load(state_ptr + 2)
    base_gt = tl.load(off_ptr + pid)
    base_eq = tl.load(off_ptr + nblocks + pid)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    v = tl.load(work_ptr + offs, mask=valid, other=0.0)
    key = _magnitude_key(v)
    gt = valid & (key > t)
    eq = valid & (key == t)
    rank_gt = base_gt + tl.cumsum(gt.to(tl.int32), 0) - 1
    rank_eq = base_eq + tl.cumsum(eq.to(tl.int32), 0) - 1
    take_eq = eq & (rank_eq < k_rem)
    sel = gt | take_eq
    pos = tl.where(gt, rank_gt, n_gt + rank_eq)
    tl.store(values_ptr + pos, v, mask=sel)
    tl.store(indices_ptr + pos, offs, mask=sel)
    if HAS_RES:
        new = tl.where(sel, 0.0, v)
        fin = _is_finite(new)
        r_old = tl.load(r_ptr + offs, mask=valid & (fin == 0), other=0.0)
        tl.store(r_ptr + offs, tl.where(fin, new, r_old), mask=valid)


# -- 4. random-k -----------------------------------------------------------------------


@triton.jit(do_not_specialize=["numel", "k", "seed"])
def _randomk_indices_kernel(idx_ptr, size_ptr, numel, k, seed, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    j32 = pid * BLOCK + tl.arange(0, BLOCK)
    valid = j32 < k
    j = j32.to(tl.int64)
    n64 = numel.to(tl.int64)
    lo = (j * n64) // k
    size = ((j + 1) * n64) // k - lo
    u = _hash_uniform(seed.to(tl.uint32, bitcast=True), j32)
    # Same fp64 product and truncation as the reference (exact for strata < 2**29).
    off = (u.to(tl.float64) * size.to(tl.float64)).to(tl.int64)
    off = tl.minimum(off, size - 1)
    tl.store(idx_ptr + j, lo + off, mask=valid)
    tl.store(size_ptr + j, size, mask=valid)


@triton.jit
def _gather_kernel(
    x_ptr, r_ptr, idx_ptr, values_ptr, k, HAS_RES: tl.constexpr, BLOCK: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < k
    i = tl.load(idx_ptr + offs, mask=valid, other=0)
    v = tl.load(x_ptr + i, mask=valid, other=0.0).to(tl.float32)
    if HAS_RES:
        v = v + tl.load(r_ptr + i, mask=valid, other=0.0)
    tl.store(values_ptr + offs, v, mask=valid)


@triton.jit
def _ef_keep_finite_kernel(x_ptr, r_ptr, n, BLOCK: tl.constexpr):
    # residual = where(isfinite(x + residual), x + residual, residual)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    r = tl.load(r_ptr + offs, mask=valid, other=0.0)
    v = tl.load(x_ptr + offs, mask=valid, other=0.0).to(tl.float32) + r
    tl.store(r_ptr + offs, tl.where(_is_finite(v), v, r), mask=valid)


@triton.jit
def _scatter_kernel(
    out_ptr,
    idx_ptr,
    values_ptr,
    w_ptr,
    k,
    HAS_VALUES: tl.constexpr,
    HAS_W: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # out[idx] = values * w (or 0 when HAS_VALUES is False)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < k
    i = tl.load(idx_ptr + offs, mask=valid, other=0)
    if HAS_VALUES:
        val = tl.load(values_ptr + offs, mask=valid, other=0.0).to(tl.float32)
        if HAS_W:
            val = val * tl.load(w_ptr + offs, mask=valid, other=0).to(tl.float32)
    else:
        val = tl.zeros((BLOCK,), tl.float32)
    tl.store(out_ptr + i, val, mask=valid)


# -- host side ---------------------------------------------------------------------------

try:
    from triton.runtime.interpreter import InterpretedFunction as _InterpretedFunction
except ImportError:  # pragma: no cover - layout of older/newer triton releases
    _InterpretedFunction = ()

#: True when the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1`` was set
#: before Triton was imported); the functions then accept CPU tensors.
INTERPRETED: bool = isinstance(_quantize_ef_kernel, _InterpretedFunction)

# Launch options: no FMA contraction and no flush-to-zero in libdevice (floor), so every
# fp32 result, subnormals included, rounds like the reference's separate torch ops.
_OPTS = {"enable_fp_fusion": False, "enable_reflect_ftz": False}
_BLOCK = 1024  # elementwise / gather / scatter kernels
_TOPK_BLOCK = 4096


def _qmax(bits: int) -> int:
    if bits not in (2, 4, 8):
        raise ValueError(f"bits must be 2, 4 or 8, got {bits!r}")
    return (1 << (bits - 1)) - 1


def _check(name: str, device: torch.device, *tensors: torch.Tensor | None) -> None:
    if not INTERPRETED and device.type != "cuda":
        raise ValueError(
            f"{name}: Triton kernels need CUDA tensors, got device {device} "
            "(use commgym.collectives.kernels, which dispatches, or set TRITON_INTERPRET=1)"
        )
    for t in tensors:
        if t is None:
            continue
        if t.device != device:
            raise ValueError(f"{name}: tensors on {t.device} and {device}")
        if t.dim() != 1 or not t.is_contiguous():
            raise ValueError(f"{name}: expected contiguous 1-D tensors, got shape {tuple(t.shape)}")


def _check_numel(name: str, n: int) -> None:
    if n > _MAX_NUMEL:
        raise ValueError(f"{name}: {n} elements exceed the 32-bit offset limit; split the bucket")


def _check_fp32(name: str, what: str, t: torch.Tensor | None) -> None:
    if t is not None and t.dtype != torch.float32:
        raise TypeError(f"{name}: {what} must be float32, got {t.dtype}")


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _on(device: torch.device):
    # Launch on the tensors' device (and its current stream), not the current device.
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


@functools.cache
def _num_sms(index: int | None) -> int:
    if INTERPRETED or not torch.cuda.is_available():
        return 1
    return torch.cuda.get_device_properties(index or 0).multi_processor_count


def _chunks_per_program(chunk_size: int) -> int:
    # ~2048 elements per program on GPU; many chunks per program in the interpreter,
    # where every program costs a Python-level iteration.
    target = 16384 if INTERPRETED else 2048
    return max(1, target // triton.next_power_of_2(chunk_size))


def _quant_meta(bits: int, chunk_size: int) -> dict[str, int]:
    qmax = _qmax(bits)
    if chunk_size <= 0 or chunk_size % 4:
        raise ValueError(f"chunk_size must be a positive multiple of 4, got {chunk_size}")
    per = 8 // bits
    return {
        "CHUNK": chunk_size,
        "ROWS": triton.next_power_of_2(chunk_size // per),
        "PER": per,
        "BITS": bits,
        "QMAX": qmax,
        "CPB": _chunks_per_program(chunk_size),
    }


def quantize_ef(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    bits: int,
    *,
    out_codes: torch.Tensor | None = None,
    out_scales: torch.Tensor | None = None,
    stochastic: bool = False,
    seed: int = 0,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Error-feedback add, per-chunk scale, quantise and bit-pack in one fused kernel.

    Semantics are those of :func:`commgym.collectives.kernels.reference.quantize_ef`
    (bitwise equal codes, scales and residual). One program handles whole chunks, so
    memory is touched once: read ``x`` and ``residual``, write ``residual``, codes and
    scales.

    Args:
        x: 1-D CUDA tensor of ``n`` elements (fp32, or fp16/bf16 upcast on load); not
            modified. Non-contiguous inputs are copied first.
        residual: contiguous fp32 tensor like ``x`` updated in place, or ``None``.
        bits: 8, 4 or 2.
        out_codes: optional contiguous uint8 destination of ``packed_nbytes(n, bits)``.
        out_scales: optional contiguous fp32 destination of ``num_chunks(n)`` scales.
        stochastic: stochastic rounding with the counter-based hash of ``(seed, index)``.
        seed: 32-bit seed for stochastic rounding.
        chunk_size: elements per scale; a positive multiple of 4.

    Returns:
        ``(codes, scales)``: uint8 ``[ceil(n*bits/8)]`` and fp32 ``[ceil(n/chunk_size)]``
        on ``x``'s device.

    Raises:
        ValueError: bad ``bits``/``chunk_size``, wrong destination sizes, non-CUDA tensors
            (outside the interpreter), or more than ``2**31 - 2**17`` elements.
        TypeError: ``residual``/``out_scales`` not fp32 or ``out_codes`` not uint8.
    """
    meta = _quant_meta(bits, chunk_size)
    n = x.numel()
    nch = num_chunks(n, chunk_size)
    nbytes = packed_nbytes(n, bits)
    dev = x.device
    codes = out_codes
    if codes is None:
        codes = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    scales = out_scales
    if scales is None:
        scales = torch.empty(nch, dtype=torch.float32, device=dev)
    if codes.numel() != nbytes or scales.numel() != nch:
        raise ValueError(
            f"quantize_ef: destinations hold {codes.numel()} bytes / {scales.numel()} scales, "
            f"need {nbytes} / {nch} for n={n}, bits={bits}"
        )
    if codes.dtype != torch.uint8:
        raise TypeError(f"quantize_ef: out_codes must be uint8, got {codes.dtype}")
    _check_fp32("quantize_ef", "out_scales", scales)
    _check_fp32("quantize_ef", "residual", residual)
    x = _flat(x.reshape(-1))
    _check("quantize_ef", dev, x, residual, codes, scales)
    if residual is not None and residual.numel() != n:
        raise ValueError(f"quantize_ef: residual has {residual.numel()} elements, x has {n}")
    _check_numel("quantize_ef", nch * chunk_size)
    if n == 0:
        return codes, scales
    s = int(seed) & 0xFFFFFFFF
    s = s - (1 << 32) if s >= (1 << 31) else s  # passed as int32, bitcast in the kernel
    grid = (triton.cdiv(nch, meta["CPB"]),)
    with _on(dev):
        _quantize_ef_kernel[grid](
            x,
            residual if residual is not None else x,
            codes,
            scales,
            n,
            nbytes,
            nch,
            s,
            HAS_RES=residual is not None,
            STOCHASTIC=bool(stochastic),
            num_warps=4,
            **meta,
            **_OPTS,
        )
    return codes, scales


def dequantize_accumulate(
    codes: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    out: torch.Tensor,
    *,
    chunk_size: int = CHUNK_SIZE,
) -> torch.Tensor:
    """Unpack, dequantise and add into ``out`` in one fused kernel, in place.

    Semantics of :func:`commgym.collectives.kernels.reference.dequantize_accumulate`:
    ``out += scale * (u - qmax)`` with the product rounded to fp32 before the add.

    Args:
        codes: contiguous uint8 CUDA tensor, ``packed_nbytes(n, bits)`` bytes.
        scales: contiguous fp32 per-chunk scales, ``num_chunks(n, chunk_size)``.
        bits: 8, 4 or 2 (as used to quantise).
        out: contiguous 1-D fp32 accumulator of ``n`` elements, modified in place.
        chunk_size: as used to quantise.

    Returns:
        ``out``.

    Raises:
        ValueError: sizes do not match ``n`` and ``bits``, or non-CUDA tensors.
        TypeError: wrong dtypes.
    """
    meta = _quant_meta(bits, chunk_size)
    n = out.numel()
    nch = num_chunks(n, chunk_size)
    if codes.numel() != packed_nbytes(n, bits) or scales.numel() != nch:
        raise ValueError(
            f"dequantize_accumulate: got {codes.numel()} bytes / {scales.numel()} scales for "
            f"n={n}, bits={bits}; expected {packed_nbytes(n, bits)} / {nch}"
        )
    if codes.dtype != torch.uint8:
        raise TypeError(f"dequantize_accumulate: codes must be uint8, got {codes.dtype}")
    _check_fp32("dequantize_accumulate", "scales", scales)
    _check_fp32("dequantize_accumulate", "out", out)
    _check("dequantize_accumulate", out.device, codes, scales, out)
    _check_numel("dequantize_accumulate", nch * chunk_size)
    if n == 0:
        return out
    grid = (triton.cdiv(nch, meta["CPB"]),)
    with _on(out.device):
        _dequantize_accumulate_kernel[grid](
            codes, scales, out, n, nch, num_warps=4, **meta, **_OPTS
        )
    return out


def topk_ef(
    x: torch.Tensor, residual: torch.Tensor | None, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by magnitude with the error-feedback residual update, on device.

    Same contract as :func:`commgym.collectives.kernels.reference.topk_ef`; for distinct
    magnitudes the *set* of ``(index, value)`` pairs equals the reference's (values are
    bitwise equal). Ties at the k-th magnitude are broken by lowest index (torch.topk's
    choice is unspecified); exactly ``k`` elements are always sent, so
    ``sent + residual == x + old residual`` holds element-wise wherever it is finite.
    NaN ranks above +inf (as in torch.topk). Output order: all elements above the k-th
    magnitude in index order, then the tied ones in index order.

    Algorithm (no host synchronisation; ``O(n)`` and deterministic):

    1. fused ``v = x + residual`` (written to a scratch buffer) and a 256-bin histogram of
       the top digit of ``bits(|v|)``;
    2. three more histogram levels (8, 8, 7 bits) restricted to the elements whose higher
       digits match the selected prefix; a one-program kernel after each level picks the
       digit of the k-th largest key, so the exact threshold key ``T``, the number above
       it and the number of ties to take stay on the device;
    3. per-block counts of ``key > T`` / ``key == T`` and an exclusive ``torch.cumsum``;
    4. one pass that compacts values and int32 indices and writes the residual.

    Why not a sampled threshold: a threshold estimated from a
    sample gives no guarantee of at least ``k`` and at most a fixed number of candidates,
    and with common ties (all-zero or frozen-parameter buckets) the candidate set is the
    whole bucket; recovering exactness would need either a host sync to size the
    candidate buffer or a second, flag-gated exact path. The radix select instead costs
    extra 4-byte passes over the scratch buffer and is exact in every case. Per element
    it moves ~36 bytes (read ``x`` and ``residual``, write the scratch once and read it
    five times, write ``residual``) against ~12 for a single pass; the reference's
    torch-op chain moves several times more.

    Args:
        x: 1-D CUDA tensor of ``n < 2**31`` elements (fp32, or fp16/bf16); not modified.
        residual: contiguous fp32 like ``x``, updated in place, or ``None``.
        k: ``1 <= k <= n`` (``n == 0`` requires ``k == 0``).

    Returns:
        ``(values, indices)``: fp32 ``[k]`` and int32 ``[k]`` on ``x``'s device.

    Raises:
        ValueError: ``k`` out of range or non-CUDA tensors (outside the interpreter).
    """
    n = x.numel()
    if not (0 <= k <= n) or (n > 0 and k == 0):
        raise ValueError(f"topk_ef: k must be in [1, {n}] for n={n}, got {k}")
    _check_fp32("topk_ef", "residual", residual)
    dev = x.device
    x = _flat(x.reshape(-1))
    _check("topk_ef", dev, x, residual)
    _check_numel("topk_ef", n)
    values = torch.empty(k, dtype=torch.float32, device=dev)
    indices = torch.empty(k, dtype=torch.int32, device=dev)
    if k == 0:
        return values, indices
    has_res = residual is not None
    write_work = has_res or x.dtype != torch.float32
    work = torch.empty(n, dtype=torch.float32, device=dev) if write_work else x
    block = _TOPK_BLOCK
    nblocks = triton.cdiv(n, block)
    nprog = min(nblocks, 4 * _num_sms(dev.index) if dev.type == "cuda" else 4)
    hist = torch.zeros(sum(1 << bits for _, bits in _TOPK_LEVELS), dtype=torch.int32, device=dev)
    state = torch.empty(3, dtype=torch.int32, device=dev)  # [k_rem, prefix, n_greater]
    counts = torch.empty(2 * nblocks, dtype=torch.int32, device=dev)
    with _on(dev):
        h0 = 0
        match_shift = 31
        for level, (shift, bits) in enumerate(_TOPK_LEVELS):
            nb = 1 << bits
            first = level == 0
            _topk_hist_kernel[(nprog,)](
                x,
                residual if has_res else x,
                work,
                state,
                hist[h0 : h0 + nb],
                n,
                nblocks,
                MATCH_SHIFT=match_shift,
                DIGIT_SHIFT=shift,
                NB=nb,
                FIRST=first,
                HAS_RES=has_res,
                WRITE_WORK=write_work,
                BLOCK=block,
                num_warps=8,
                **_OPTS,
            )
            _topk_select_kernel[(1,)](
                hist[h0 : h0 + nb],
                state,
                k,
                NB=nb,
                DIGIT_BITS=bits,
                FIRST=first,
                num_warps=4,
                **_OPTS,
            )
            h0 += nb
            match_shift = shift
        _topk_count_kernel[(nblocks,)](
            work, state, counts, n, nblocks, BLOCK=block, num_warps=8, **_OPTS
        )
        # exclusive prefix sums of the two count rows (device op, no sync)
        incl = torch.cumsum(counts.view(2, nblocks), dim=1, dtype=torch.int32)
        offsets = (incl - counts.view(2, nblocks)).reshape(-1)
        _topk_write_kernel[(nblocks,)](
            work,
            residual if has_res else work,
            state,
            offsets,
            values,
            indices,
            n,
            nblocks,
            HAS_RES=has_res,
            BLOCK=block,
            num_warps=8,
            **_OPTS,
        )
    return values, indices


def randomk_indices(
    numel: int, k: int, seed: int, device: torch.device | str = "cuda"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stratified random-k indices, computed on device (same stream as the reference).

    Bitwise equal to :func:`commgym.collectives.kernels.reference.randomk_indices`: one
    index per stratum ``[floor(j n/k), floor((j+1) n/k))``, offset
    ``min(int(u_j * size_j), size_j - 1)`` in fp64 with ``u_j = hash_uniform(seed, j)``.

    Args:
        numel: ``n < 2**31``.
        k: ``1 <= k <= n`` (or 0 when ``n == 0``).
        seed: 32-bit seed, identical on all ranks.
        device: a CUDA device (any device in the interpreter). Defaults to ``"cuda"``
            (the reference's default ``"cpu"`` is not a Triton device).

    Returns:
        ``(indices, stratum_sizes)``: int64 ``[k]`` each, indices sorted and distinct.

    Raises:
        ValueError: ``k`` out of range or a non-CUDA device outside the interpreter.
    """
    if not (0 <= k <= numel) or (numel > 0 and k == 0):
        raise ValueError(f"randomk_indices: k must be in [1, {numel}] for n={numel}, got {k}")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    _check("randomk_indices", dev)
    _check_numel("randomk_indices", numel)
    idx = torch.empty(k, dtype=torch.int64, device=dev)
    size = torch.empty(k, dtype=torch.int64, device=dev)
    if k == 0:
        return idx, size
    s = int(seed) & 0xFFFFFFFF
    s = s - (1 << 32) if s >= (1 << 31) else s
    with _on(dev):
        _randomk_indices_kernel[(triton.cdiv(k, _BLOCK),)](
            idx, size, numel, k, s, BLOCK=_BLOCK, num_warps=4, **_OPTS
        )
    return idx, size


def randomk_gather_ef(
    x: torch.Tensor, residual: torch.Tensor | None, indices: torch.Tensor
) -> torch.Tensor:
    """Gather ``(x + residual)[indices]`` and leave the unsent rest in ``residual``.

    Semantics of :func:`commgym.collectives.kernels.reference.randomk_gather_ef`. Three
    launches on one stream: gather ``k`` values (old residual), one dense pass
    ``residual = where(finite(v), v, residual)``, then zero ``residual[indices]``.

    Args:
        x: 1-D CUDA tensor (fp32, or fp16/bf16); not modified.
        residual: contiguous fp32 like ``x`` updated in place, or ``None``.
        indices: int64 (or int32) ``[k]`` indices, e.g. from :func:`randomk_indices`.

    Returns:
        fp32 values ``[k]`` on ``x``'s device.

    Raises:
        ValueError: non-CUDA tensors (outside the interpreter).
    """
    dev = x.device
    _check_fp32("randomk_gather_ef", "residual", residual)
    x = _flat(x.reshape(-1))
    indices = _flat(indices.reshape(-1))
    _check("randomk_gather_ef", dev, x, residual, indices)
    n, k = x.numel(), indices.numel()
    _check_numel("randomk_gather_ef", max(n, k))
    values = torch.empty(k, dtype=torch.float32, device=dev)
    has_res = residual is not None
    with _on(dev):
        if k:
            _gather_kernel[(triton.cdiv(k, _BLOCK),)](
                x,
                residual if has_res else x,
                indices,
                values,
                k,
                HAS_RES=has_res,
                BLOCK=_BLOCK,
                num_warps=4,
                **_OPTS,
            )
        if has_res and n:
            _ef_keep_finite_kernel[(triton.cdiv(n, _BLOCK),)](
                x, residual, n, BLOCK=_BLOCK, num_warps=4, **_OPTS
            )
        if has_res and k:
            _scatter_kernel[(triton.cdiv(k, _BLOCK),)](
                residual,
                indices,
                values,
                values,
                k,
                HAS_VALUES=False,
                HAS_W=False,
                BLOCK=_BLOCK,
                num_warps=4,
                **_OPTS,
            )
    return values


def randomk_scatter(
    values: torch.Tensor,
    indices: torch.Tensor,
    out: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write a dense estimate: ``out = 0; out[indices] = values * weights``, in place.

    Semantics of :func:`commgym.collectives.kernels.reference.randomk_scatter` (the
    product is rounded to fp32; integer weights are converted to fp32 first). A memset
    followed by one scatter kernel.

    Args:
        values: fp32 ``[k]`` CUDA tensor.
        indices: int64 (or int32) ``[k]``.
        out: contiguous 1-D fp32 destination, overwritten.
        weights: optional ``[k]`` per-value scale (e.g. int64 stratum sizes).

    Returns:
        ``out``.

    Raises:
        ValueError: non-CUDA tensors (outside the interpreter).
        TypeError: ``out`` not fp32.
    """
    _check_fp32("randomk_scatter", "out", out)
    dev = out.device
    values = _flat(values.reshape(-1))
    indices = _flat(indices.reshape(-1))
    if weights is not None:
        weights = _flat(weights.reshape(-1))
    _check("randomk_scatter", dev, out, values, indices, weights)
    k = indices.numel()
    _check_numel("randomk_scatter", max(out.numel(), k))
    out.zero_()
    if k:
        with _on(dev):
            _scatter_kernel[(triton.cdiv(k, _BLOCK),)](
                out,
                indices,
                values,
                weights if weights is not None else values,
                k,
                HAS_VALUES=True,
                HAS_W=weights is not None,
                BLOCK=_BLOCK,
                num_warps=4,
                **_OPTS,
            )
    return out
