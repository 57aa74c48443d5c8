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
at loss ``L`` continues as ``e`` does from ``L``). A decision that *switches* entry moves it
forward by ``1 - switch_penalty`` only: the switch restarts error feedback's residuals and
PowerSGD's warm start and, from a local-SGD period, meets replicas that drifted apart
(:meth:`GradientSynchronizer.reconfigure`); ``switch_penalty`` is fitted from episodes that
switch at random (:func:`fit_switch_penalty`).

What it cannot model, it refuses: a loss below every curve's reach (the calibration's
target) raises at construction of the env.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["ProgressModel", "fit_switch_penalty"]

#: Levels of the position grid (log-loss), per entry.
GRID = 400
#: Decisions whose log-loss slope extends a curve that stopped early.
TAIL = 5


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


class ProgressModel:
    """Loss after a decision of each entry, from the measured curves (see the module docstring).

    Args:
        curves: entry -> list (one per calibration seed) of held-out losses, index 0 the
            reset's loss, index ``i`` after decision ``i``.
        switch_penalty: the share of a decision's progress a switch costs, in ``[0, 1)``.
        floor_loss: the lowest loss the model answers for (the calibration's target).

    Raises:
        ValueError: no curves, an empty curve, or a penalty outside ``[0, 1)``.
    """

    def __init__(
        self,
        curves: Mapping[str, Sequence[Sequence[float]]],
        switch_penalty: float = 0.0,
        floor_loss: float | None = None,
    ) -> None:
        if not curves or any(not c or any(len(x) < 2 for x in c) for c in curves.values()):
            raise ValueError("ProgressModel needs at least one curve of >= 2 losses per entry")
        if not 0.0 <= switch_penalty < 1.0:
            raise ValueError(f"switch_penalty must be in [0, 1), got {switch_penalty!r}")
        self.entries = list(curves)
        self.switch_penalty = float(switch_penalty)
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

    def position(self, entry: str, loss: float) -> float:
        """Decisions of ``entry`` from the reset to ``loss`` (fractional)."""
        lv = np.log(max(loss, 1e-8))
        # levels descend: interpolate on the reversed (ascending) axis
        return float(np.interp(-lv, -self._lv, self.pos[entry]))

    def loss_at(self, entry: str, position: float) -> float:
        """Held-out loss at ``position`` decisions along ``entry``'s curve."""
        return float(np.exp(np.interp(position, self.pos[entry], self._lv)))

    def step(self, entry: str, loss: float, switched: bool) -> float:
        """Held-out loss after one decision of ``entry`` from ``loss``.

        Args:
            entry: the menu entry played (``str(CommConfig)``).
            loss: held-out loss before the decision.
            switched: the decision changes the entry played before it.
        """
        adv = 1.0 - self.switch_penalty if switched else 1.0
        return self.loss_at(entry, self.position(entry, loss) + adv)

    def tables(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per entry ``(ascending -log-loss levels, positions)``: the env's fast look-up."""
        return {e: (-self._lv, self.pos[e]) for e in self.entries}


def fit_switch_penalty(
    curves: Mapping[str, Sequence[Sequence[float]]],
    episodes: Sequence[tuple[Sequence[str], Sequence[float]]],
    floor_loss: float | None = None,
    grid: Sequence[float] = tuple(np.linspace(0.0, 0.9, 19)),
) -> tuple[float, float]:
    """The switch penalty that best predicts episodes that switch entries.

    Args:
        curves: the static curves (as :class:`ProgressModel`).
        episodes: ``(entries played, losses)`` per episode: ``losses[0]`` the reset's,
            ``losses[i]`` after decision ``i`` (entry ``entries[i - 1]``).
        floor_loss: as :class:`ProgressModel`.
        grid: penalties tried.

    Returns:
        ``(penalty, RMS error of the predicted log-loss)`` over every decision of every
        episode (one-decision-ahead predictions from the measured loss).
    """
    best = (0.0, float("inf"))
    for p in grid:
        model = ProgressModel(curves, float(p), floor_loss)
        errs = []
        for entries, losses in episodes:
            prev = None
            for i, e in enumerate(entries):
                pred = model.step(e, losses[i], switched=prev is not None and e != prev)
                errs.append(np.log(pred) - np.log(max(losses[i + 1], 1e-8)))
                prev = e
        rms = float(np.sqrt(np.mean(np.square(errs)))) if errs else float("inf")
        if rms < best[1]:
            best = (float(p), rms)
    return best
