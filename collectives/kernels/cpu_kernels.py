"""Fused CPU implementations (numba) of commgym's compression kernels.

Every public function has the signature and the semantics of its twin in
:mod:`commgym.collectives.kernels.reference`, which *defines* them (rounding, clamping,
scale formula, NaN policy, packing layout, hash-based randomness). Outputs are bitwise
equal to the reference's (NaN scales are NaN, payload bits unspecified; top-k returns the
same set of ``(index, value)`` pairs with ties at the k-th magnitude broken by lowest
index, as the Triton kernels do); ``tests/collectives/test_cpu_kernels.py`` checks this
on the same data matrix as the Triton parity tests.

Why numba rather than the torch-op chain or ``torch.compile``: on one core the reference
makes 10-20 passes over a bucket with a temporary per op, and Inductor's C++ code for the
quantiser still makes several passes and needs tens of seconds of compilation per shape
(new bucket sizes recompile) on a 2-core machine. These kernels make one pass over memory
per logical operation, allocate nothing bucket-sized per call, run without the GIL and are
compiled once per machine into numba's on-disk cache (``cache=True``) when this module is
first imported; later imports load the machine code in well under a second.
``commgym bench kernels`` measures all three side by side.

Bitwise parity with torch's separate ops needs the same roundings in the same order:
no fast-math, so LLVM neither reassociates nor contracts ``a * b + c`` into an FMA; the
reference's ``qmax / amax`` (Python scalar over tensor) is ``amax.reciprocal() * qmax`` in
torch, two roundings, and is computed that way here.

Threads: the kernels are single-threaded (each rank of a data-parallel job usually owns
one core for them); they release the GIL, so autograd may run beside them.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from commgym.collectives.kernels.reference import (
    CHUNK_SIZE,
    num_chunks,
    packed_nbytes,
)

__all__ = [
    "dequantize_accumulate",
    "powersgd_residual",
    "quantize_ef",
    "randomk_gather_ef",
    "randomk_indices",
    "randomk_scatter",
    "topk_ef",
]

_JIT = {"nogil": True, "cache": True, "fastmath": False, "boundscheck": False}

_M32 = np.uint64(0xFFFFFFFF)
_F32_INF = np.float32(np.inf)
_ABS_MASK = np.int32(0x7FFFFFFF)
#: below this chunk amax (2**125) no new error-feedback residual can overflow (see _quantize_ef)
_GUARD_FREE_AMAX = np.float32(2.0**125)


# -- scalar helpers ----------------------------------------------------------------------


@intrinsic
def _f32_bits(typingctx, f):
    # reinterpret fp32 bits as int32 (no conversion): one LLVM bitcast
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def _bits_f32(typingctx, i):
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@numba.njit(inline="always", **_JIT)
def _mix32(x):
    # "lowbias32" (Chris Wellons, 2018) on uint32 held in uint64: bit-exact with
    # reference._mix32.
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & _M32
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & _M32
    return x ^ (x >> np.uint64(16))


@numba.njit(inline="always", **_JIT)
def _hash_uniform(seed_u, index):
    h = _mix32((np.uint64(index) & _M32) ^ seed_u)
    h = _mix32((h + seed_u) & _M32)
    return np.float32(h >> np.uint64(8)) * np.float32(1.0 / 16777216.0)


# -- 1. error feedback + scale + quantise + pack -----------------------------------------


@numba.njit(**_JIT)
def _quantize_ef(x, r, has_res, bits, codes, scales, stochastic, seed, chunk):
    # Per chunk (L1-resident), two vectorised loops over slice views (indexing with
    # ``lo + j`` keeps numba's negative-index wraparound in the loop and blocks that):
    # v = x + r fused with the amax reduction, then round + clamp + residual + code in
    # one loop (int8 writes its byte there; int4/int2 pack afterwards). The memory
    # traffic is the floor: read x and r once, write r and the codes once.
    n = x.shape[0]
    qmax = (1 << (bits - 1)) - 1
    qmax_f = np.float32(qmax)
    neg_qmax_f = np.float32(-qmax)
    per = 8 // bits
    nch = (n + chunk - 1) // chunk
    seed_u = np.uint64(seed) & _M32
    vbuf = np.empty(chunk, np.float32)
    ybuf = np.empty(chunk, np.float32)
    ubuf = np.zeros(chunk + per, np.int32)
    # int8 with error feedback and round-to-nearest: the common case, with its own loops
    lean = per == 1 and has_res and not stochastic
    for c in range(nch):
        lo = c * chunk
        m = min(n, lo + chunk) - lo
        xc = x[lo : lo + m]
        rc = r[lo : lo + m]
        v = vbuf[:m]
        amax_bits = np.int32(0)
        # explicit int32 casts: numba widens int32 arithmetic to int64, and the widened
        # reduction does not vectorise
        if has_res and lean:
            # v is recomputed where it is used (x and r of a chunk stay in L1); storing it
            # here as well costs a pass
            for j in range(m):
                vj = xc[j] + rc[j]
                amax_bits = np.int32(max(np.int32(_f32_bits(vj) & _ABS_MASK), amax_bits))
        elif has_res:
            for j in range(m):
                vj = xc[j] + rc[j]
                v[j] = vj
                amax_bits = np.int32(max(np.int32(_f32_bits(vj) & _ABS_MASK), amax_bits))
        else:
            for j in range(m):
                vj = xc[j]
                v[j] = vj
                amax_bits = np.int32(max(np.int32(_f32_bits(vj) & _ABS_MASK), amax_bits))
        amax = _bits_f32(amax_bits)
        scale = amax / qmax_f
        scales[c] = scale
        ok = (amax > np.float32(0.0)) and (amax < _F32_INF)
        inv = (np.float32(1.0) / (amax if ok else np.float32(1.0))) * qmax_f
        ok = ok and inv < _F32_INF
        # y = clamp(floor(v * inv + 0.5)) (or + hash for stochastic rounding); a chunk
        # that is not ok encodes zeros (the reference's where(ok, v * inv, 0)).
        if lean and ok and amax < _GUARD_FREE_AMAX:
            cc = codes[lo : lo + m]
            # Here every new residual is finite: |v| <= amax, |y * scale| <= amax
            # (1 + 3 eps), so |new| < 3 amax < FLT_MAX. The reference's keep-old-if-
            # non-finite select is the identity, and without it this loop stores
            # unconditionally, which is what lets LLVM vectorise it (a conditional
            # store does not). The code is converted straight from float (y + qmax is
            # an exact integer in [0, 2 qmax]): numba widens ``int32(y) + qmax`` to
            # int64, which vectorises badly. The clamp is the identity here too:
            # |v * inv| <= qmax (1 + u)^3 (u = 2^-24), so floor(v * inv + 0.5) lies in
            # [-qmax, qmax]. Together 0.79 -> 0.35 ms on a 4.5 MiB bucket (one core).
            for j in range(m):
                vj = xc[j] + rc[j]
                y = np.floor(vj * inv + np.float32(0.5))
                rc[j] = vj - y * scale
                cc[j] = np.uint8(y + qmax_f)
            continue
        if lean:
            for j in range(m):
                v[j] = xc[j] + rc[j]
        if per == 1 and ok and not stochastic:
            cc = codes[lo : lo + m]
            if has_res:
                for j in range(m):
                    y = min(max(np.floor(v[j] * inv + np.float32(0.5)), neg_qmax_f), qmax_f)
                    new = v[j] - y * scale
                    rc[j] = new if abs(new) < _F32_INF else rc[j]
                    cc[j] = np.uint8(y + qmax_f)
            else:
                for j in range(m):
                    y = min(max(np.floor(v[j] * inv + np.float32(0.5)), neg_qmax_f), qmax_f)
                    cc[j] = np.uint8(y + qmax_f)
            continue
        u = ubuf[: m + per]
        if ok and not stochastic:
            if has_res:
                for j in range(m):
                    y = min(max(np.floor(v[j] * inv + np.float32(0.5)), neg_qmax_f), qmax_f)
                    new = v[j] - y * scale
                    rc[j] = new if abs(new) < _F32_INF else rc[j]
                    u[j] = np.int32(y + qmax_f)
            else:
                for j in range(m):
                    y = min(max(np.floor(v[j] * inv + np.float32(0.5)), neg_qmax_f), qmax_f)
                    u[j] = np.int32(y + qmax_f)
        else:
            yb = ybuf[:m]
            if not ok:
                for j in range(m):
                    yb[j] = np.float32(0.0)
            else:
                for j in range(m):
                    yb[j] = np.floor(v[j] * inv + _hash_uniform(seed_u, lo + j))
            for j in range(m):
                y = min(max(yb[j], neg_qmax_f), qmax_f)
                if has_res:
                    new = v[j] - y * scale
                    rc[j] = new if abs(new) < _F32_INF else rc[j]
                u[j] = np.int32(y + qmax_f)
        for j in range(m, m + per):
            u[j] = 0  # pad bits are zero
        nb = (m + per - 1) // per
        cc = codes[lo // per : lo // per + nb]
        if per == 1:
            for t in range(nb):
                cc[t] = np.uint8(u[t])
        elif per == 2:
            for t in range(nb):
                cc[t] = np.uint8(u[2 * t] | (u[2 * t + 1] << 4))
        else:
            for t in range(nb):
                cc[t] = np.uint8(
                    u[4 * t] | (u[4 * t + 1] << 2) | (u[4 * t + 2] << 4) | (u[4 * t + 3] << 6)
                )


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
    """Fused twin of :func:`reference.quantize_ef` (one pass over ``x`` and ``residual``).

    Args:
        x: 1-D contiguous fp32 CPU tensor of ``n`` elements (not modified).
        residual: contiguous fp32 CPU tensor like ``x``, updated in place, or ``None``.
        bits: 8, 4 or 2.
        out_codes: optional contiguous uint8 destination of ``packed_nbytes(n, bits)``.
        out_scales: optional contiguous fp32 destination of ``num_chunks(n)`` scales.
        stochastic: stochastic rounding with the reference's counter-based hash.
        seed: 32-bit seed for stochastic rounding.
        chunk_size: elements per scale; a multiple of 4.

    Returns:
        ``(codes, scales)`` as the reference, on CPU.

    Raises:
        ValueError: bad ``bits`` or ``chunk_size``, destinations of the wrong size, or
            tensors this kernel does not take (see :func:`supports`).
    """
    if bits not in (2, 4, 8):
        raise ValueError(f"bits must be 2, 4 or 8, got {bits!r}")
    if chunk_size < 4 or chunk_size % 4:
        raise ValueError(f"chunk_size must be a positive multiple of 4, got {chunk_size}")
    n = x.numel()
    nch, nbytes = num_chunks(n, chunk_size), packed_nbytes(n, bits)
    codes = out_codes if out_codes is not None else torch.empty(nbytes, dtype=torch.uint8)
    scales = out_scales if out_scales is not None else torch.empty(nch, dtype=torch.float32)
    if codes.numel() != nbytes or scales.numel() != nch:
        raise ValueError(
            f"quantize_ef: destinations hold {codes.numel()} bytes / {scales.numel()} scales, "
            f"need {nbytes} / {nch} for n={n}, bits={bits}"
        )
    if n == 0:
        return codes, scales
    xa = _np(x, np.float32, "x")
    ra = _np(residual, np.float32, "residual") if residual is not None else xa
    _quantize_ef(
        xa,
        ra,
        residual is not None,
        bits,
        _np(codes, np.uint8, "out_codes"),
        _np(scales, np.float32, "out_scales"),
        bool(stochastic),
        int(seed) & 0xFFFFFFFF,
        chunk_size,
    )
    return codes, scales


# -- 2. unpack + dequantise + accumulate ---------------------------------------------------


@numba.njit(**_JIT)
def _dequantize_accumulate(codes, scales, bits, out, chunk):
    n = out.shape[0]
    qmax = (1 << (bits - 1)) - 1
    per = 8 // bits
    mask = (1 << bits) - 1
    nch = (n + chunk - 1) // chunk
    # packed codes: a byte -> ``per`` levels table (exact small integers as fp32), so the
    # unpacking is a 4- or 16-byte copy per byte instead of per-element shifts
    table = np.empty((256, per), np.float32)
    for b in range(256):
        for e in range(per):
            table[b, e] = np.float32(((b >> (e * bits)) & mask) - qmax)
    flat_table = table.reshape(-1)
    qbuf = np.empty(chunk + per, np.float32)
    for c in range(nch):
        lo = c * chunk
        m = min(n, lo + chunk) - lo
        s = scales[c]
        oc = out[lo : lo + m]
        if per == 1:
            cc = codes[lo : lo + m]
            for j in range(m):
                oc[j] = oc[j] + np.float32(np.int32(cc[j]) - qmax) * s
            continue
        nb = (m + per - 1) // per
        cc = codes[lo // per : lo // per + nb]
        q = qbuf[: nb * per]
        for t in range(nb):
            base = np.int64(cc[t]) * per
            for e in range(per):
                q[t * per + e] = flat_table[base + e]
        for j in range(m):
            oc[j] = oc[j] + q[j] * s


def dequantize_accumulate(
    codes: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    out: torch.Tensor,
    *,
    chunk_size: int = CHUNK_SIZE,
) -> torch.Tensor:
    """Fused twin of :func:`reference.dequantize_accumulate` (``out += scale * (u - qmax)``).

    Args:
        codes: contiguous uint8 CPU codes for ``n = out.numel()`` elements.
        scales: contiguous fp32 CPU per-chunk scales.
        bits: 8, 4 or 2.
        out: 1-D contiguous fp32 CPU accumulator, modified in place.
        chunk_size: as used to quantise.

    Returns:
        ``out``.

    Raises:
        ValueError: sizes do not match ``n`` and ``bits``.
    """
    if bits not in (2, 4, 8):
        raise ValueError(f"bits must be 2, 4 or 8, got {bits!r}")
    n = out.numel()
    nch = num_chunks(n, chunk_size)
    if codes.numel() != packed_nbytes(n, bits) or scales.numel() != nch:
        raise ValueError(
            f"dequantize_accumulate: got {codes.numel()} bytes / {scales.numel()} scales for "
            f"n={n}, bits={bits}; expected {packed_nbytes(n, bits)} / {nch}"
        )
    if n == 0:
        return out
    _dequantize_accumulate(
        _np(codes, np.uint8, "codes"),
        _np(scales, np.float32, "scales"),
        bits,
        _np(out, np.float32, "out"),
        chunk_size,
    )
    return out


# -- 3. top-k: sampled threshold, exact selection among the candidates ---------------------

#: Samples drawn (evenly strided) to place the candidate threshold.
TOPK_SAMPLES = 4096
#: The threshold is set so that about this many times ``k`` elements pass it.
TOPK_OVERSAMPLE = 2.0
#: Candidate buffer size in multiples of ``k`` (plus :data:`TOPK_SLACK`).
TOPK_CAPACITY = 4
TOPK_SLACK = 64


@numba.njit(inline="always", **_JIT)
def _key(f):
    # bits of |f| as int32: monotone in |f|, +inf = 0x7F800000, every NaN above it
    return np.int32(_f32_bits(np.float32(f)) & _ABS_MASK)


@numba.njit(**_JIT)
def _select_kth_largest(keys, count, k):
    """k-th largest of keys[:count] (1-based k), reordering keys[:count] in place."""
    lo, hi, target = 0, count - 1, k - 1  # position in descending order
    while hi > lo:
        mid = (lo + hi) // 2
        a, b, c = keys[lo], keys[mid], keys[hi]
        pivot = max(min(a, b), min(max(a, b), c))  # median of three
        i, j = lo, hi
        while i <= j:
            while keys[i] > pivot:
                i += 1
            while keys[j] < pivot:
                j -= 1
            if i <= j:
                keys[i], keys[j] = keys[j], keys[i]
                i += 1
                j -= 1
        if target <= j:
            hi = j
        elif target >= i:
            lo = i
        else:
            return keys[target]
    return keys[target]


#: Elements per block of the fused top-k pass (its keys and values stay in L1).
TOPK_BLOCK = 512
_INF_KEY = np.int32(0x7F800000)


@numba.njit(**_JIT)
def _topk_threshold(x, r, has_res, k, scratch, m):
    # threshold key from an evenly strided sample of v = x + residual
    n = x.shape[0]
    stride = n // m
    for t in range(m):
        i = t * stride
        scratch[t] = _key(x[i] + r[i]) if has_res else _key(x[i])
    want = min(m, max(1, int(math.ceil(m * k * TOPK_OVERSAMPLE / n))))  # noqa: RUF046
    return _select_kth_largest(scratch, m, want)


@numba.njit(**_JIT)
def _topk_ef(x, r, has_res, k, thr, cand_idx, cand_key, cand_val, vbuf, kbuf):
    # One pass, block by block: v = x + r and its keys (vectorised), a scan collecting
    # every element with key >= thr (index, key, value), then r = v for the block
    # (vectorised) while nothing non-finite was seen and the candidates fit. Returns
    # (candidates counted, end of the prefix of r that now holds v).
    n = x.shape[0]
    cap = cand_idx.shape[0]
    cnt = 0
    done = 0
    writing = has_res
    for lo in range(0, n, TOPK_BLOCK):
        m = min(n, lo + TOPK_BLOCK) - lo
        xb = x[lo : lo + m]
        rb = r[lo : lo + m]
        v = vbuf[:m]
        kb = kbuf[:m]
        top = np.int32(0)
        if has_res:
            for j in range(m):
                f = xb[j] + rb[j]
                v[j] = f
                key = np.int32(_f32_bits(f) & _ABS_MASK)
                kb[j] = key
                top = np.int32(max(key, top))
        else:
            for j in range(m):
                key = np.int32(_f32_bits(xb[j]) & _ABS_MASK)
                kb[j] = key
                top = np.int32(max(key, top))
        if top >= thr:
            for j in range(m):
                key = kb[j]
                if key >= thr:
                    if cnt < cap:
                        cand_idx[cnt] = lo + j
                        cand_key[cnt] = key
                        cand_val[cnt] = v[j] if has_res else xb[j]
                    cnt += 1
        if writing:
            if top >= _INF_KEY or cnt > cap:
                writing = False  # r keeps its old values from here on
            else:
                for j in range(m):
                    rb[j] = v[j]
                done = lo + m
    return cnt, done


@numba.njit(**_JIT)
def _topk_pick(k, cnt, cand_idx, cand_key, cand_val, scratch, indices, values):
    # exact top-k among the candidates (index order kept), ties at the k-th key by index
    for t in range(cnt):
        scratch[t] = cand_key[t]
    tk = _select_kth_largest(scratch, cnt, k)
    above = 0
    for t in range(cnt):
        if cand_key[t] > tk:
            above += 1
    ties = k - above
    o = 0
    for t in range(cnt):
        key = cand_key[t]
        if key > tk or (key == tk and ties > 0):
            if key == tk:
                ties -= 1
            indices[o] = cand_idx[t]
            values[o] = cand_val[t]
            o += 1


@numba.njit(inline="always", **_JIT)
def _v_at(x, r, has_res, done, i):
    # v = x + old residual: r already holds v below ``done``
    if not has_res:
        return x[i]
    return r[i] if i < done else x[i] + r[i]


@numba.njit(**_JIT)
def _topk_exact_fallback(x, r, has_res, done, k, indices, values, keys):
    # Exact selection over the whole bucket (degenerate inputs: ties, e.g. all zeros)
    n = x.shape[0]
    for i in range(n):
        keys[i] = _key(_v_at(x, r, has_res, done, i))
    tk = _select_kth_largest(keys, n, k)
    above = 0
    for i in range(n):
        if _key(_v_at(x, r, has_res, done, i)) > tk:
            above += 1
    ties = k - above
    o = 0
    for i in range(n):
        f = _v_at(x, r, has_res, done, i)
        key = _key(f)
        if key > tk or (key == tk and ties > 0):
            if key == tk:
                ties -= 1
            indices[o] = i
            values[o] = f
            o += 1


@numba.njit(**_JIT)
def _topk_finish(x, r, has_res, done, k, indices):
    # the residual: v where finite (else the old residual), zero where sent; r holds v
    # below ``done`` already
    if has_res:
        for i in range(done, x.shape[0]):
            f = x[i] + r[i]
            r[i] = f if abs(f) < _F32_INF else r[i]
        for t in range(k):
            r[indices[t]] = np.float32(0.0)


_scratch: dict[tuple[str, int], np.ndarray] = {}


def _scratch_buffer(tag: str, numel: int, dtype) -> np.ndarray:
    # Persistent per-size scratch (a bucket plan has a fixed set of sizes), so no
    # bucket-sized temporary is allocated per call.
    buf = _scratch.get((tag, numel))
    if buf is None:
        if len(_scratch) > 256:
            _scratch.clear()
        buf = _scratch[(tag, numel)] = np.empty(numel, dtype)
    return buf


def topk_ef(
    x: torch.Tensor, residual: torch.Tensor | None, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by magnitude with the error-feedback update, via a sampled threshold.

    Same contract as :func:`reference.topk_ef`: exactly ``k`` elements are sent and
    ``sent + residual == x + old residual`` holds element-wise wherever it is finite. For
    distinct magnitudes the set of ``(index, value)`` pairs equals the reference's; ties at
    the k-th magnitude are broken by lowest index; NaN ranks above +inf. Output order:
    index order of the selected elements.

    Rule (after DGC, Lin et al., ICLR 2018, which samples to place the threshold): a
    threshold ``T`` is the ``ceil(2 k m / n)``-th largest magnitude of ``m =
    min(n, 4096)`` evenly strided samples, so about ``2k`` elements pass it. One pass over
    the bucket, in blocks of :data:`TOPK_BLOCK` elements, computes ``v = x + residual``
    and its magnitude bits (vectorised), collects every element with ``|v| >= T`` into a
    candidate buffer of at most ``4k + 64`` entries (bounded: never more is stored) and
    writes ``v`` into the residual (vectorised) as long as every ``v`` so far was finite
    and the candidates fit; the exact top-k is then selected among the candidates
    (quickselect on the magnitude bits). The selection is exact whenever at least ``k``
    and at most ``4k + 64`` elements pass; otherwise (a misplaced threshold, or ties
    across the bucket such as an all-zero bucket) an exact selection over the whole
    bucket runs instead, reading ``v`` from the residual where the pass already wrote it.
    Both paths give the same result; only the time differs. Memory traffic: ``x`` and the
    residual read once and the residual written once (the sampled threshold touches 4096
    cache lines).

    Args:
        x: 1-D contiguous CPU tensor of ``n`` elements (fp32; fp16/bf16 are upcast).
        residual: contiguous fp32 like ``x``, updated in place, or ``None``.
        k: ``1 <= k <= n`` (``n == 0`` requires ``k == 0``).

    Returns:
        ``(values, indices)``: fp32 ``[k]`` and int32 ``[k]``.

    Raises:
        ValueError: ``k`` out of range.
    """
    n = x.numel()
    if not (0 <= k <= n) or (n > 0 and k == 0):
        raise ValueError(f"topk_ef: k must be in [1, {n}] for n={n}, got {k}")
    values = torch.empty(k, dtype=torch.float32)
    indices = torch.empty(k, dtype=torch.int32)
    if k == 0:
        return values, indices
    if x.dtype != torch.float32:
        x = x.float()
    xa = _np(x, np.float32, "x")
    ra = _np(residual, np.float32, "residual") if residual is not None else xa
    has_res = residual is not None
    va, ia = values.numpy(), indices.numpy()
    cap = min(n, TOPK_CAPACITY * k + TOPK_SLACK)
    scratch = _scratch_buffer("key", max(cap, min(n, TOPK_SAMPLES)), np.int32)
    cand_idx = _scratch_buffer("cidx", cap, np.int32)
    cand_key = _scratch_buffer("ckey", cap, np.int32)
    cand_val = _scratch_buffer("cval", cap, np.float32)
    vbuf = _scratch_buffer("vblk", TOPK_BLOCK, np.float32)
    kbuf = _scratch_buffer("kblk", TOPK_BLOCK, np.int32)
    thr = _topk_threshold(xa, ra, has_res, k, scratch, min(n, TOPK_SAMPLES))
    cnt, done = _topk_ef(xa, ra, has_res, k, thr, cand_idx, cand_key, cand_val, vbuf, kbuf)
    if k <= cnt <= cap:
        _topk_pick(k, cnt, cand_idx, cand_key, cand_val, scratch, ia, va)
    else:
        keys = _scratch_buffer("all", n, np.int32)
        _topk_exact_fallback(xa, ra, has_res, done, k, ia, va, keys)
    _topk_finish(xa, ra, has_res, done, k, ia)
    return values, indices


