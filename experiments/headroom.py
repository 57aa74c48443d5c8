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

Intervals are paired jackknife t-intervals over seeds (Tukey, 1958; Efron & Tibshirani,
"An Introduction to the Bootstrap", 1993, ch. 11): every quantity is recomputed with each seed
left out, from the *same* remaining seeds for every agent, so seed-to-seed variation common
to all agents (a hard seed is hard for everyone) cancels; the pseudo-values' mean and standard
error give a Student-t interval with ``n - 1`` degrees of freedom. For a mean (a paired
difference) this is exactly the paired t-interval. Percentile bootstrap intervals were used
before: on 3-5 seeds they under-cover (about 75 % at n = 3 and 85 % at n = 5 for a nominal
95 %), the t-interval widens with few seeds as it should.

A scenario has headroom when ``h`` is at least :data:`HEADROOM_FACTOR` times its interval's
half-width, i.e. ``h >= 3 t(0.975, n-1) SE(h)``; :func:`seeds_needed` says how many seeds
the same per-seed spread would need when it is not met.

Before a scenario is built, :func:`switching_bound` bounds its ``h`` from cheaper runs: each
menu entry's time to target under each condition held fixed (``oracle-static`` on one
scenario per condition), at the worst mix of the conditions for a static entry.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "HEADROOM_FACTOR",
    "LEVEL",
    "Estimate",
    "SwitchingBound",
    "captured_fraction",
    "decision_times",
    "has_headroom",
    "headroom",
    "jackknife",
    "paired_difference",
    "seeds_needed",
    "switching_bound",
    "t_critical",
]

#: A scenario is labelled "no headroom" when ``h`` is below this many times its interval's
#: half-width (its sign is not established by the seeds): ``h >= 3 t(0.975, n-1) SE(h)``.
HEADROOM_FACTOR = 3.0

#: Two-sided confidence level of every interval.
LEVEL = 0.95


def t_critical(n: int) -> float:
    """Student-t quantile of the 95 % two-sided interval with ``n - 1`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.5 + LEVEL / 2, n - 1))


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its 95 % paired jackknife t-interval.

    Attributes:
        value: the estimate on all seeds (NaN when undefined).
        low: lower end (``-inf`` when a leave-one-out estimate is undefined, e.g. ``C``
            when the oracles tie without one seed).
        high: upper end (``inf`` likewise).
        n: number of seeds.
        se: the jackknife standard error (NaN for one seed, ``inf`` when undefined).
    """

    value: float
    low: float
    high: float
    n: int
    se: float = math.nan

    @property
    def half_width(self) -> float:
        """Half the interval's width (``inf`` when unbounded, NaN for one seed)."""
        return (self.high - self.low) / 2

    @property
    def z(self) -> float:
        """The estimate in standard errors (``value / se``; NaN when undefined)."""
        if not (math.isfinite(self.value) and math.isfinite(self.se)) or self.se <= 0:
            return math.nan
        return self.value / self.se

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


def jackknife(stat: Callable[..., float], *arrays: np.ndarray) -> Estimate:
    """``stat`` over paired per-seed series with its jackknife t-interval.

    Args:
        stat: a function of the series' means-based quantities, ``stat(*arrays) -> float``
            (NaN when undefined).
        *arrays: per-seed series of equal length ``n``, in the same seed order.

    Returns:
        The :class:`Estimate`: ``stat`` on all seeds; pseudo-values ``n s - (n-1) s_(-i)``
        give the standard error and ``t(0.975, n-1)`` the interval. Unbounded when a
        leave-one-out value is undefined; no interval for one seed.
    """
    n = len(arrays[0])
    point = float(stat(*arrays))
    if n < 2:
        return Estimate(point, math.nan, math.nan, n)
    keep = ~np.eye(n, dtype=bool)
    loo = np.array([float(stat(*(a[keep[i]] for a in arrays))) for i in range(n)])
    if not (math.isfinite(point) and np.all(np.isfinite(loo))):
        return Estimate(point, -math.inf, math.inf, n, math.inf)
    pseudo = n * point - (n - 1) * loo
    se = float(pseudo.std(ddof=1) / math.sqrt(n))
    half = t_critical(n) * se
    return Estimate(point, point - half, point + half, n, se)


def _h(s: np.ndarray, a: np.ndarray) -> float:
    return float((s.mean() - a.mean()) / s.mean())


