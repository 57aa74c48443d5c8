"""Pure-torch reference implementations of commgym's compression kernels.

This module *defines the semantics* of every kernel; GPU implementations must match it
(see ``tests/collectives/test_kernels.py``). It runs on any device.

Conventions shared by all functions:

* Inputs are 1-D fp32 tensors (a bucket's flat gradient, already divided by world size).
* Error feedback (Seide et al., 2014; Karimireddy et al., 2019, "EF-SGD"): when a
  ``residual`` is given, the kernel compresses ``v = x + residual`` and afterwards stores
  ``residual = v - local_estimate(v)`` in place. Elements whose new residual would be
  non-finite keep their previous residual, so a NaN/inf gradient is never stored.
* Randomness comes from a counter-based hash of ``(seed, element index)``
  (:func:`hash_uniform`), so every rank, and every device, draws the same numbers
  without a stateful generator.

Quantisation (``int8``/``int4``/``int2``), after QSGD (Alistarh et al., NeurIPS 2017) with
per-chunk max scaling:

* chunks of :data:`CHUNK_SIZE` consecutive elements, the last one possibly shorter;
* ``qmax = 2**(bits-1) - 1`` (127, 7, 1), ``scale = max|v| / qmax`` per chunk (fp32);
* ``q = clamp(floor(v / scale * 1 + 0.5), -qmax, qmax)`` (round half up) or, stochastic,
  ``floor(v / scale + u)`` with ``u = hash_uniform(seed, index)``; implemented as
  ``v * (qmax / max|v|)``;
* a chunk whose max is 0 encodes zeros with scale 0, and so does a chunk whose max is so
  small that ``qmax / max`` overflows fp32 (max < ~1e-37; decodes to 0 times its tiny
  scale); a chunk holding NaN/inf encodes
  zeros with a non-finite scale, so it decodes to NaN (the non-finite value propagates
  and is flagged by the synchronizer, as an uncompressed all-reduce would);
* packing: ``u = q + qmax`` stored in ``bits`` bits, ``8 // bits`` elements per byte,
  element ``j`` of a byte at bit offset ``j * bits`` (little-endian within the byte);
  packed length ``ceil(n * bits / 8)`` bytes, pad bits zero.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "CHUNK_SIZE",
    "dequantize_accumulate",
    "hash_uniform",
    "num_chunks",
    "packed_nbytes",
    "powersgd_residual",
    "quantize_ef",
    "randomk_gather_ef",
    "randomk_indices",
    "randomk_scatter",
    "seed_mix",
    "topk_ef",
    "topk_k",
]

#: Elements per quantisation chunk (one fp32 scale per chunk).
CHUNK_SIZE = 512

_M32 = 0xFFFFFFFF


def seed_mix(*values: int) -> int:
    """Combine integers into one 32-bit seed (host-side, deterministic across ranks).

    Args:
        *values: non-negative or negative Python ints (e.g. base seed, bucket id, step).

    Returns:
        An int in ``[0, 2**32)``.
    """
    h = 0x9E3779B9
    for v in values:
        h ^= (int(v) & 0xFFFFFFFFFFFFFFFF) + 0x9E3779B9 + ((h << 6) & _M32) + (h >> 2)
        h &= _M32
        h = _mix32_int(h)
    return h


def _mix32_int(x: int) -> int:
    x &= _M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    x ^= x >> 16
    return x


def _mulmod32(x: torch.Tensor, c: int) -> torch.Tensor:
    # (x * c) mod 2**32 for int64 x in [0, 2**32) without int64 overflow.
    lo = x & 0xFFFF
    hi = x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # "lowbias32" integer hash (Chris Wellons, 2018), bit-exact with the Triton kernels.
    x = x ^ (x >> 16)
    x = _mulmod32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mulmod32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hash_uniform(seed: int, index: torch.Tensor) -> torch.Tensor:
    """Counter-based uniform random numbers in ``[0, 1)``.

    Args:
        seed: 32-bit seed (see :func:`seed_mix`).
        index: int64 tensor of element indices (any shape, any device), each < 2**32.

    Returns:
        fp32 tensor shaped like ``index``, ``u = (h >> 8) * 2**-24`` where
        ``h = mix32(mix32(index ^ seed) + seed)`` (24 random bits, exactly representable).
    """
    s = int(seed) & _M32
    h = _mix32((index.to(torch.int64) & _M32) ^ s)
    h = _mix32((h + s) & _M32)
    return (h >> 8).to(torch.float32) * (1.0 / 16777216.0)


def num_chunks(numel: int, chunk_size: int = CHUNK_SIZE) -> int:
    """Number of quantisation chunks (one fp32 scale each) for ``numel`` elements."""
    return (numel + chunk_size - 1) // chunk_size


def packed_nbytes(numel: int, bits: int) -> int:
    """Bytes of packed codes for ``numel`` elements at ``bits`` bits (``ceil(n*bits/8)``)."""
    return (numel * bits + 7) // 8


def _check_bits(bits: int) -> int:
    if bits not in (2, 4, 8):
        raise ValueError(f"bits must be 2, 4 or 8, got {bits!r}")
    return (1 << (bits - 1)) - 1


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
    """Error-feedback add, per-chunk scale, quantise and bit-pack (one logical pass).

    Args:
        x: 1-D fp32 tensor of ``n`` elements (not modified).
        residual: fp32 tensor like ``x`` updated in place, or ``None`` (no error feedback).
        bits: 8, 4 or 2.
        out_codes: optional uint8 destination of ``packed_nbytes(n, bits)`` bytes.
        out_scales: optional fp32 destination of ``num_chunks(n)`` scales.
        stochastic: stochastic rounding with :func:`hash_uniform` (unbiased) instead of
            round-half-up.
        seed: 32-bit seed for stochastic rounding.
        chunk_size: elements per scale; must be a multiple of 4.

    Returns:
        ``(codes, scales)``: uint8 ``[ceil(n*bits/8)]`` and fp32 ``[ceil(n/chunk_size)]``,
        on ``x``'s device.

    Raises:
        ValueError: ``bits`` not in {2, 4, 8}, or a destination has the wrong size.
    """
    qmax = _check_bits(bits)
    n = x.numel()
    nch = num_chunks(n, chunk_size)
    nbytes = packed_nbytes(n, bits)
    codes = (
        out_codes
        if out_codes is not None
        else torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    )
    scales = (
        out_scales
        if out_scales is not None
        else torch.empty(nch, dtype=torch.float32, device=x.device)
    )
    if codes.numel() != nbytes or scales.numel() != nch:
        raise ValueError(
            f"quantize_ef: destinations hold {codes.numel()} bytes / {scales.numel()} scales, "
            f"need {nbytes} / {nch} for n={n}, bits={bits}"
        )
    if n == 0:
        return codes, scales
    v = x.float() if residual is None else x.float() + residual
    pad = nch * chunk_size - n
    vp = F.pad(v, (0, pad)).view(nch, chunk_size)
    amax = vp.abs().amax(dim=1)
    scales.copy_(amax / qmax)
    ok = torch.isfinite(amax) & (amax > 0)
    inv = qmax / torch.where(ok, amax, 1.0)
    # a chunk whose max is below qmax / FLT_MAX (~1e-37) would need an infinite inverse
    # scale: it encodes zeros (error feedback keeps those values in the residual)
    ok &= torch.isfinite(inv)
    inv = torch.where(ok, inv, 0.0)
    y = torch.where(ok[:, None], vp * inv[:, None], 0.0)
    if stochastic:
        idx = torch.arange(nch * chunk_size, device=x.device).view(nch, chunk_size)
        y = torch.floor(y + hash_uniform(seed, idx))
    else:
        y = torch.floor(y + 0.5)
    q = y.clamp_(-qmax, qmax)
    if residual is not None:
        deq = (q * scales[:, None]).reshape(-1)[:n]
        new = v - deq
        residual.copy_(torch.where(torch.isfinite(new), new, residual))
    per = 8 // bits
    u = (q.reshape(-1)[: nbytes * per] + qmax).to(torch.int32)
    if u.numel() < nbytes * per:  # only when the final chunk is shorter than 4 elements
        u = F.pad(u, (0, nbytes * per - u.numel()), value=0)
    if per == 1:
        codes.copy_(u.to(torch.uint8))
    else:
        u = u.view(nbytes, per)
        # zero the pad codes beyond n (they hold qmax); pad bits are defined as zero
        tail = nbytes * per - n
        if tail:
            u[-1, per - tail :] = 0
        shifts = torch.arange(per, device=x.device, dtype=torch.int32) * bits
        codes.copy_((u << shifts).sum(dim=1).to(torch.uint8))
    return codes, scales


def dequantize_accumulate(
    codes: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    out: torch.Tensor,
    *,
    chunk_size: int = CHUNK_SIZE,
) -> torch.Tensor:
    """Unpack, dequantise and add into ``out`` (``out += scale * (u - qmax)``), in place.

    Args:
        codes: uint8 packed codes from :func:`quantize_ef` for ``n = out.numel()`` elements.
        scales: fp32 per-chunk scales.
        bits: 8, 4 or 2 (as used to quantise).
        out: 1-D fp32 accumulator of ``n`` elements, modified in place.
        chunk_size: as used to quantise.

    Returns:
        ``out``.

    Raises:
        ValueError: sizes do not match ``n`` and ``bits``.
    """
    qmax = _check_bits(bits)
    n = out.numel()
    nch = num_chunks(n, chunk_size)
    if codes.numel() != packed_nbytes(n, bits) or scales.numel() != nch:
        raise ValueError(
            f"dequantize_accumulate: got {codes.numel()} bytes / {scales.numel()} scales for "
            f"n={n}, bits={bits}; expected {packed_nbytes(n, bits)} / {nch}"
        )
    if n == 0:
        return out
    per = 8 // bits
    c = codes.to(torch.int32)
    if per > 1:
        shifts = torch.arange(per, device=out.device, dtype=torch.int32) * bits
        c = ((c[:, None] >> shifts) & ((1 << bits) - 1)).reshape(-1)
    q = (c[:n] - qmax).to(torch.float32)
    pad = nch * chunk_size - n
    deq = (F.pad(q, (0, pad)).view(nch, chunk_size) * scales[:, None]).reshape(-1)[:n]
    out.add_(deq)
    return out


def topk_ef(
    x: torch.Tensor, residual: torch.Tensor | None, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by magnitude with error-feedback residual update.

    Args:
        x: 1-D fp32 tensor of ``n`` elements (not modified).
        residual: fp32 like ``x`` (updated in place: the unsent part of ``x + residual``)
            or ``None``.
        k: number of elements to keep, ``1 <= k <= n`` (``n == 0`` requires ``k == 0``).

    Returns:
        ``(values, indices)``: fp32 ``[k]`` and int32 ``[k]`` (unsorted order). Ties are
        broken by ``torch.topk``; exactly ``k`` elements are always selected, so
        ``sent + residual == x + old residual`` holds element-wise.

    Raises:
        ValueError: ``k`` out of range.
    """
    n = x.numel()
    if not (0 <= k <= n) or (n > 0 and k == 0):
        raise ValueError(f"topk_ef: k must be in [1, {n}] for n={n}, got {k}")
    v = x.float() if residual is None else x.float() + residual
    if k == 0:
        return v.new_empty(0), torch.empty(0, dtype=torch.int32, device=x.device)
    idx = torch.topk(v.abs(), k, sorted=False).indices
    values = v[idx]
    if residual is not None:
        new = v.clone()
        new[idx] = 0.0
        residual.copy_(torch.where(torch.isfinite(new), new, residual))
    return values, idx.to(torch.int32)


