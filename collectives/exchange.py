"""Moving a compressor's payload across ranks: the one place that reads ``summable``.

Both users of compression, gradient synchronisation (:class:`GradientSynchronizer`) and
compressed model averaging at ``sync_period > 1`` (:class:`PeriodicAverager`), hand a
bucket's payload to :func:`issue` and decode what came back with :func:`decode`, so which
collective a compressor uses is decided here and nowhere else.

A small control word (non-finite flag, used-parameter map) can ride inside one bucket's
exchange instead of a collective of its own: :func:`attach_control` appends it to a
payload tensor before :func:`issue`, :func:`detach_control` takes it off what came back
(summed, or one word per rank for all-gathered payloads) before :func:`decode`. The word
holds small non-negative integers, stored in the payload tensor's own dtype; a sum of
such values is non-zero exactly when some rank's value was, in every dtype (fp16 and
bf16 included), so the word is lossless for the questions it answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from commgym.collectives.compressors import Compressor

__all__ = [
    "CarriedControl",
    "all_gather_flat",
    "attach_control",
    "decode",
    "detach_control",
    "issue",
]

#: ``all_gather_single`` where torch has it (>= 2.13), else ``all_gather_into_tensor``.
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def issue(
    compressor: Compressor,
    payload: list[torch.Tensor],
    *,
    group: dist.ProcessGroup | None,
    world_size: int,
    gather_buffers: dict[Any, torch.Tensor],
    key: Any,
) -> tuple[list[Any], list[torch.Tensor], int, int]:
    """Start the collectives of one bucket's payload (asynchronous).

    ``compressor.summable`` payloads are all-reduced (SUM) in place; others are
    all-gathered into buffers kept in ``gather_buffers`` (allocated once per ``key`` and
    payload index, reused while the size stays the same).

    Args:
        compressor: the compressor that produced ``payload``.
        payload: tensors to communicate (empty ones are skipped).
        group: process group (None: the world).
        world_size: ranks in ``group``.
        gather_buffers: persistent all-gather destinations, updated in place.
        key: hashable key of this bucket and round in ``gather_buffers``.

    Returns:
        ``(works, gathered, bytes_sent, collectives)``: the async work handles; per payload
        tensor the tensor that holds the result once the works finished (the payload
        itself, or ``world_size`` concatenated payloads); the bytes handed to collectives
        by this rank; the number of collectives issued.
    """
    works: list[Any] = []
    gathered: list[torch.Tensor] = []
    nbytes = count = 0
    for j, t in enumerate(payload):
        if t.numel() == 0:
            gathered.append(t.new_empty(0))
            continue
        if compressor.summable:
            works.append(dist.all_reduce(t, group=group, async_op=True))
            gathered.append(t)
        else:
            out = gather_buffers.get((key, j))
            if out is None or out.numel() != t.numel() * world_size or out.dtype != t.dtype:
                out = gather_buffers[(key, j)] = t.new_empty(t.numel() * world_size)
            works.append(all_gather_flat(out, t, group=group, async_op=True))
            gathered.append(out)
        nbytes += t.numel() * t.element_size()
        count += 1
    return works, gathered, nbytes, count


def decode(
    compressor: Compressor,
    gathered: list[torch.Tensor],
    ctx: Any,
    out: torch.Tensor,
    world_size: int,
) -> None:
    """Write the dense mean that ``gathered`` encodes into ``out`` (1-D fp32, in place).

    Summable payloads were summed by the collective and are decoded once; gathered ones
    are decoded rank by rank, in rank order, and accumulated, so every rank computes the
    same bits. A gathered tensor is either the ``world_size`` payloads concatenated (1-D)
    or a ``[world_size, n]`` matrix of them (rows of :func:`detach_control`).
    """
    if compressor.summable:
        compressor.decompress(gathered, ctx, out)
        return
    out.zero_()
    for r in range(world_size):
        part = []
        for t in gathered:
            if t.dim() == 2:
                part.append(t[r])
                continue
            n = t.numel() // world_size
            part.append(t[r * n : (r + 1) * n])
        compressor.decompress(part, ctx, out, accumulate=True)


@dataclass
class CarriedControl:
    """Where a control word rides in one bucket's payload (from :func:`attach_control`).

    Attributes:
        index: the payload tensor that carries it (``len(payload)`` of the compressor's
            payload when the word travels alone: every payload tensor was empty).
        numel: elements of that payload tensor without the word.
        words: elements of the word (a multiple of 4, so gathered rows stay aligned).
        source: the compressor's own payload tensor, which the carrier replaced (restored
            from the sum by :func:`detach_control`); None when the word travels alone.
    """

    index: int
    numel: int
    words: int
    source: torch.Tensor | None


def attach_control(
    payload: list[torch.Tensor],
    word: torch.Tensor,
    buffers: dict[Any, torch.Tensor],
    key: Any,
) -> tuple[list[torch.Tensor], CarriedControl]:
    """Append ``word`` to the smallest non-empty tensor of ``payload`` (a copy of it).

    Args:
        payload: one bucket's payload from ``compressor.compress`` / ``advance``.
        word: 1-D tensor of small non-negative integers (any dtype), its length a multiple
            of 4; the same length on every rank.
        buffers: persistent carrier buffers (updated in place, reused while sizes match).
        key: hashable key of the bucket in ``buffers``.

    Returns:
        ``(payload with the carrier in place of that tensor, where the word rides)``; hand
        the new payload to :func:`issue`, then what came back to :func:`detach_control`.
    """
    sizes = [(t.numel() * t.element_size(), j) for j, t in enumerate(payload) if t.numel()]
    words = word.numel()
    if not sizes:
        out = buffers.get((key, "ctl"))
        if out is None or out.numel() != words or out.dtype != torch.float32:
            out = buffers[(key, "ctl")] = torch.empty(
                words, dtype=torch.float32, device=word.device
            )
        out.copy_(word)
        return [*payload, out], CarriedControl(len(payload), 0, words, None)
    j = min(sizes)[1]
    t = payload[j]
    n = t.numel()
    out = buffers.get((key, "ctl"))
    if out is None or out.numel() != n + words or out.dtype != t.dtype or out.device != t.device:
        out = buffers[(key, "ctl")] = t.new_empty(n + words)
    out[:n].copy_(t.reshape(-1))
    out[n:].copy_(word)
    carried = list(payload)
    carried[j] = out
    return carried, CarriedControl(j, n, words, t)


def detach_control(
    compressor: Compressor,
    gathered: list[torch.Tensor],
    carried: CarriedControl,
    world_size: int,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Take the control word off a finished exchange (see :func:`attach_control`).

    Returns:
        ``(gathered as the compressor's own payload would have come back, the word summed
        over ranks as int64)``; summed payloads are copied back into the compressor's
        tensor (which it may read instead of ``gathered``, as PowerSGD does).
    """
    j, n, words = carried.index, carried.numel, carried.words
    t = gathered[j]
    rest = gathered[:j] + gathered[j + 1 :]
    if compressor.summable:
        word = t[n:].to(torch.int64)
        if carried.source is None:
            return rest, word
        carried.source.view(-1).copy_(t[:n])
        out = list(gathered)
        out[j] = carried.source
        return out, word
    rows = t.view(world_size, n + words)
    word = rows[:, n:].to(torch.int64).sum(0)
    if carried.source is None:
        return rest, word
    out = list(gathered)
    out[j] = rows[:, :n]
    return out, word