def _c(s: np.ndarray, a: np.ndarray, g: np.ndarray) -> float:
    gap = s.mean() - a.mean()
    return float((s.mean() - g.mean()) / gap) if gap > 0 else math.nan


def headroom(t_static: Sequence[float], t_adaptive: Sequence[float]) -> Estimate:
    """``h = (T_static - T_adaptive) / T_static`` with its paired t-interval.

    Args:
        t_static: per seed, the best static entry's time to target (s; misses at budget).
        t_adaptive: per seed (same order), the adaptive oracle's time to target.

    Returns:
        The :class:`Estimate` of ``h`` (a fraction; 0.2 = the adaptive oracle needs 20 %
        less training time).

    Raises:
        ValueError: series of different lengths, empty, or with non-finite times.
    """
    return jackknife(_h, *_arrays(t_static, t_adaptive))


def captured_fraction(
    t_static: Sequence[float], t_adaptive: Sequence[float], t_agent: Sequence[float]
) -> Estimate:
    """``C = (T_static - T_agent) / (T_static - T_adaptive)`` with its paired t-interval.

    Undefined (NaN) when the oracles tie or invert; the interval is unbounded when they
    do so with any one seed left out.

    Args:
        t_static: per seed, the best static entry's time to target (s).
        t_adaptive: per seed, the adaptive oracle's time to target (s).
        t_agent: per seed, the agent's time to target (s).

    Raises:
        ValueError: as :func:`headroom`.
    """
    return jackknife(_c, *_arrays(t_static, t_adaptive, t_agent))


def paired_difference(t_a: Sequence[float], t_b: Sequence[float]) -> tuple[Estimate, float]:
    """Mean of ``t_a - t_b`` over seeds, its paired t-interval and two-sided p-value.

    The p-value is the paired t-test's (scipy's ``ttest_rel``), the test the interval
    inverts; NaN for fewer than 2 seeds or identical differences.

    Returns:
        ``(estimate of the mean difference in s, p-value)``.
    """
    a, b = _arrays(t_a, t_b)
    d = a - b
    est = jackknife(lambda x: float(x.mean()), d)
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


def seeds_needed(h: Estimate, *, at_most: int = 1000) -> int | None:
    """Seeds the headroom rule would need if the per-seed spread stayed as measured.

    The standard error shrinks as ``1/sqrt(n)``: the smallest ``m`` with
    ``h >= HEADROOM_FACTOR t(0.975, m-1) SE sqrt(n / m)``.

    Returns:
        ``m`` (``h.n`` or fewer when the rule already holds); ``None`` when ``h <= 0``, it
        is undefined, or more than ``at_most`` seeds would be needed.
    """
    if h.n < 2 or not (math.isfinite(h.value) and math.isfinite(h.se)) or h.value <= 0:
        return None
    sd = h.se * math.sqrt(h.n)
    for m in range(2, at_most + 1):
        if h.value >= HEADROOM_FACTOR * t_critical(m) * sd / math.sqrt(m):
            return m
    return None


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


def decision_times(folder: str | os.PathLike[str], budget_s: float) -> dict[str, dict[int, float]]:
    """Time to target per player and seed from an evaluation's decision CSVs.

    Reads every ``decisions-<player>-seed<N>.csv`` in ``folder`` (what ``train``,
    ``evaluate`` and the leaderboard write, one per player and evaluation seed): the
    episode's training time at its last decision where that decision reached the target
    (``reason == "target_reached"``), else ``budget_s`` (a miss counts as the budget, as
    the tables do in h and C). The records' analysis scripts read their runs with it.

    Args:
        folder: a folder of decision CSVs (a record, or its scenario's sub-folder).
        budget_s: the scenario's ``time_budget_s``, s.

    Returns:
        ``{player: {seed: seconds}}``; player names as in the file names (e.g.
        ``ppo_learned``, ``oracle_re-run_topk_0.01_25MB_H1``).
    """
    import csv
    import re
    from pathlib import Path

    times: dict[str, dict[int, float]] = {}
    for path in sorted(Path(folder).glob("decisions-*-seed*.csv")):
        m = re.fullmatch(r"decisions-(.+)-seed(\d+)\.csv", path.name)
        if m is None:
            continue
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            continue
        last = rows[-1]
        reached = last.get("reason") == "target_reached"
        t = float(last["train_time_s"]) if reached else float(budget_s)
        times.setdefault(m.group(1), {})[int(m.group(2))] = t
    return times
