"""Tensor fusion: packing parameters' gradients into flat buckets."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist

from commgym.collectives.compressors import BucketLayout

__all__ = ["DEFAULT_FIRST_BUCKET_BYTES", "BucketPlan"]

#: DDP's first-bucket cap (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``): 1 MiB.
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024


class BucketPlan:
    """Flat gradient buckets with per-parameter views, exactly as DDP's reducer builds them.

    The assignment is DDP's own (``torch.distributed._compute_bucket_assignment_by_size``
    with the limits ``[first_bucket_bytes, bucket_bytes]``, as DDP with
    ``find_unused_parameters=True`` uses them): parameters are taken in registration
    order, grouped by dtype and device, never split, and a bucket is closed as soon as it
    holds at least its limit (the first bucket formed, the one holding parameter 0, has
    ``first_bucket_bytes``). Buckets are then reversed, so bucket 0 holds the last
    layers, whose gradients are ready first in backward; inside a bucket parameters keep
    registration order. Matching DDP's layout element for element is what makes
    ``none`` bit-identical to DDP at any world size: a ring all-reduce sums each element
    in an order that depends on its position in the buffer.

    Args:
        params: parameters (typically ``model.parameters()``); those with
            ``requires_grad=False`` are skipped.
        bucket_bytes: target bucket size in bytes (> 0); DDP's default is 25 MiB.
        first_bucket_bytes: target size of the first bucket; default
            ``min(bucket_bytes, 1 MiB)`` (DDP's ``_DEFAULT_FIRST_BUCKET_BYTES``).

    Attributes:
        params: the parameters that are bucketed, in registration order.
        buckets: per bucket, the indices (into ``params``) it holds, in bucket order.
        buffers: per bucket, a flat contiguous tensor of the parameters' dtype/device.
        views: per parameter, a view into its bucket's buffer shaped like the parameter.
        bucket_of: per parameter, the bucket index.
        layouts: per bucket, a :class:`BucketLayout` with a stable key.

    Raises:
        ValueError: ``bucket_bytes`` is not a positive number.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        bucket_bytes: float,
        first_bucket_bytes: float | None = None,
    ) -> None:
        for name, value in (
            ("bucket_bytes", bucket_bytes),
            ("first_bucket_bytes", first_bucket_bytes),
        ):
            if value is None and name == "first_bucket_bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        self.bucket_bytes_target = float(bucket_bytes)
        self.first_bucket_bytes = float(
            min(bucket_bytes, DEFAULT_FIRST_BUCKET_BYTES)
            if first_bucket_bytes is None
            else first_bucket_bytes
        )
        self.params = [p for p in params if p.requires_grad]
        buckets = BucketPlan._assign(self.params, bucket_bytes, self.first_bucket_bytes)
        self.buckets = buckets
        self.bucket_of = [0] * len(self.params)
        self.views: list[torch.Tensor] = [None] * len(self.params)  # type: ignore[list-item]
        self.buffers: list[torch.Tensor] = []
        self.layouts: list[BucketLayout] = []
        self.offsets: list[list[int]] = []
        for b, idxs in enumerate(buckets):
            first = self.params[idxs[0]]
            numel = sum(self.params[i].numel() for i in idxs)
            buf = torch.zeros(numel, dtype=first.dtype, device=first.device)
            offs = []
            off = 0
            for i in idxs:
                p = self.params[i]
                self.views[i] = _view_like(buf, off, p)
                self.bucket_of[i] = b
                offs.append(off)
                off += p.numel()
            self.buffers.append(buf)
            self.offsets.append(offs)
            key = f"b{b}:p{idxs[0]}-{idxs[-1]}:n{numel}"
            self.layouts.append(BucketLayout(key, tuple(self.params[i].shape for i in idxs)))

    def __len__(self) -> int:
        return len(self.buckets)

    @property
    def bucket_bytes(self) -> list[int]:
        """Actual size of every bucket in bytes, in bucket order."""
        return [b.numel() * b.element_size() for b in self.buffers]

    @property
    def total_bytes(self) -> int:
        """Sum of all buckets in bytes."""
        return sum(self.bucket_bytes)

    def same_as(
        self,
        params: Iterable[torch.nn.Parameter],
        bucket_bytes: float,
        first_bucket_bytes: float | None = None,
    ) -> bool:
        """Whether a plan for these arguments would have the same buckets."""
        other = [p for p in params if p.requires_grad]
        if len(other) != len(self.params) or any(
            a is not b for a, b in zip(other, self.params, strict=True)
        ):
            return False
        first = (
            min(bucket_bytes, DEFAULT_FIRST_BUCKET_BYTES)
            if first_bucket_bytes is None
            else first_bucket_bytes
        )
        return BucketPlan._assign(self.params, bucket_bytes, first) == self.buckets

    @staticmethod
    def _assign(
        params: list[torch.nn.Parameter], bucket_bytes: float, first_bucket_bytes: float
    ) -> list[list[int]]:
        if not params:
            return []
        limits = [math.ceil(first_bucket_bytes), math.ceil(bucket_bytes)]
        buckets, _ = dist._compute_bucket_assignment_by_size(
            list(params), limits, [False] * len(params)
        )
        return [list(b) for b in reversed(buckets)]


def _view_like(buf: torch.Tensor, offset: int, param: torch.Tensor) -> torch.Tensor:
    """A view of ``buf[offset:]`` shaped like ``param`` with ``param``'s strides.

    As DDP's reducer lays out its buckets: a dense non-overlapping parameter (a
    transposed weight, channels-last) keeps its memory order in the bucket, so the
    gradient it receives (same strides, the layout contract) can alias the view and
    the bucket holds the same elements at the same positions as DDP's.
    """
    if torch.empty_like(param, device="meta").stride() == param.stride():
        return buf.as_strided(param.shape, param.stride(), buf.storage_offset() + offset)
    return buf[offset : offset + param.numel()].view(param.shape)
