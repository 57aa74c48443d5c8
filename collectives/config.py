"""The communication configuration an agent chooses: ``CommConfig``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from commgym.collectives.checks import check_int
from commgym.collectives.compressors import CompressionSpec

__all__ = ["CommConfig"]


@dataclass(frozen=True)
class CommConfig:
    """One communication configuration (frozen, validated).

    Attributes:
        compression: compression spec (string or ``CompressionSpec``; stored parsed),
            e.g. ``"none"``, ``"fp16"``, ``"int4"``, ``"topk:0.01"``, ``"powersgd:2"``.
        bucket_mb: tensor-fusion bucket size in MiB (> 0). DDP's default is 25.
        sync_period: local-SGD period ``H`` (int >= 1). ``1`` synchronises gradients every
            step with ``compression``. ``H > 1`` communicates no gradients and averages
            the model once every ``H`` optimizer steps (local SGD: Stich, ICLR 2019; Lin
            et al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020), with
            ``compression`` applied to the model change (Qsparse-local-SGD: Basu et al.,
            NeurIPS 2019; DiLoCo's compressed outer gradient: Douillard et al., 2023).
            With ``none`` the average is exact fp32: ``x = sum_r x_r / W``. Otherwise each
            rank keeps the anchor ``a`` (the model after the last average, identical on
            all ranks) and a per-bucket residual ``e_r`` (buckets of ``bucket_mb``), sends
            ``c_r = C(e_r + (x_r - a) / W)``, keeps ``e_r <- e_r + (x_r - a) / W - c_r``
            (when ``error_feedback``), and every rank sets ``x = a = a + sum_r c_r``
            decoded identically, so the replicas are bit-identical after every average.
            Every (compression, period) pair is a distinct configuration.
        error_feedback: keep residuals for lossy compressors (ignored by lossless ones).
        stochastic_rounding: quantisers (``int8/4/2``) round stochastically.

    Raises:
        ValueError: invalid compression spec, ``bucket_mb`` not a finite positive number,
            ``sync_period`` not an integer >= 1; messages name the value.
        TypeError: a flag is not a bool.
    """

    compression: CompressionSpec | str = "none"
    bucket_mb: float = 25.0
    sync_period: int = 1
    error_feedback: bool = True
    stochastic_rounding: bool = field(default=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compression", CompressionSpec.parse(self.compression))
        bm = self.bucket_mb
        if (
            isinstance(bm, bool)
            or not isinstance(bm, int | float)
            or not math.isfinite(bm)
            or bm <= 0
        ):
            raise ValueError(f"bucket_mb must be a finite number > 0 (MiB), got {bm!r}")
        object.__setattr__(self, "bucket_mb", float(bm))
        sp = check_int("sync_period", self.sync_period, 1, note=" (optimizer steps)")
        object.__setattr__(self, "sync_period", sp)
        for name in ("error_feedback", "stochastic_rounding"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")

    @property
    def bucket_bytes(self) -> int:
        """Bucket size in bytes (``bucket_mb * 2**20``)."""
        return max(1, int(self.bucket_mb * 1024 * 1024))

    @property
    def local_sgd(self) -> bool:
        """True when gradients are not communicated (``sync_period > 1``)."""
        return self.sync_period > 1

    def to_dict(self) -> dict[str, object]:
        """Plain-value dict (compression as its spec string), for logs and YAML."""
        return {
            "compression": str(self.compression),
            "bucket_mb": self.bucket_mb,
            "sync_period": self.sync_period,
            "error_feedback": self.error_feedback,
            "stochastic_rounding": self.stochastic_rounding,
        }

    def __str__(self) -> str:
        return f"{self.compression}/{self.bucket_mb:g}MB/H{self.sync_period}"
