"""The analytical prior: alpha-beta cost of ring all-reduce and all-gather, fitted per cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from commgym.collectives.compressors import COMPRESSORS, CompressionSpec


# -- analytical prior -----------------------------------------------------------------
def _wire_s_per_byte(rate_bit_s: float | None) -> float:
    # a link of rate R carries a byte in 8 / R s at best; None: unshaped (no wire term)
    if rate_bit_s is None:
        return 0.0
    if not rate_bit_s > 0:
        raise ValueError(f"link rate must be > 0 bit/s (or None for unshaped), got {rate_bit_s!r}")
    return 8.0 / float(rate_bit_s)


@dataclass(frozen=True)
class AlphaBeta:
    """Alpha-beta (latency-bandwidth) cost model of ring collectives (Hockney 1994).

    The per-byte cost on a link of configured rate ``R`` bit/s is the host's own cost
    plus the wire's, ``beta + 8 / R`` (serial: gloo copies, then the link carries the
    byte), so the model scales with the configured rate and extrapolates to rates it was
    not fitted on. ``rate_bit_s=None`` is an unshaped link (loopback): ``beta`` alone.

    Attributes:
        alpha_s: per-message latency, seconds.
        beta_s_per_byte: the host's inverse bandwidth (without the shaped wire), s/byte.
    """

    alpha_s: float = 0.0
    beta_s_per_byte: float = 0.0

    def allreduce_s(
        self, n_bytes: float, world_size: int, rate_bit_s: float | None = None
    ) -> float:
        """Ring all-reduce: ``2(W-1) alpha + 2(W-1)/W n (beta + 8/R)`` (Thakur et al. 2005).

        Args:
            n_bytes: bytes of the reduced buffer (each rank's payload).
            world_size: ranks ``W``.
            rate_bit_s: configured link rate ``R`` (every rank's link), ``None`` unshaped.

        Raises:
            ValueError: ``rate_bit_s`` is not positive.
        """
        w = world_size
        beta = self.beta_s_per_byte + _wire_s_per_byte(rate_bit_s)
        return 2 * (w - 1) * self.alpha_s + 2 * (w - 1) / w * n_bytes * beta

    def allgather_s(
        self, n_total_bytes: float, world_size: int, rate_bit_s: float | None = None
    ) -> float:
        """Ring all-gather: ``(W-1) alpha + (W-1)/W n_total (beta + 8/R)`` (Thakur et al. 2005).

        Args:
            n_total_bytes: bytes gathered in total (``W`` times one rank's payload).
            world_size: ranks ``W``.
            rate_bit_s: configured link rate ``R``, ``None`` unshaped.

        Raises:
            ValueError: ``rate_bit_s`` is not positive.
        """
        w = world_size
        beta = self.beta_s_per_byte + _wire_s_per_byte(rate_bit_s)
        return (w - 1) * self.alpha_s + (w - 1) / w * n_total_bytes * beta

    def collective_s(
        self,
        compression: str,
        n_bytes: float,
        world_size: int,
        rate_bit_s: float | None = None,
    ) -> float:
        """Seconds to exchange one rank's ``n_bytes`` payload of ``compression``.

        The collective is the one the compressor class declares (``Compressor.summable``
        in ``COMPRESSORS``): summable payloads are all-reduced, the others all-gathered
        (``W * n_bytes`` gathered in total).

        Args:
            compression: a compression spec string (``"int8"``, ``"topk:0.01"``).
            n_bytes: one rank's payload bytes on the wire.
            world_size: ranks ``W``.
            rate_bit_s: configured link rate, ``None`` unshaped.

        Raises:
            ValueError: an unknown compression spec or a non-positive rate.
        """
        if _summable(compression):
            return self.allreduce_s(n_bytes, world_size, rate_bit_s)
        return self.allgather_s(n_bytes * world_size, world_size, rate_bit_s)

    @classmethod
    def fit(cls, samples: list[tuple[Any, ...]]) -> AlphaBeta:
        """Least-squares fit (non-negative) from ``(kind, world_size, bytes, seconds[, rate])``.

        Args:
            samples: ``kind`` is ``"allreduce"`` or ``"allgather"`` (bytes = gathered
                total); the optional fifth element is the link rate (bit/s, ``None``
                unshaped) the sample was timed at (:func:`bench_collectives` through
                ``commgym collect``). The wire time of that rate is subtracted first, so
                the fit is the host's own cost.

        Raises:
            ValueError: no samples, or an unknown kind.
        """
        if not samples:
            raise ValueError("AlphaBeta.fit needs at least one timing sample")
        rows, ys = [], []
        for sample in samples:
            kind, w, n, t = sample[:4]
            wire = _wire_s_per_byte(sample[4] if len(sample) > 4 else None)
            if kind == "allreduce":
                rows.append([2 * (w - 1), 2 * (w - 1) / w * n])
            elif kind == "allgather":
                rows.append([w - 1, (w - 1) / w * n])
            else:
                raise ValueError(f"unknown collective {kind!r}; valid: allreduce, allgather")
            ys.append(t - rows[-1][1] * wire)
        from scipy.optimize import nnls

        a = np.asarray(rows, dtype=np.float64)
        scale = a.max(axis=0)
        scale[scale == 0] = 1.0
        coef, _ = nnls(a / scale, np.asarray(ys, dtype=np.float64))
        coef = coef / scale
        return cls(float(coef[0]), float(coef[1]))


def bench_collectives(
    cluster: Any, sizes_bytes: list[int] | None = None, repeats: int = 5
) -> list[tuple[str, int, float, float]]:
    """Time all-reduce and all-gather on a running :class:`~commgym.env.Cluster`.

    Returns:
        ``(kind, world_size, bytes, median seconds)`` samples for :meth:`AlphaBeta.fit`.
    """
    sizes = sizes_bytes or [4 * 1024, 64 * 1024, 512 * 1024, 4 * 1024 * 1024]
    out = []
    for kind in ("allreduce", "allgather"):
        secs = cluster.command({"cmd": f"{kind}_bench", "sizes_bytes": sizes, "repeats": repeats})[
            0
        ]["seconds"]
        out.extend((kind, cluster.world_size, float(s), float(secs[str(int(s))])) for s in sizes)
    return out


def _summable(spec: str) -> bool:
    # the compressor class declares whether its payloads are all-reduced or all-gathered
    return COMPRESSORS[CompressionSpec.parse(spec).method].summable
