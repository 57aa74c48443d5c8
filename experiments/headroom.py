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

Before a scenario is built, :func:`switching_bound` bounds its ``h`` from cheaper runs: each
menu entry's time to target under each condition held fixed (``oracle-static`` on one
scenario per condition), at the worst mix of the conditions for a static entry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "HEADROOM_FACTOR",
    "Estimate",
    "SwitchingBound",
    "captured_fraction",
    "has_headroom",
    "headroom",
    "paired_difference",
    "switching_bound",
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


@dataclass(frozen=True)
class SwitchingBound:
    """An upper bound on a scenario's headroom from its per-condition times.

    Attributes:
        h: the bound on ``h = (T_static - T_adaptive) / T_static`` (a fraction).
        shares: condition -> its share of the training time inside a job (``per_job``:
            of the jobs) at which the bound is reached, or the shares given.
        static_entry: the fastest single entry at those shares.
        best_entries: condition -> its fastest entry.
        entries: the menu entries measured under every condition (the ones the bound
            compares), in the first condition's order.
        per_job: whether the conditions are drawn per job (else they alternate inside one).
    """

    h: float
    shares: dict[str, float]
    static_entry: str
    best_entries: dict[str, str]
    entries: tuple[str, ...]
    per_job: bool


def _check_times(times: Mapping[str, Mapping[str, float]]) -> tuple[list[str], list[str]]:
    conditions = list(times)
    if len(conditions) < 2:
        raise ValueError(f"a bound needs at least 2 conditions, got {conditions}")
    entries = [e for e in times[conditions[0]] if all(e in times[c] for c in conditions)]
    if not entries:
        listed = {c: sorted(times[c]) for c in conditions}
        raise ValueError(f"no menu entry was measured under every condition: {listed}")
    for c in conditions:
        for e in entries:
            t = times[c][e]
            if not (math.isfinite(t) and t > 0):
                raise ValueError(f"time to target of {e} under {c} must be > 0 s, got {t}")
    return conditions, entries


def _check_shares(shares: Mapping[str, float], conditions: list[str]) -> np.ndarray:
    if sorted(shares) != sorted(conditions):
        raise ValueError(
            f"shares must name exactly the conditions {conditions}, got {list(shares)}"
        )
    p = np.array([float(shares[c]) for c in conditions])
    if np.any(~np.isfinite(p)) or np.any(p < 0) or abs(p.sum() - 1.0) > 1e-6:
        raise ValueError(f"shares must be >= 0 and sum to 1, got {dict(shares)}")
    return p


def switching_bound(
    times: Mapping[str, Mapping[str, float]],
    *,
    shares: Mapping[str, float] | None = None,
    per_job: bool = False,
) -> SwitchingBound:
    """The most any schedule could gain over the best static entry, from per-condition times.

    ``times[c][e]`` is entry ``e``'s time to target (s) with condition ``c`` held for the
    whole job: ``oracle-static``'s mean over seeds, one run per condition. Two models:

    * conditions alternating inside a job (``per_job=False``; link schedules, straggler or
      cross-traffic phases): the conditions switch by the clock and hold for shares ``p_c``
      of the training time whatever is played; entry ``e`` makes progress at ``1 / T[c][e]``
      of the job per second under ``c``. A schedule switching for free at every change
      reaches the target at rate ``sum_c p_c max_e 1/T[c][e]``, the best static entry at
      ``max_e sum_c p_c / T[c][e]``; ``h = 1 - static rate / adaptive rate``.
    * conditions drawn once per job (``per_job=True``; profiles), with probabilities
      ``p_c``: ``T_static = min_e sum_c p_c T[c][e]``, ``T_adaptive = sum_c p_c min_e
      T[c][e]`` (the contextual oracle's).

    Without ``shares`` the mix that maximises ``h`` is found, a linear-fractional program
    solved as a linear one (Charnes & Cooper, 1962) with scipy's HiGHS. The within-job
    model assumes each condition's progress rate is the same at every stage of training and
    ignores the decision in flight at a switch, so it overstates what a real schedule can
    gain; a scenario needs a bound well above its target. Entries that missed the target
    on a seed enter at the budget (the ranking's convention), which overstates their speed.

    Args:
        times: condition -> menu entry -> time to target, s (> 0). Entries missing under
            some condition are left out.
        shares: condition -> share (>= 0, summing to 1) to evaluate at, instead of the
            worst mix.
        per_job: conditions drawn per job rather than alternating inside one.

    Returns:
        The :class:`SwitchingBound`.

    Raises:
        ValueError: fewer than 2 conditions, no entry measured under all of them, a time
            that is not a positive number, or shares that do not name exactly the
            conditions or do not sum to 1.
    """
    conditions, entries = _check_times(times)
    t = np.array([[float(times[c][e]) for e in entries] for c in conditions])  # (C, E)
    best = t.min(axis=1)
    if shares is not None:
        p = _check_shares(shares, conditions)
    else:
        from scipy.optimize import linprog

        n, m = len(conditions), len(entries)
        if per_job:
            # max s  s.t.  s <= q . T[:, e] for every e,  q . best = 1,  q >= 0
            a_ub = np.hstack([-t.T, np.ones((m, 1))])
            a_eq = np.append(best, 0.0)[None, :]
        else:
            # min t  s.t.  p . (1 / T[:, e]) <= t for every e,  p . (1 / best) = 1,  p >= 0
            a_ub = np.hstack([(1.0 / t).T, -np.ones((m, 1))])
            a_eq = np.append(1.0 / best, 0.0)[None, :]
        cost = np.append(np.zeros(n), -1.0 if per_job else 1.0)
        res = linprog(
            cost, A_ub=a_ub, b_ub=np.zeros(m), A_eq=a_eq, b_eq=[1.0],
            bounds=[(0, None)] * n + [(None, None)], method="highs",
        )  # fmt: skip
        if not res.success:  # pragma: no cover - the program is always feasible and bounded
            raise RuntimeError(f"headroom bound: linear program failed: {res.message}")
        p = np.clip(res.x[:n], 0.0, None)
        p = p / p.sum()
    if per_job:
        static_times = p @ t
        k = int(np.argmin(static_times))
        h = 1.0 - float(p @ best) / float(static_times[k])
    else:
        static_rates = p @ (1.0 / t)
        k = int(np.argmax(static_rates))
        h = 1.0 - float(static_rates[k]) / float(p @ (1.0 / best))
    return SwitchingBound(
        h=max(h, 0.0),
        shares={c: float(x) for c, x in zip(conditions, p, strict=True)},
        static_entry=entries[k],
        best_entries={c: entries[int(np.argmin(t[i]))] for i, c in enumerate(conditions)},
        entries=tuple(entries),
        per_job=per_job,
    )
