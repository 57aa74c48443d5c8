"""Model-predictive control over the simulator's factorised model: re-plan at every decision.

The model-based anchor of learned scheduling (Fugu's MPC over a learned transmission-time
predictor, DeCo-SGD's and AutoByte's speed models, then an argmax): instead of learning a
policy, the agent asks the calibrated model of ``commgym/Sim-v1``
(:class:`~commgym.env.sim.SimModel`: compute, codec and wire per link rate, learning
progress per entry from the current loss, what a switch costs) how long each menu entry
would take from *here* to the target, and plays the fastest. It reads what a table indexed
by the link cannot:

* the **link**, from the probe (``log10_probe_gbps``): the rate whose modelled probe time
  matches the measured one (a continuous estimate, so a rate never calibrated works too);
* the **remaining loss** (``eval_loss``): progress per decision depends on where training
  is, so the best entry changes as the target comes near;
* the **switch cost**: leaving a local-SGD period for period 1 averages the optimizer state,
  and every switch loses a fitted share of a decision's progress
  (:attr:`~commgym.env.sim.Calibration.switch_penalties`);
* the **remaining budget** (``elapsed_frac``): an entry that cannot reach the target in it
  ranks by the loss it would reach.

Receding horizon: the plan assumes the condition holds until the target and is redone at
the next decision with the next measurement. The probe measures the link the *previous*
decision ran on, so a switch since then is seen one decision late, and one decision of a
dense entry on a congested link can cost more than a whole phase. The agent therefore
**anticipates** from what the episode showed so far: each link's completed dwell times give
the probability ``p`` that the current one has ended by now (the share of its earlier dwells
shorter than the time it has lasted), and every entry is scored by
``(1 - p) T(entry | link stays) + p T(entry | the link before it is back)``. What it has
seen of the scenario's links before (``learn``: episodes played in the env it is given,
e.g. the training seeds in the simulator or a few real decisions; only the probe's
readings are kept) adds those dwells, and which link followed which, to the episode's
own, so the first cycle of an episode is anticipated too. Before the first probe it plays
the *safe* entry: the one whose worst time to target over the calibrated links is
smallest.

Decision time: each plan simulates at most ``max_decisions_ahead`` decisions per entry on
plain Python floats; it is reported by the tests (``plan_s``), not assumed.
"""

from __future__ import annotations

import bisect
import math
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from commgym.agents.base import StepAgent
from commgym.env.spaces import OBSERVATION_FIELDS, probe_gbps

__all__ = ["ModelPredictiveAgent"]

_FIELD = {f.name: i for i, f in enumerate(OBSERVATION_FIELDS)}

#: Candidate link rates of the probe's inversion, bit/s (log-spaced, 1 Mbit/s .. 100 Gbit/s).
RATE_GRID = tuple(float(r) for r in np.logspace(6, 11, 61))  # 12 per decade: 1e7, 1e10 on it


