"""Learning progress per decision: each entry's measured loss curve, followed from any loss.

Progress does not depend on the link (the same iterations run, only slower), so it is
fitted from unshaped runs: for every menu entry, the held-out loss after each decision of
static episodes on the calibration seeds (:mod:`commgym.env.sim.calibration`). A curve is
read as "decisions of this entry needed to get from the initial loss down to level ``L``":
its *position* at ``L`` (the running minimum, interpolated linearly between decisions,
averaged over the calibration seeds; a seed that stopped above ``L`` is extended by the
log-loss slope of its last five decisions).

One decision of entry ``e`` at held-out loss ``L`` moves ``e``'s position at ``L`` forward
by one (the loss-level composition of learning curves: whatever played before, the model
at loss ``L`` continues as ``e`` does from ``L``). A decision that *switches* from entry
``p`` to ``e`` moves it forward by ``1 - penalty(p, e)`` only (negative: the loss rises):
the switch restarts error feedback's residuals and PowerSGD's warm start and, from a
local-SGD period, meets replicas that drifted apart
(:meth:`GradientSynchronizer.reconfigure`). Two forms of that cost, both fitted from
episodes that switch at random (:func:`fit_switch_penalties`), the calibration keeping the
one whose held-out episodes it predicts better:

* per pair of compressor families (:func:`switch_family`: dense, quantised, sparse,
  low-rank), charged to the switching decision alone, with a pooled value for pairs seen
  too rarely;
* per family *entered*, over two decisions (``switch_costs``: the switching decision
  loses ``c0``, the next one, if it stays on the entry, ``c1``): what restarts is the
  entered compressor's own state (an empty residual, a cold PowerSGD basis), and its cost
  spreads over the decision after the switch. Measured on flaky-link's workload
  (calibration of 2026-12-05, 8 random-switch episodes, 211 switches): entering a dense
  entry cost 0, top-k 0.09 + 1.20 decisions, PowerSGD 0.19 + 0.59; held out, this form's
  replay error was 0.048 against the pair form's 0.071 (static episodes: 0.036).

What it cannot model, it refuses: a loss below every curve's reach (the calibration's
target) raises at construction of the env.
"""

from __future__ import annotations

import bisect
import copy
import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["ProgressModel", "fit_switch_penalties", "switch_family", "switch_pair"]

#: Levels of the position grid (log-loss), per entry.
GRID = 400
#: Decisions whose log-loss slope extends a curve that stopped early.
TAIL = 5
#: Largest penalty a fit may return: a switch can set training back (loss rises) by at
#: most this many decisions' worth of progress less one.
MAX_PENALTY = 3.0
#: Compressor families by spec prefix: what a switch out of them loses (see the module).
_FAMILIES = (
    ("none", "dense"),
    ("fp16", "dense"),
    ("bf16", "dense"),
    ("int", "quantised"),
    ("topk", "sparse"),
    ("randomk", "sparse"),
    ("powersgd", "lowrank"),
)


@functools.cache  # menus are small; the fits ask millions of times
def switch_family(entry: str) -> str:
    """The compressor family of a menu entry (``str(CommConfig)``, e.g. ``topk:0.01/25MB/H1``).

    Raises:
        ValueError: a compression this table does not know.
    """
    spec = entry.split("/", 1)[0]
    for prefix, family in _FAMILIES:
        if spec.startswith(prefix):
            return family
    raise ValueError(
        f"no switch family for compression {spec!r} (entry {entry!r}); known prefixes: "
        f"{[p for p, _ in _FAMILIES]}"
    )


def switch_pair(prev: str, entry: str) -> str:
    """``"family->family"``: the key of a switch's penalty."""
    return f"{switch_family(prev)}->{switch_family(entry)}"