def randomk_indices(
    numel: int, k: int, seed: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stratified random-k indices shared by all ranks that use the same ``seed``.

    The ``n`` elements are split into ``k`` contiguous strata ``[floor(j n/k),
    floor((j+1) n/k))`` and one index is drawn uniformly in each with
    :func:`hash_uniform`, so indices are distinct, sorted and cheap to draw on any device.
    Each element is picked with probability ``1 / stratum_size``; scaling a picked value by
    its stratum size gives an unbiased estimator.

    Args:
        numel: ``n``.
        k: indices to draw, ``1 <= k <= n`` (or 0 when ``n == 0``).
        seed: 32-bit seed, identical on all ranks.
        device: where to create the tensors.

    Returns:
        ``(indices, stratum_sizes)``: int64 ``[k]`` each.

    Raises:
        ValueError: ``k`` out of range.
    """
    if not (0 <= k <= numel) or (numel > 0 and k == 0):
        raise ValueError(f"randomk_indices: k must be in [1, {numel}] for n={numel}, got {k}")
    j = torch.arange(k, device=device, dtype=torch.int64)
    lo = (j * numel) // max(k, 1)
    size = ((j + 1) * numel) // max(k, 1) - lo
    u = hash_uniform(seed, j)
    off = torch.minimum((u.double() * size.double()).to(torch.int64), size - 1)
    return lo + off, size


def randomk_gather_ef(
    x: torch.Tensor, residual: torch.Tensor | None, indices: torch.Tensor
) -> torch.Tensor:
    """Gather ``(x + residual)[indices]`` and leave the unsent rest in ``residual``.

    Args:
        x: 1-D fp32 tensor (not modified).
        residual: fp32 like ``x`` updated in place, or ``None``.
        indices: int64 indices from :func:`randomk_indices`.

    Returns:
        fp32 values ``[k]``.
    """
    v = x.float() if residual is None else x.float() + residual
    values = v[indices]
    if residual is not None:
        new = v.clone()
        new[indices] = 0.0
        residual.copy_(torch.where(torch.isfinite(new), new, residual))
    return values


def randomk_scatter(
    values: torch.Tensor,
    indices: torch.Tensor,
    out: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write a dense estimate: ``out = 0; out[indices] = values * weights``, in place.

    Args:
        values: fp32 ``[k]``.
        indices: int64 ``[k]``.
        out: 1-D fp32 destination, overwritten.
        weights: optional per-value scale (stratum sizes for the unbiased estimator).

    Returns:
        ``out``.
    """
    out.zero_()
    out[indices] = values if weights is None else values * weights.to(values.dtype)
    return out


def powersgd_residual(
    work: torch.Tensor,
    estimate: torch.Tensor,
    world_size: int,
    residual: torch.Tensor,
    dense_mask: torch.Tensor,
) -> torch.Tensor:
    """PowerSGD's error-feedback update: ``residual = work - estimate / W``, in place.

    Vogels et al. (NeurIPS 2019) keep ``e_r = M_r - P Q^T`` per worker. Inputs here are
    pre-divided by ``W`` (``work = M_r / W + e_r``), so the same error is
    ``work - estimate / W``, and the sum over ranks is the aggregate's error. Elements sent
    uncompressed (``dense_mask``) lose nothing: their residual is zero. Elements whose new
    residual would be non-finite keep their old value.

    Args:
        work: fp32 ``[n]``.
        estimate: fp32 ``[n]``, the decoded aggregate.
        world_size: ``W`` (int >= 1).
        residual: fp32 ``[n]``, updated in place.
        dense_mask: bool ``[n]``, True where the tensor was sent uncompressed.

    Returns:
        ``residual``.
    """
    new = torch.where(dense_mask, 0.0, work - estimate / world_size)
    residual.copy_(torch.where(torch.isfinite(new), new, residual))
    return residual


def topk_k(numel: int, density: float) -> int:
    """``k = max(1, round(density * numel))`` (0 for an empty bucket), capped at ``numel``."""
    if numel == 0:
        return 0
    return min(numel, max(1, math.floor(density * numel + 0.5)))