# -- 4. random-k ---------------------------------------------------------------------------


@numba.njit(**_JIT)
def _randomk_indices(numel, k, seed, idx, sizes):
    seed_u = np.uint64(seed) & _M32
    for j in range(k):
        lo = (j * numel) // k
        size = ((j + 1) * numel) // k - lo
        u = _hash_uniform(seed_u, j)
        off = min(np.int64(np.float64(u) * np.float64(size)), size - 1)
        idx[j] = lo + off
        sizes[j] = size


def randomk_indices(
    numel: int, k: int, seed: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Twin of :func:`reference.randomk_indices` (same stratified, hashed stream).

    Returns:
        ``(indices, stratum_sizes)``: int64 ``[k]`` each, on CPU.

    Raises:
        ValueError: ``k`` out of range.
    """
    if not (0 <= k <= numel) or (numel > 0 and k == 0):
        raise ValueError(f"randomk_indices: k must be in [1, {numel}] for n={numel}, got {k}")
    idx = torch.empty(k, dtype=torch.int64)
    sizes = torch.empty(k, dtype=torch.int64)
    if k:
        _randomk_indices(numel, k, int(seed) & 0xFFFFFFFF, idx.numpy(), sizes.numpy())
    return idx, sizes


@numba.njit(**_JIT)
def _randomk_gather_ef(x, r, has_res, indices, values):
    k = indices.shape[0]
    if not has_res:
        for j in range(k):
            values[j] = x[indices[j]]
        return
    for j in range(k):
        i = indices[j]
        values[j] = x[i] + r[i]
    for i in range(x.shape[0]):
        f = x[i] + r[i]
        r[i] = f if abs(f) < _F32_INF else r[i]
    for j in range(k):
        r[indices[j]] = np.float32(0.0)


def randomk_gather_ef(
    x: torch.Tensor, residual: torch.Tensor | None, indices: torch.Tensor
) -> torch.Tensor:
    """Fused twin of :func:`reference.randomk_gather_ef` (one pass over the bucket).

    Args:
        x: 1-D contiguous CPU tensor (fp32; others are upcast), not modified.
        residual: contiguous fp32 like ``x``, updated in place, or ``None``.
        indices: int64 CPU indices from :func:`randomk_indices`.

    Returns:
        fp32 values ``[k]``.
    """
    if x.dtype != torch.float32:
        x = x.float()
    values = torch.empty(indices.numel(), dtype=torch.float32)
    xa = _np(x, np.float32, "x")
    _randomk_gather_ef(
        xa,
        _np(residual, np.float32, "residual") if residual is not None else xa,
        residual is not None,
        _np(indices, np.int64, "indices"),
        values.numpy(),
    )
    return values


def randomk_scatter(
    values: torch.Tensor,
    indices: torch.Tensor,
    out: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Twin of :func:`reference.randomk_scatter`: a memset plus a k-element scatter.

    torch's own ops are already at that floor here, so this is the reference itself.
    """
    out.zero_()
    out[indices] = values if weights is None else values * weights.to(values.dtype)
    return out


# -- 5. PowerSGD residual -------------------------------------------------------------------


@numba.njit(**_JIT)
def _powersgd_residual(work, estimate, world_size, residual, dense_mask):
    w = np.float32(world_size)
    for i in range(work.shape[0]):
        if dense_mask[i]:
            new = np.float32(0.0)
        else:
            new = work[i] - estimate[i] / w
        residual[i] = new if abs(new) < _F32_INF else residual[i]


def powersgd_residual(
    work: torch.Tensor,
    estimate: torch.Tensor,
    world_size: int,
    residual: torch.Tensor,
    dense_mask: torch.Tensor,
) -> torch.Tensor:
    """``residual = where(dense, 0, work - estimate / W)``, keeping old values where not finite.

    The PowerSGD error-feedback update (see ``PowerSGDCompressor``) in one pass.

    Args:
        work: fp32 ``[n]``, this rank's ``v = gradient / W + residual``.
        estimate: fp32 ``[n]``, the decoded aggregate ``P Q^T`` (dense parts exact).
        world_size: ``W``.
        residual: fp32 ``[n]``, updated in place.
        dense_mask: bool ``[n]``, True where the tensor was sent uncompressed.

    Returns:
        ``residual``.
    """
    _powersgd_residual(
        _np(work, np.float32, "work"),
        _np(estimate, np.float32, "estimate"),
        int(world_size),
        _np(residual, np.float32, "residual"),
        _np(dense_mask, np.bool_, "dense_mask"),
    )
    return residual


# -- plumbing ---------------------------------------------------------------------------------


_TORCH_DTYPE = {
    np.float32: torch.float32,
    np.uint8: torch.uint8,
    np.int64: torch.int64,
    np.bool_: torch.bool,
}


def _np(t: torch.Tensor, dtype, what: str) -> np.ndarray:
    # Called four times per kernel call: the checks read torch's attributes and skip
    # detach/reshape when they are no-ops (that chain cost ~5 us a call, 20 us a bucket).
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"{what} must be a contiguous CPU tensor, got {t.device} {t.stride()}")
    if t.dtype != _TORCH_DTYPE[dtype]:
        raise ValueError(f"{what} must be {np.dtype(dtype).name}, got {t.dtype}")
    if t.requires_grad:
        t = t.detach()
    return (t if t.dim() == 1 else t.reshape(-1)).numpy()