def _positions(curve: Sequence[float], levels: np.ndarray) -> np.ndarray:
    """Fractional decision index where ``curve`` (index 0: the reset) first reaches each level."""
    y = np.minimum.accumulate(np.log(np.maximum(np.asarray(curve, dtype=np.float64), 1e-8)))
    out = np.empty(len(levels))
    n = len(y)
    tail = min(TAIL, n - 1)
    slope = (y[-1] - y[-1 - tail]) / tail if tail > 0 else 0.0
    slope = min(slope, -1e-4)  # a flat tail still progresses (slowly), never backwards
    for j, lv in enumerate(levels):
        if lv >= y[0]:
            out[j] = 0.0
            continue
        k = int(np.argmax(y <= lv)) if (y <= lv).any() else -1
        if k < 0:
            out[j] = (n - 1) + (lv - y[-1]) / slope
            continue
        y0, y1 = y[k - 1], y[k]
        out[j] = (k - 1) + ((y0 - lv) / (y0 - y1) if y0 > y1 else 1.0)
    return out


def interp_scalar(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """``np.interp(x, xs, ys)`` for one scalar on plain lists, ~6x faster than numpy's call.

    Args:
        x: where to read.
        xs: non-decreasing abscissae (ties allowed: the last of them answers).
        ys: ordinates, ``len(ys) == len(xs)``.

    Returns:
        The linear interpolation, clamped to ``ys[0]`` / ``ys[-1]`` outside ``xs``.
    """
    i = bisect.bisect_right(xs, x)
    if i <= 0:
        return ys[0]
    if i >= len(xs):
        return ys[-1]
    x0, x1 = xs[i - 1], xs[i]
    if x1 <= x0:
        return ys[i]
    return ys[i - 1] + (x - x0) * (ys[i] - ys[i - 1]) / (x1 - x0)


class ProgressModel:
    """Loss after a decision of each entry, from the measured curves (see the module docstring).

    Args:
        curves: entry -> list (one per calibration seed) of held-out losses, index 0 the
            reset's loss, index ``i`` after decision ``i``.
        switch_penalty: the share of a decision's progress a switch costs when its pair
            has no own value, in ``[0, MAX_PENALTY)``.
        floor_loss: the lowest loss the model answers for (the calibration's target).
        switch_penalties: ``switch_pair`` key -> penalty, in ``[0, MAX_PENALTY)``.
        switch_costs: ``switch_family`` of the entry switched to -> ``(c0, c1)``: the
            progress the switching decision loses and the next one loses if it plays the
            same entry, each in ``[0, MAX_PENALTY)``. Given (non-empty), this form is the
            model's and ``switch_penalties`` is not read; a family it lacks costs
            ``(switch_penalty, 0)``.

    Raises:
        ValueError: no curves, an empty curve, or a penalty outside ``[0, MAX_PENALTY)``.
    """

    def __init__(
        self,
        curves: Mapping[str, Sequence[Sequence[float]]],
        switch_penalty: float = 0.0,
        floor_loss: float | None = None,
        switch_penalties: Mapping[str, float] | None = None,
        switch_costs: Mapping[str, Sequence[float]] | None = None,
    ) -> None:
        if not curves or any(not c or any(len(x) < 2 for x in c) for c in curves.values()):
            raise ValueError("ProgressModel needs at least one curve of >= 2 losses per entry")
        self.entries = list(curves)
        self._set_penalties(switch_penalty, switch_penalties, switch_costs)
        firsts = [np.log(c[0]) for cs in curves.values() for c in cs]
        self.initial_loss = float(np.exp(np.mean(firsts)))
        lows = [np.log(min(c)) for cs in curves.values() for c in cs]
        lo = float(np.log(floor_loss)) if floor_loss else float(min(lows))
        hi = float(max(firsts))
        self.floor_loss = float(np.exp(lo))
        # levels descend from the highest initial loss to a little below the floor
        self.levels = np.linspace(hi, lo - 0.05, GRID)
        self.pos = {
            e: np.mean([_positions(c, self.levels) for c in cs], axis=0) for e, cs in curves.items()
        }
        for e in self.entries:
            self.pos[e] = np.maximum.accumulate(self.pos[e])
        # the inverse tables (position -> level), one per entry: monotone in position
        self._lv = self.levels
        # the same tables as plain lists: the fits step the model millions of times, and one
        # scalar np.interp costs ~2 us against ~0.3 us for interp_scalar on lists
        self._neg_lv = (-self._lv).tolist()
        self._lv_list = self._lv.tolist()
        self._pos = {e: p.tolist() for e, p in self.pos.items()}

    def _set_penalties(
        self,
        pooled: float,
        pairs: Mapping[str, float] | None,
        costs: Mapping[str, Sequence[float]] | None = None,
    ) -> None:
        pens = {"pooled": pooled, **(pairs or {})}
        for fam, c in (costs or {}).items():
            if len(c) != 2:
                raise ValueError(f"switch costs must be (c0, c1) per family, got {fam!r}: {c!r}")
            pens.update({f"{fam}[0]": c[0], f"{fam}[1]": c[1]})
        bad = {k: v for k, v in pens.items() if not 0.0 <= v < MAX_PENALTY}
        if bad:
            raise ValueError(f"switch penalties must be in [0, {MAX_PENALTY}), got {bad!r}")
        self.switch_penalty = float(pooled)
        self.switch_penalties = {k: float(v) for k, v in (pairs or {}).items()}
        self.switch_costs = {k: (float(a), float(b)) for k, (a, b) in (costs or {}).items()}

    def with_penalties(
        self,
        switch_penalty: float,
        switch_penalties: Mapping[str, float] | None = None,
        switch_costs: Mapping[str, Sequence[float]] | None = None,
    ) -> ProgressModel:
        """The same curves with other switch penalties (the position tables are shared).

        Raises:
            ValueError: a penalty outside ``[0, MAX_PENALTY)``.
        """
        out = copy.copy(self)
        out._set_penalties(switch_penalty, switch_penalties, switch_costs)
        return out

    def penalty(self, prev: str | None, entry: str) -> float:
        """Progress (decisions) lost by playing ``entry`` after ``prev`` (0 when equal or None)."""
        if prev is None or prev == entry:
            return 0.0
        if self.switch_costs:
            return self.switch_costs.get(switch_family(entry), (self.switch_penalty, 0.0))[0]
        return self.switch_penalties.get(switch_pair(prev, entry), self.switch_penalty)

    def after_switch(self, entry: str) -> float:
        """Progress lost by the decision after a switch into ``entry`` that plays it again."""
        if not self.switch_costs:
            return 0.0
        return self.switch_costs.get(switch_family(entry), (0.0, 0.0))[1]

    def position(self, entry: str, loss: float) -> float:
        """Decisions of ``entry`` from the reset to ``loss`` (fractional)."""
        # levels descend: interpolate on the reversed (ascending) axis
        return interp_scalar(-math.log(max(loss, 1e-8)), self._neg_lv, self._pos[entry])

    def loss_at(self, entry: str, position: float) -> float:
        """Held-out loss at ``position`` decisions along ``entry``'s curve."""
        return math.exp(interp_scalar(position, self._pos[entry], self._lv_list))

    def step(self, entry: str, loss: float, prev: str | None = None, fresh: bool = False) -> float:
        """Held-out loss after one decision of ``entry`` from ``loss``.

        Args:
            entry: the menu entry played (``str(CommConfig)``).
            loss: held-out loss before the decision.
            prev: the entry played before it (None: the episode's first decision).
            fresh: the decision before this one switched (into ``prev``): playing
                ``prev`` again loses :meth:`after_switch`.
        """
        if fresh and prev == entry:
            adv = 1.0 - self.after_switch(entry)
        else:
            adv = 1.0 - self.penalty(prev, entry)
        return self.loss_at(entry, self.position(entry, loss) + adv)

    def tables(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per entry ``(ascending -log-loss levels, positions)``: the env's fast look-up."""
        return {e: (-self._lv, self.pos[e]) for e in self.entries}


#: Switches a pair needs before it gets its own penalty (else the pooled one).
MIN_PAIR_SWITCHES = 4


def _switch_advances(
    model: ProgressModel, episodes: Sequence[tuple[Sequence[str], Sequence[float]]]
) -> tuple[list[tuple[str, float]], list[float]]:
    """Measured progress of every decision: ``([(pair, advance) per switch], [advance per stay])``.

    The advance is how far the decision moved along its entry's curve (1: as a static
    episode of that entry would), read from the measured losses before and after it.
    """
    switches, stays = [], []
    for entries, losses in episodes:
        prev = None
        for i, e in enumerate(entries):
            lo, hi = max(losses[i + 1], 1e-8), max(losses[i], 1e-8)
            adv = model.position(e, lo) - model.position(e, hi)
            if prev is not None and e != prev:
                switches.append((switch_pair(prev, e), adv))
            elif prev is not None:
                stays.append(adv)
            prev = e
    return switches, stays


def fit_switch_penalties(
    curves: Mapping[str, Sequence[Sequence[float]]],
    episodes: Sequence[tuple[Sequence[str], Sequence[float]]],
    floor_loss: float | None = None,
    min_switches: int = MIN_PAIR_SWITCHES,
) -> dict[str, Any]:
    """Switch penalties per family pair from episodes that switch entries, and their check.

    Fitted open loop: the simulator replays each episode's entry sequence from its reset
    loss, and the penalties minimise the squared log-loss error along the episodes (what a
    policy's switches accumulate over an episode, which is what its time to target reads). A
    single pooled penalty is fitted first; then each pair with at least ``min_switches``
    switches gets its own, by coordinate search on a grid over ``[0, MAX_PENALTY)``, started
    from the median lost progress of its switches (``1 - advance`` along the entry's curve,
    :func:`_switch_advances`). One decision's measured loss is noisy enough that per-switch
    medians alone misprice switches whose cost spreads over the next decision (measured on
    PPO's real flaky-link episodes: the decision after a switch advanced 0.39 of a decision,
    the one after that 1.41, medians).

    The check is leave-one-episode-out (penalties fitted without the episode they predict):

    * open loop, the gate's figure: the simulator replays the episode's entry sequence from
      its reset loss, as it would play a policy; the error is the mean absolute log-loss
      difference along the episode, per-pair (``open_pairs``), pooled (``open_pooled``) and
      free (``open_zero``) switches. Its yardstick ``open_static`` is the same error on the
      static calibration episodes, each seed's curve predicted by the other seeds' (what the
      simulator gets wrong without any switch); NaN with a single seed. The same for the
      two-decision form per family entered (``open_entered``; the module docstring),
      fitted open loop too: ``(c0, c1)`` per family entered at least ``min_switches``
      times, from ``(pooled, pooled)``, by passes of three moves per family on the grid
      (``c1`` alone, ``c0`` alone, ``c0`` with ``c0 + c1`` held) until a pass changes
      nothing, then all of them at once by Powell's method. The form with the smaller
      held-out error is chosen on these same episodes, so the chosen form's figure is
      the better of two (slightly optimistic).
    * one decision ahead from the measured loss (``err_switch_pairs``,
      ``err_switch_pooled`` on switching decisions, ``err_stay`` on the others): per
      decision the loss's own noise is of the size of a switch's effect, so this one tells
      little; kept for comparison.

    Args:
        curves: the static curves (as :class:`ProgressModel`).
        episodes: ``(entries played, losses)`` per episode: ``losses[0]`` the reset's,
            ``losses[i]`` after decision ``i`` (entry ``entries[i - 1]``).
        floor_loss: as :class:`ProgressModel`.
        min_switches: switches a pair needs for its own penalty.

    Returns:
        ``penalty`` (pooled), ``penalties`` (pair -> value), ``costs`` (family entered
        -> ``[c0, c1]``, families entered at least ``min_switches`` times), ``model``
        (``"entered"`` where that form's held-out replay error ``open_entered`` is below
        the pair form's ``open_pairs``, else ``"pairs"``), ``open_model`` (the chosen
        form's error: the switch gate's figure), ``counts`` (pair -> switches),
        ``switches``, ``episodes`` and the check's medians over episodes (NaN where fewer
        than 2 episodes or seeds allow none).
    """
    base = ProgressModel(curves, 0.0, floor_loss)

    def sse(
        pooled: float,
        pairs: Mapping[str, float],
        eps: Sequence[tuple[Sequence[str], Sequence[float]]],
    ) -> float:
        m = base.with_penalties(pooled, pairs)
        return float(sum(_open_loop_error(m, e, ls, squared=True) for e, ls in eps))

    def fit(eps: Sequence[tuple[Sequence[str], Sequence[float]]]) -> tuple[float, dict, dict]:
        sw, _ = _switch_advances(base, eps)
        if not sw:
            return 0.0, {}, {}
        clip = lambda a: float(np.clip(1.0 - a, 0.0, MAX_PENALTY - 1e-6))  # noqa: E731
        by: dict[str, list[float]] = {}
        for pair, a in sw:
            by.setdefault(pair, []).append(a)
        # start: each pair's median lost progress, then refine open loop (what a policy's
        # episode accumulates): one pooled value first, then each pair in turn on the grid
        pens = {p: clip(float(np.median(v))) for p, v in by.items() if len(v) >= min_switches}
        pooled = _best_on_grid(lambda v: sse(v, {}, eps))
        for _ in range(_SWEEPS):
            for p in sorted(pens):
                pens[p] = _best_on_grid(
                    lambda v, p=p: sse(pooled, {**pens, p: v}, eps), start=pens[p]
                )
        return pooled, pens, {p: len(v) for p, v in sorted(by.items())}

    def fit_costs(
        eps: Sequence[tuple[Sequence[str], Sequence[float]]], pooled: float
    ) -> dict[str, tuple[float, float]]:
        # per family entered, (c0, c1): coordinate search on the grid, open loop as above
        entered: dict[str, int] = {}
        for entries, _ in eps:
            for a, b in itertools.pairwise(entries):
                if a != b:
                    entered[switch_family(b)] = entered.get(switch_family(b), 0) + 1
        costs = {f: [pooled, pooled] for f, n in sorted(entered.items()) if n >= min_switches}

        def cost_sse(f: str, c0: float, c1: float) -> float:
            if not (0.0 <= c0 < MAX_PENALTY and 0.0 <= c1 < MAX_PENALTY):
                return math.inf
            m = base.with_penalties(pooled, {}, {**costs, f: [c0, c1]})
            return float(sum(_open_loop_error(m, e, ls, squared=True) for e, ls in eps))

        for _ in range(_MAX_COST_SWEEPS):  # until a pass changes nothing
            before = {f: list(c) for f, c in costs.items()}
            for f in sorted(costs):
                # three moves: c1 alone, c0 alone, and c0 with c0 + c1 held: the data tell
                # a switch's total cost (a stay after it) apart from its split (a switch
                # after one decision) far better than either part, so the error's valley
                # runs along c0 + c1 = const, where moving one part alone stalls
                c0, c1 = costs[f]
                c1 = _best_on_grid(lambda v, f=f, c0=c0: cost_sse(f, c0, v), start=c1)
                c0 = _best_on_grid(lambda v, f=f, c1=c1: cost_sse(f, v, c1), start=c0)
                total = c0 + c1
                c0 = _best_on_grid(lambda v, f=f, t=total: cost_sse(f, v, t - v), start=c0)
                costs[f] = [c0, total - c0]
            if costs == before:
                break
        # then all parts at once (Powell's conjugate directions): the families' costs trade
        # against each other too (a switch from one family into another reads both)
        fams = sorted(costs)
        if fams:
            from scipy.optimize import minimize

            def joint(x: np.ndarray) -> float:
                x = np.clip(x, 0.0, MAX_PENALTY - 1e-6)  # Powell may step a hair outside
                trial = {f: [float(x[2 * i]), float(x[2 * i + 1])] for i, f in enumerate(fams)}
                m = base.with_penalties(pooled, {}, trial)
                return float(sum(_open_loop_error(m, e, ls, squared=True) for e, ls in eps))

            x0 = np.array([v for f in fams for v in costs[f]])
            res = minimize(
                joint, x0, method="Powell", bounds=[(0.0, MAX_PENALTY - 1e-6)] * len(x0),
                options={"xtol": 1e-3, "ftol": 1e-10},
            )  # fmt: skip
            if res.fun < joint(x0):
                x = np.clip(res.x, 0.0, MAX_PENALTY - 1e-6)
                costs = {f: [float(x[2 * i]), float(x[2 * i + 1])] for i, f in enumerate(fams)}
        return {f: (c[0], c[1]) for f, c in costs.items()}

    pooled, pens, counts = fit(episodes)
    costs = fit_costs(episodes, pooled)
    errs: dict[str, list[float]] = {k: [] for k in ("pairs", "pooled", "stay")}
    opens: dict[str, list[float]] = {k: [] for k in ("pairs", "entered", "pooled", "zero")}
    if len(episodes) >= 2:
        for j, (entries, losses) in enumerate(episodes):
            rest = [ep for i, ep in enumerate(episodes) if i != j]
            p_j, pens_j, _ = fit(rest)
            models = {
                "pairs": base.with_penalties(p_j, pens_j),
                "entered": base.with_penalties(p_j, {}, fit_costs(rest, p_j)),
                "pooled": base.with_penalties(p_j),
                "zero": base,
            }
            prev = None
            for i, e in enumerate(entries):
                real = np.log(max(losses[i + 1], 1e-8))
                pair_step = np.log(models["pairs"].step(e, losses[i], prev))
                if prev is not None and e != prev:
                    errs["pairs"].append(abs(pair_step - real))
                    pooled_step = np.log(models["pooled"].step(e, losses[i], prev))
                    errs["pooled"].append(abs(pooled_step - real))
                elif prev is not None:
                    errs["stay"].append(abs(pair_step - real))
                prev = e
            for name, m in models.items():
                opens[name].append(_open_loop_error(m, entries, losses))

    def med(v: list[float]) -> float:
        return float(np.median(v)) if v else float("nan")

    open_pairs, open_entered = med(opens["pairs"]), med(opens["entered"])
    # the form that predicts the held-out episodes better is the calibration's
    entered_wins = bool(costs) and open_entered < open_pairs
    return {
        "penalty": pooled,
        "penalties": pens,
        "costs": {f: list(c) for f, c in costs.items()},
        "model": "entered" if entered_wins else "pairs",
        "open_model": open_entered if entered_wins else open_pairs,
        "counts": counts,
        "switches": int(sum(counts.values())),
        "episodes": len(episodes),
        "open_pairs": open_pairs,
        "open_entered": open_entered,
        "open_pooled": med(opens["pooled"]),
        "open_zero": med(opens["zero"]),
        "open_static": _static_open_loop_error(curves, floor_loss),
        "err_switch_pairs": med(errs["pairs"]),
        "err_switch_pooled": med(errs["pooled"]),
        "err_stay": med(errs["stay"]),
    }


#: Penalties tried by the open-loop fit, and its passes over the pairs.
_GRID = tuple(float(v) for v in np.linspace(0.0, MAX_PENALTY - 0.1, 30))
_SWEEPS = 2
#: At most this many passes of the two-decision fit (it stops at the first that changes nothing).
_MAX_COST_SWEEPS = 8


def _best_on_grid(cost: Any, start: float | None = None) -> float:
    """The grid value (or ``start``) of least ``cost(value)``."""
    cands = list(_GRID) + ([start] if start is not None else [])
    costs = [cost(v) for v in cands]
    return float(cands[int(np.argmin(costs))])


def _open_loop_error(
    model: ProgressModel, entries: Sequence[str], losses: Sequence[float], squared: bool = False
) -> float:
    """Mean |log-loss error| of ``model`` replaying ``entries`` from ``losses[0]``.

    ``squared``: the sum of squared errors instead (the fit's objective).
    """
    loss, prev, fresh, err = float(losses[0]), None, False, []
    for i, e in enumerate(entries):
        loss = model.step(e, loss, prev, fresh)
        fresh, prev = prev is not None and e != prev, e
        if losses[i + 1] < model.floor_loss:  # below the model's floor it answers nothing
            break
        err.append(abs(math.log(loss) - math.log(max(losses[i + 1], 1e-8))))
    if squared:
        return math.fsum(e * e for e in err)
    return math.fsum(err) / len(err) if err else float("nan")


def _static_open_loop_error(
    curves: Mapping[str, Sequence[Sequence[float]]], floor_loss: float | None
) -> float:
    """Median over entries and seeds of each seed's curve predicted by the other seeds'."""
    out = []
    for e, cs in curves.items():
        if len(cs) < 2:
            continue
        for j, c in enumerate(cs):
            others = {k: ([x for i, x in enumerate(v) if i != j] if k == e else v)
                      for k, v in curves.items()}  # fmt: skip
            m = ProgressModel({e: others[e]}, 0.0, floor_loss)
            out.append(_open_loop_error(m, [e] * (len(c) - 1), c))
    out = [x for x in out if np.isfinite(x)]
    return float(np.median(out)) if out else float("nan")