class ModelPredictiveAgent(StepAgent):
    """Receding-horizon planning over the calibrated simulator model (module docstring).

    Args:
        env: the commgym env it acts in (real or simulated; the menu and config must be the
            calibration's: :meth:`~commgym.env.sim.Calibration.check`).
        calibration: path of a ``commgym calibrate-sim`` record for this workload and menu.
        seed: unused (the agent is deterministic).
        max_decisions_ahead: the planning horizon in decisions (each entry's simulation
            stops there and ranks by the loss reached).

    Raises:
        ValueError: no calibration, one that does not fit the env's config, or a horizon
            below 1.
        FileNotFoundError: the calibration file does not exist.
    """

    name = "mpc"

    def __init__(
        self,
        env: gym.Env,
        *,
        calibration: str | None = None,
        seed: int | None = None,
        max_decisions_ahead: int = 400,
    ) -> None:
        if calibration is None:
            raise ValueError(
                "mpc plans over a calibrated simulator model: pass calibration=<path of a "
                "`commgym calibrate-sim` record> (baseline_kwargs: {mpc: {calibration: ...}})"
            )
        if (
            isinstance(max_decisions_ahead, bool)
            or not isinstance(max_decisions_ahead, int)
            or max_decisions_ahead < 1
        ):
            raise ValueError(
                f"max_decisions_ahead must be an integer >= 1, got {max_decisions_ahead!r}"
            )
        super().__init__(
            env, seed=seed, calibration=str(calibration), max_decisions_ahead=max_decisions_ahead
        )
        from commgym.env.sim import Calibration, SimModel

        path = Path(calibration)
        if not path.is_file():
            raise FileNotFoundError(f"no calibration record at {str(path)!r}")
        cal = Calibration.load(path)
        cfg = env.unwrapped.config
        cal.check(cfg)
        self.calibration = cal
        self.model = SimModel(cal, self.menu, cfg.steps_per_decision)
        self.horizon = int(max_decisions_ahead)
        self.budget_s = float(cfg.time_budget_s)
        self.target = float(cfg.target_loss if cfg.target_loss is not None else cal.target_loss)
        self.probe_bytes = int(cfg.probe_bytes)
        self.world_size = int(cfg.world_size)
        self._nvec = tuple(int(n) for n in self.menu.nvec)
        # the probe's modelled bus bandwidth per candidate rate (None: unshaped loopback)
        self._rates: list[float | None] = [None, *RATE_GRID]
        self._probe_log_gbps = [self._modelled_probe(r) for r in self._rates]
        recorded = sorted(cal.wire.links)
        self._fastest = float(recorded[-1]) if recorded else math.inf
        self._safe = self._safe_entry([None, *map(float, recorded)])
        #: what ``learn`` saw: link -> completed dwell lengths (s), and link -> the links
        #: that followed it (counts); plain values, saved with the policy
        self.prior_dwells: dict[str, list[float]] = {}
        self.prior_next: dict[str, dict[str, int]] = {}
        self._seen: dict[str, Any] | None = None
        #: wall seconds of the last plan (decision time, reported by tests and benches)
        self.plan_s = 0.0
        #: the link rate the last plan assumed, bit/s (None: unshaped)
        self.rate_bit_s: float | None = None

    # -- the model ------------------------------------------------------------------
    def _modelled_probe(self, rate: float | None) -> float:
        """log10 of the probe's bus bandwidth the model predicts at ``rate`` (0: no probe)."""
        if not self.probe_bytes:
            return 0.0
        seconds = self.model.probe_s(self.probe_bytes, rate)
        return math.log10(max(probe_gbps(self.probe_bytes, seconds, self.world_size), 1e-12))

    def rate_from_probe(self, log10_gbps: float) -> float | None:
        """The candidate rate whose modelled probe bandwidth is nearest the measured one.

        Above a few hundred Mbit/s the probe fits in the link's token-bucket burst and
        its time no longer depends on the rate: every such rate models the probe alike,
        and the fastest of them up to the fastest calibrated rate is taken (the probe says
        "at least this fast"; beyond the calibration the model only extrapolates).
        """
        gaps = [abs(p - log10_gbps) for p in self._probe_log_gbps]
        best = min(gaps)
        tied = [i for i, g in enumerate(gaps) if g <= best + 1e-3]  # 0.2 % in bandwidth
        shaped = [i for i in tied if self._rates[i] is not None]
        if not shaped:
            return None
        inside = [i for i in shaped if self._rates[i] <= self._fastest * (1 + 1e-9)]
        return self._rates[max(inside or [min(shaped)])]

    def plan(
        self, loss: float, now_s: float, prev: int, trace: list[tuple[float, float | None]]
    ) -> list[float]:
        """Every flat entry's modelled time to target from here, s, over a predicted trace.

        The rollout algorithm over the model (one-step lookahead on a base policy): entry
        ``k`` for the next decision, then, decision by decision, the base policy: the entry
        with the most progress per second at the current loss on the link in force.

        Args:
            loss: the held-out loss now, nats.
            now_s: the episode's training time now, s.
            prev: the flat entry played last (``-1``: none).
            trace: the predicted links, ``(start_s, rate)`` pairs in time order, the first
                at or before ``now_s`` (``rate`` None: unshaped).

        Returns:
            Per flat entry the time to target from ``now_s``; an entry that misses it within
            the budget or the horizon returns ``budget - now_s + the loss it reaches`` (at
            least the rest of the budget, ranked among misses by loss).
        """
        model, n = self.model, len(self.model.entries)
        base = {}
        for _, rate in trace:
            if rate not in base:
                timings = model.timings(rate)
                gain = [
                    (math.log(loss) - math.log(model.next_loss(k, loss))) / timings[k].train_s
                    for k in range(n)
                ]
                base[rate] = int(np.argmax(gain))
        starts = [t for t, _ in trace]
        out = []
        for k in range(n):
            t, cur, last = now_s, loss, prev
            reached = math.inf
            for i in range(self.horizon):
                rate = trace[max(bisect.bisect_right(starts, t) - 1, 0)][1]
                entry = k if i == 0 else base[rate]
                switched = last >= 0 and entry != last
                t += model.switch_s(last, entry, rate) if switched else 0.0
                t += model.timings(rate)[entry].train_s + model.probe_s(self.probe_bytes, rate)
                cur = model.next_loss(entry, cur, last)
                last = entry
                if cur <= self.target:
                    reached = t - now_s
                    break
                if t >= self.budget_s:
                    break
            # a miss takes at least what is left of the budget; ranked among misses by loss
            out.append(reached if math.isfinite(reached) else self.budget_s - now_s + cur)
        return out

    def _safe_entry(self, rates: list[float | None]) -> int:
        """The flat entry with the smallest worst-case time to target over ``rates``."""
        loss0 = self.model.progress.initial_loss
        worst = np.max([self.plan(loss0, 0.0, -1, [(0.0, r)]) for r in rates], axis=0)
        return int(np.argmin(worst))

    # -- StepAgent ------------------------------------------------------------------
    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        t0 = time.perf_counter()
        probe = float(obs[_FIELD["log10_probe_gbps"]])
        now = float(obs[_FIELD["elapsed_frac"]]) * self.budget_s
        if probe == 0.0 or now == 0.0:  # no measurement of the link yet
            self.plan_s = time.perf_counter() - t0
            return self._action(self._safe), state
        idx = [
            round(float(obs[_FIELD[f]]) * max(n - 1, 0))
            for f, n in zip(
                ("compression_index", "bucket_index", "period_index"), self._nvec, strict=True
            )
        ]
        prev = int(np.ravel_multi_index(tuple(idx), self._nvec))
        rate = self.rate_from_probe(probe)
        # the probe timed the link of the decision that started at the last decision point
        state = _observe_link(state, rate, state["now"] if state else 0.0)
        self.rate_bit_s = rate
        loss = float(obs[_FIELD["eval_loss"]])
        p, other = self._switch_probability(state, now)
        times = np.asarray(self.plan(loss, now, prev, self._trace(state, now, rate)))
        if p > 0:
            switched = self._trace(state, now, other)
            times = (1 - p) * times + p * np.asarray(self.plan(loss, now, prev, switched))
        k = int(np.argmin(times))
        self.plan_s = time.perf_counter() - t0
        return self._action(k), {**state, "now": now}

    def _action(self, k: int) -> np.ndarray:
        return np.array(np.unravel_index(k, self._nvec), dtype=np.int64)

    def _switch_probability(self, state: dict[str, Any], now_s: float) -> tuple[float, Any]:
        """P(the current link has ended by ``now_s``), and the link expected next.

        The empirical distribution of the current link's dwell lengths, this episode's
        completed ones with those ``learn`` saw: the share shorter than the time it has
        lasted, counting one more unseen, longer dwell (``k / (n + 1)``). The next link:
        the one before it in this episode, else the one that
        followed it most often before. ``(0, None)`` without a dwell or a next link.
        """
        key = state["rate"]
        past = [*state["dwells"].get(key, []), *self.prior_dwells.get(key, [])]
        before = state.get("before")
        if before is not None:
            other = before["value"]
        elif self.prior_next.get(key):
            follow = max(self.prior_next[key].items(), key=lambda kv: kv[1])[0]
            other = _rate_value(follow)
        else:
            return 0.0, None
        if not past:
            return 0.0, None
        lasted = now_s - state["since_s"]
        # one more, unseen dwell that lasts longer (the rule of succession): a few dwells,
        # measured to a decision's length, never make a switch certain
        return sum(d <= lasted for d in past) / (len(past) + 1), other

    def _dwell_s(self, state: dict[str, Any], key: str) -> float:
        """Mean dwell of link ``key`` (this episode's and learned ones; inf: never ended)."""
        past = [*state["dwells"].get(key, []), *self.prior_dwells.get(key, [])]
        return float(np.mean(past)) if past else math.inf

    def _next_key(self, state: dict[str, Any], key: str) -> str | None:
        """The link expected after ``key``: learned transitions, else this episode's other."""
        if self.prior_next.get(key):
            return max(self.prior_next[key].items(), key=lambda kv: kv[1])[0]
        before = state.get("before")
        if before is not None:
            return before["rate"] if key == state["rate"] else state["rate"]
        return None

    def _trace(
        self, state: dict[str, Any], now_s: float, rate: float | None
    ) -> list[tuple[float, float | None]]:
        """The predicted links from ``now_s`` with ``rate`` in force (mean dwells, alternating).

        The current link (``rate`` equal to the one seen) runs to the end of its mean dwell
        counted from when it was first seen; a link assumed to have just come runs a whole
        mean dwell; after it the expected next link, and so on up to the budget.
        """
        key = _rate_key(rate)
        # the link in force carries the next decision at least (the trace is read at each
        # decision's start), however long it has lasted already
        floor = math.nextafter(now_s, math.inf)
        end = state["since_s"] if key == state["rate"] else now_s
        trace: list[tuple[float, float | None]] = [(now_s, rate)]
        for _ in range(64):
            end = max(end + self._dwell_s(state, key), floor)
            nxt = self._next_key(state, key)
            if not math.isfinite(end) or end >= self.budget_s or nxt is None:
                break
            key = nxt
            trace.append((end, _rate_value(key)))
        return trace

    # -- learning what the links do -------------------------------------------------
    def _episode_start(self, obs: np.ndarray) -> None:
        self._seen = None

    def _observe(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: float,
        next_obs: np.ndarray,
        terminated: bool,
        truncated: bool,
        info: dict[str, Any],
    ) -> None:
        probe = float(next_obs[_FIELD["log10_probe_gbps"]])
        if probe == 0.0:
            return
        rate = self.rate_from_probe(probe)
        start = float(obs[_FIELD["elapsed_frac"]]) * self.budget_s
        seen = _observe_link(self._seen, rate, start)
        if self._seen is not None and seen["rate"] != self._seen["rate"]:
            done = self._seen["rate"]
            self.prior_dwells.setdefault(done, []).append(seen["dwells"][done][-1])
            nxt = self.prior_next.setdefault(done, {})
            nxt[seen["rate"]] = nxt.get(seen["rate"], 0) + 1
        self._seen = seen

    def _get_state(self) -> dict[str, Any]:
        return {"prior_dwells": self.prior_dwells, "prior_next": self.prior_next}

    def _set_state(self, state: dict[str, Any]) -> None:
        self.prior_dwells = {k: list(v) for k, v in state.get("prior_dwells", {}).items()}
        self.prior_next = {k: dict(v) for k, v in state.get("prior_next", {}).items()}


def _rate_key(rate: float | None) -> str:
    """A link's key in the history (``loopback`` or the rate, bit/s, 6 digits)."""
    return "loopback" if rate is None else f"{rate:.6g}"


def _rate_value(key: str) -> float | None:
    """Inverse of the link key of :func:`_observe_link`."""
    return None if key == "loopback" else float(key)


def _observe_link(state: Any, rate: float | None, start_s: float) -> dict[str, Any]:
    """The link history with ``rate`` seen on the decision that started at ``start_s``.

    ``state`` (None at an episode's start): ``rate`` and ``since_s`` of the current dwell,
    ``before`` (the rate of the dwell before it) and ``dwells`` (rate -> completed dwell
    lengths, s), plain values.
    """
    key = _rate_key(rate)
    if not state:
        return {"rate": key, "value": rate, "since_s": start_s, "before": None, "dwells": {}}
    if key == state["rate"]:
        return dict(state)
    dwells = {k: list(v) for k, v in state["dwells"].items()}
    dwells.setdefault(state["rate"], []).append(start_s - state["since_s"])
    before = {"rate": state["rate"], "value": state["value"]}
    return {"rate": key, "value": rate, "since_s": start_s, "before": before, "dwells": dwells}