def supports(*tensors: torch.Tensor | None) -> bool:
    """Whether these tensors can take the fused CPU path (contiguous, on CPU)."""
    return all(t is None or (t.device.type == "cpu" and t.is_contiguous()) for t in tensors)


def warmup() -> float:
    """Compile (or load from numba's on-disk cache) every kernel for the types used.

    Called once per process before the first measured step, so JIT compilation never
    lands inside a timed region: about 10-20 s on a 2-core machine the first time, then
    well under a second per process from the cache.

    Returns:
        Seconds spent.
    """
    import time

    t0 = time.perf_counter()
    x = torch.linspace(-1.0, 1.0, 1031)
    r = torch.zeros(1031)
    for bits in (8, 4, 2):
        for stochastic in (False, True):
            codes, scales = quantize_ef(x, r, bits, stochastic=stochastic)
        dequantize_accumulate(codes, scales, bits, r)
    topk_ef(x, r, 10)
    topk_ef(torch.zeros(1031), None, 10)  # the exact fallback
    topk_ef(torch.zeros(1031), torch.zeros(1031), 10)
    idx, _ = randomk_indices(1031, 10, 1)
    randomk_gather_ef(x, r, idx)
    randomk_gather_ef(x, None, idx)
    powersgd_residual(x, x, 2, r, torch.zeros(1031, dtype=torch.bool))
    return time.perf_counter() - t0
