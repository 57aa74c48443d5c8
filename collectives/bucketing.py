"""Tensor fusion: packing parameters' gradients into flat buckets."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from commgym.collectives.compressors import BucketLayout

__all__ = ["DEFAULT_FIRST_BUCKET_BYTES", "BucketPlan"]

#: DDP's first-bucket cap (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``): 1 MiB.
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024


class BucketPlan:
    """Flat gradient buckets with per-parameter views (as DDP's reducer builds them).

    Parameters are taken in *reverse* registration order (gradients of the last layers
    are ready first in backward), never split across buckets, and a bucket is closed as
    soon as it holds at least ``bucket_bytes``. A bucket holds one dtype and one device.
    As in DDP, the first bucket is capped separately (``first_bucket_bytes``, 1 MiB by
    default) so that communication starts early in backward.

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
                self.views[i] = buf[off : off + p.numel()].view(p.shape)
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
        buckets: list[list[int]] = []
        current: list[int] = []
        current_bytes = 0
        current_kind = None
        for i in reversed(range(len(params))):
            p = params[i]
            kind = (p.dtype, p.device)
            cap = first_bucket_bytes if not buckets else bucket_bytes
            if current and (kind != current_kind or current_bytes >= cap):
                buckets.append(current)
                current, current_bytes = [], 0
            current.append(i)
            current_kind = kind
            current_bytes += p.numel() * p.element_size()
        if current:
            buckets.append(current)
        return buckets
