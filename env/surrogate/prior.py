"""The analytical prior: alpha-beta cost of ring all-reduce and all-gather, fitted per cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from commgym.collectives.spec import COMPRESSORS, CompressionSpec


# -- analytical prior -----------------------------------------------------------------
@dataclass(frozen=True)
class AlphaBeta:
    """Alpha-beta (latency-bandwidth) cost model of ring collectives (Hockney 1994).

    Attributes:
        alpha_s: per-message latency, seconds.
        beta_s_per_byte: inverse bandwidth, seconds per byte.
    """

    alpha_s: float = 0.0
    beta_s_per_byte: float = 0.0

    def allreduce_s(self, n_bytes: float, world_size: int) -> float:
        """Ring all-reduce: ``2(W-1) alpha + 2(W-1)/W n beta`` (Thakur et al. 2005)."""
        w = world_size
        return 2 * (w - 1) * self.alpha_s + 2 * (w - 1) / w * n_bytes * self.beta_s_per_byte

    def allgather_s(self, n_total_bytes: float, world_size: int) -> float:
        """Ring all-gather: ``(W-1) alpha + (W-1)/W n_total beta`` (Thakur et al. 2005)."""
        w = world_size
        return (w - 1) * self.alpha_s + (w - 1) / w * n_total_bytes * self.beta_s_per_byte

    @classmethod
    def fit(cls, samples: list[tuple[str, int, float, float]]) -> AlphaBeta:
        """Least-squares fit (non-negative) from ``(kind, world_size, bytes, seconds)``.

        Args:
            samples: ``kind`` is ``"allreduce"`` or ``"allgather"`` (bytes = gathered total).

        Raises:
            ValueError: no samples, or an unknown kind.
        """
        if not samples:
            raise ValueError("AlphaBeta.fit needs at least one timing sample")
        rows, ys = [], []
        for kind, w, n, t in samples:
            if kind == "allreduce":
                rows.append([2 * (w - 1), 2 * (w - 1) / w * n])
            elif kind == "allgather":
                rows.append([w - 1, (w - 1) / w * n])
            else:
                raise ValueError(f"unknown collective {kind!r}; valid: allreduce, allgather")
            ys.append(t)
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
