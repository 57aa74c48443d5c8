"""Headroom for adaptation and the share of it an agent captured, with paired intervals.

Per scenario, over the same evaluation seeds (mean time to target ``T``, a missed target
counting as the budget):

* ``T_static``: the best single menu entry in hindsight (``oracle-static``);
* ``T_adaptive``: the best schedule in hindsight over the scenario's phases or conditions
  (``oracle-adaptive``);
* headroom ``h = (T_static - T_adaptive) / T_static``: what adapting could gain at most
  (as far as the adaptive oracle finds it);
* captured fraction ``C = (T_static - T_agent) / (T_static - T_adaptive)``: 1 matches the
  adaptive oracle, 0 matches the best static entry, below 0 is slower than it.

Intervals are paired bootstrap percentile intervals over seeds (Efron & Tibshirani, "An
Introduction to the Bootstrap", 1993, ch. 13): seeds are resampled with replacement and
every quantity is recomputed from the *same* resampled seeds, so seed-to-seed variation
common to all agents (a hard seed is hard for everyone) cancels. With 3 seeds there are
only 10 distinct resamples, so the interval is coarse; it is what the data support.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "HEADROOM_FACTOR",
    "Estimate",
    "captured_fraction",
    "has_headroom",
    "headroom",
    "paired_difference",
]

#: A scenario is labelled "no headroom" when ``h`` is below this many times its interval's
#: half-width (its sign is not established by the seeds).
HEADROOM_FACTOR = 3.0

#: Bootstrap resamples (percentile interval).
N_BOOT = 10_000


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its 95 % paired-bootstrap percentile interval.

    Attributes:
        value: the estimate on all seeds (NaN when undefined).
        low: 2.5th percentile over resamples (``-inf``/``inf`` when some resamples are
            undefined or unbounded, e.g. ``C`` when a resample has no headroom).
        high: 97.5th percentile over resamples.
        n: number of seeds.
    """

    value: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        """Half the interval's width (``inf`` when unbounded, NaN for one seed)."""
        return (self.high - self.low) / 2

    def __str__(self) -> str:
        if not math.isfinite(self.value):
            return "-"
        if self.n < 2 or not (math.isfinite(self.low) and math.isfinite(self.high)):
            bounds = "" if self.n < 2 else " [unbounded]"
            return f"{self.value:.2f}{bounds}"
        return f"{self.value:.2f} [{self.low:.2f}, {self.high:.2f}]"


def _arrays(*series: Sequence[float]) -> list[np.ndarray]:
    arrays = [np.asarray(s, dtype=np.float64) for s in series]
    n = {len(a) for a in arrays}
    if len(n) != 1 or 0 in n:
        raise ValueError(
            f"paired estimates need equally long, non-empty per-seed series, got lengths "
            f"{[len(a) for a in arrays]}"
        )
    for a in arrays:
        if not np.all(np.isfinite(a)):
            raise ValueError(f"times to target must be finite (misses count as the budget): {a}")
    return arrays


def _boot(n: int, seed: int) -> np.ndarray:
    """``N_BOOT x n`` resampled seed indices (reproducible)."""
    return np.random.default_rng(seed).integers(0, n, size=(N_BOOT, n))


def _interval(point: float, samples: np.ndarray, n: int) -> Estimate:
    if n < 2:
        return Estimate(point, math.nan, math.nan, n)
    if not np.all(np.isfinite(samples)):
        finite = samples[np.isfinite(samples)]
        if finite.size < 0.975 * samples.size:  # too many undefined resamples
            return Estimate(point, -math.inf, math.inf, n)
        samples = finite
    low, high = np.percentile(samples, [2.5, 97.5])
    return Estimate(point, float(low), float(high), n)


def headroom(t_static: Sequence[float], t_adaptive: Sequence[float], *, seed: int = 0) -> Estimate:
    """``h = (T_static - T_adaptive) / T_static`` with its paired interval.

    Args:
        t_static: per seed, the best static entry's time to target (s; misses at budget).
        t_adaptive: per seed (same order), the adaptive oracle's time to target.
        seed: seed of the bootstrap's resampling.

    Returns:
        The :class:`Estimate` of ``h`` (a fraction; 0.2 = the adaptive oracle needs 20 %
        less training time).

    Raises:
        ValueError: series of different lengths, empty, or with non-finite times.
    """
    s, a = _arrays(t_static, t_adaptive)
    point = (s.mean() - a.mean()) / s.mean()
    idx = _boot(len(s), seed)
    ms, ma = s[idx].mean(axis=1), a[idx].mean(axis=1)
    return _interval(float(point), (ms - ma) / ms, len(s))


def captured_fraction(
    t_static: Sequence[float],
    t_adaptive: Sequence[float],
    t_agent: Sequence[float],
    *,
    seed: int = 0,
) -> Estimate:
    """``C = (T_static - T_agent) / (T_static - T_adaptive)`` with its paired interval.

    Undefined (NaN) when the oracles tie; resamples where they tie or invert make the
    interval unbounded when they are more than 2.5 % of all.

    Args:
        t_static: per seed, the best static entry's time to target (s).
        t_adaptive: per seed, the adaptive oracle's time to target (s).
        t_agent: per seed, the agent's time to target (s).
        seed: seed of the bootstrap's resampling.

    Raises:
        ValueError: as :func:`headroom`.
    """
    s, a, g = _arrays(t_static, t_adaptive, t_agent)
    gap = s.mean() - a.mean()
    point = (s.mean() - g.mean()) / gap if gap > 0 else math.nan
    idx = _boot(len(s), seed)
    ms, ma, mg = s[idx].mean(axis=1), a[idx].mean(axis=1), g[idx].mean(axis=1)
    gaps = ms - ma
    with np.errstate(divide="ignore", invalid="ignore"):
        samples = np.where(gaps > 0, (ms - mg) / gaps, np.nan)
    return _interval(float(point), samples, len(s))


def paired_difference(
    t_a: Sequence[float], t_b: Sequence[float], *, seed: int = 0
) -> tuple[Estimate, float]:
    """Mean of ``t_a - t_b`` over seeds, its paired interval and a two-sided p-value.

    The p-value is the paired t-test's (scipy's ``ttest_rel``); NaN for fewer than 2
    seeds or identical series.

    Returns:
        ``(estimate of the mean difference in s, p-value)``.
    """
    a, b = _arrays(t_a, t_b)
    d = a - b
    idx = _boot(len(d), seed)
    est = _interval(float(d.mean()), d[idx].mean(axis=1), len(d))
    if len(d) < 2 or np.all(d == d[0]):
        return est, math.nan
    from scipy.stats import ttest_rel

    return est, float(ttest_rel(a, b).pvalue)


def has_headroom(h: Estimate) -> bool:
    """Whether ``h`` is at least :data:`HEADROOM_FACTOR` times its interval's half-width."""
    return (
        h.n >= 2
        and math.isfinite(h.value)
        and math.isfinite(h.half_width)
        and h.value > 0
        and h.value >= HEADROOM_FACTOR * h.half_width
    )
