"""Moving a compressor's payload across ranks: the one place that reads ``summable``.

Both users of compression, gradient synchronisation (:class:`GradientSynchronizer`) and
compressed model averaging at ``sync_period > 1`` (:class:`PeriodicAverager`), hand a
bucket's payload to :func:`issue` and decode what came back with :func:`decode`, so which
collective a compressor uses is decided here and nowhere else.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from commgym.collectives.compressors import Compressor

__all__ = ["all_gather_flat", "decode", "issue"]

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
    same bits.
    """
    if compressor.summable:
        compressor.decompress(gathered, ctx, out)
        return
    out.zero_()
    for r in range(world_size):
        part = []
        for t in gathered:
            n = t.numel() // world_size
            part.append(t[r * n : (r + 1) * n])
        compressor.decompress(part, ctx, out, accumulate=True)
