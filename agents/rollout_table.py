"""A learned condition -> configuration table, from rollouts on training episodes.

The learned counterpart of ``oracle-adaptive``: the same rollout algorithm (Bertsekas,
"Rollout Algorithms for Discrete Optimization", 2013) runs on *training* seeds (never the
evaluation seeds), and what it found is distilled into a policy that needs no hindsight:

1. ``oracle-static`` on the training seeds gives the base entry;
2. ``oracle-adaptive`` on the training seeds gives, phase by phase, the entry that reached
   the target first when followed by the base (or, for conditions drawn per episode, the
   best entry per condition);
3. the policy is a table: for each condition (link rate and straggler jitter, as labelled
   in ``info["condition"]``) the entry that won most often there;
4. at run time the condition is recognised from the observation alone: the nearest class
   centre, over every decision the search made, of the condition fields
   (``log10_probe_gbps``: the probe all-reduce, measured whatever configuration ran;
   ``log10_link_gbps``/``straggler_ms`` when the env reveals them, ``privileged_obs``);
5. switches are anticipated (``anticipate``): the searches also time how long each
   condition lasted (the shortest run seen, timed from decisions no longer than
   ``resolution_s``: :func:`condition_runs`) and what a decision of each entry costs under
   each condition (the median). Once the time spent in the current condition plus one
   decision of its entry could outlast that shortest run, the policy plays the *safe*
   entry instead: the table entry whose dearest decision over the conditions is cheapest,
   where the entry in force risks more than twice that (e.g. PowerSGD near the end of a
   fast phase, because a dense decision that meets the slow link costs ~50x more). A
   reactive table cannot do this: it learns of a switch only from the probe at the end of
   the decision that met it. Conditions drawn once per episode have no timed run, so
   nothing is anticipated there; but the first decision, which no probe precedes, plays
   the safe entry when training episodes opened under different conditions and the
   entry that opened most of them risks more than twice the safe one (a dense decision
   on a job that drew the slow link).

One approximate policy-iteration step with a tabular policy over observed conditions:
it adapts exactly as far as the conditions are observable and the winners consistent
across training seeds. Its cost is the two searches on the training seeds.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from commgym.agents.base import LearnCallback, Preparation, StepAgent
from commgym.agents.baselines import StaticAgent
from commgym.agents.oracle import FIRST_TRAINING_SEED, OracleStaticAgent, training_seeds
from commgym.agents.oracle_adaptive import OracleAdaptiveAgent
from commgym.collectives.checks import check_int
from commgym.env.measure import measurement_from_info
from commgym.env.spaces import OBSERVATION_FIELDS

__all__ = [
    "CONDITION_FIELDS",
    "FIRST_TRAINING_SEED",
    "RolloutTableAgent",
    "condition_runs",
    "training_seeds",
]

#: The observation fields a condition is recognised from.
CONDITION_FIELDS = ("log10_probe_gbps", "log10_link_gbps", "straggler_ms")
_IDX = [[f.name for f in OBSERVATION_FIELDS].index(n) for n in CONDITION_FIELDS]
_ELAPSED = [f.name for f in OBSERVATION_FIELDS].index("elapsed_frac")
#: the safe entry replaces one only if that one's dearest decision is this many times dearer
_RISK_RATIO = 2.0


def condition_runs(
    decisions: Sequence[tuple[float, float, str]], resolution_s: float
) -> dict[str, float]:
    """The shortest time each condition was seen to last, s.

    A run of decisions under one condition is timed from the start of its first decision
    to the start of the first decision under the next condition (from 0 s for a run that
    opens its timeline). The switches themselves happened inside the decision before each
    of those starts, so a run counts only if those two decisions, and every decision of the
    run, are at most ``resolution_s`` long: each end is then within ``resolution_s`` of the
    truth, and no switch and switch back hides inside one long decision.

    Args:
        decisions: ``(start_s, duration_s, condition)`` per decision, in the order played;
            a start before the previous decision's end (a reset, or a fork restored to an
            earlier time) begins a new timeline. ``condition`` is the one in force when the
            decision started (``info["condition"]``).
        resolution_s: the longest decision that may bracket or belong to a timed run, s.

    Returns:
        condition -> its shortest timed run. A run still going when its timeline ends, or
        one that a timeline opens after 0 s (a fork), is not timed; conditions without a
        timed run are absent.
    """
    shortest: dict[str, float] = {}

    def close(tl: list[tuple[float, float, str]]) -> None:
        i = 0
        while i < len(tl):
            j = i
            while j + 1 < len(tl) and tl[j + 1][2] == tl[i][2]:
                j += 1
            if j + 1 < len(tl):  # the run ended inside this timeline
                opened = (i == 0 and tl[0][0] <= 1e-9) or (i > 0 and tl[i - 1][1] <= resolution_s)
                sharp = all(d <= resolution_s for _, d, _ in tl[i : j + 1])
                if opened and sharp:
                    length = tl[j + 1][0] - (0.0 if i == 0 else tl[i][0])
                    c = tl[i][2]
                    shortest[c] = min(shortest.get(c, math.inf), length)
            i = j + 1

    timeline: list[tuple[float, float, str]] = []
    for start, duration, cond in decisions:
        if timeline and start < timeline[-1][0] + timeline[-1][1] - 1e-6:
            close(timeline)
            timeline = []
        timeline.append((float(start), float(duration), str(cond)))
    close(timeline)
    return shortest


class RolloutTableAgent(StepAgent):
    """Learned table condition -> menu entry (see the module docstring).

    Args:
        env: the real commgym env (the searches fork its episodes).
        seed: picks the training seeds (:func:`training_seeds`).
        episodes: training seeds searched (>= 1).
        entries: candidate entries (default: the whole menu).
        anticipate: play the safe entry when the condition may end within the next
            decision (step 5 of the module docstring); False: the reactive table.
        resolution_s: longest decision used to time the conditions, s (> 0).

    Raises:
        ValueError: ``episodes`` < 1, or ``resolution_s`` not > 0.
        TypeError: the env cannot fork episodes (as ``oracle-adaptive``).
    """

    name = "rollout-table"
    learned = True
    needs_real_env = True
    searches_when_learning = True

    @property
    def preparation(self) -> Preparation:
        """What preparing it cost: its learning's wall time and decisions."""
        return Preparation(self.cost_s, int(self.cost_decisions))

    def __init__(
        self,
        env: gym.Env,
        *,
        seed: int | None = None,
        episodes: int = 3,
        entries: Sequence[str] | None = None,
        anticipate: bool = True,
        resolution_s: float = 1.0,
    ) -> None:
        check_int("episodes", episodes, 1)
        if (
            isinstance(resolution_s, bool)
            or not isinstance(resolution_s, int | float)
            or not resolution_s > 0
        ):
            raise ValueError(f"resolution_s must be a number > 0, got {resolution_s!r}")
        super().__init__(
            env,
            seed=seed,
            episodes=episodes,
            entries=None if entries is None else list(entries),
            anticipate=bool(anticipate),
            resolution_s=float(resolution_s),
        )
        self.episodes = episodes
        self.entries = None if entries is None else list(entries)
        self.anticipate = bool(anticipate)
        self.resolution_s = float(resolution_s)
        #: condition -> the shortest time it was seen to last in training, s
        self.dwell_s: dict[str, float] = {}
        #: entry -> condition -> median seconds of one decision of it there
        self.decision_s: dict[str, dict[str, float]] = {}
        #: the table entry whose dearest decision over the conditions is cheapest
        self.safe: str | None = None
        #: condition -> the entry played there
        self.table: dict[str, str] = {}
        #: the entry of the first decision (the reset observation shows no condition): the
        #: one that opened most training schedules, or the safe entry where training
        #: episodes opened under different conditions and that one is risky (``_risky``)
        self.first: str | None = None
        #: condition -> centre of its observed condition fields (standardised)
        self.centres: dict[str, list[float]] = {}
        self.scale: list[float] = [1.0] * len(CONDITION_FIELDS)
        #: wall time and real decisions the two searches cost
        self.cost_s: float | None = None
        self.cost_decisions = 0
        self._actions: dict[str, np.ndarray] = {}

    def learn(
        self,
        total_timesteps: int | None = None,
        progress_bar: bool = False,
        callback: LearnCallback | None = None,
    ) -> RolloutTableAgent:
        """Search the training seeds and build the table (see the module docstring).

        Args:
            total_timesteps: unused (the searches are complete); None or any int is
                accepted so tuning loops can call it like any learner.
            progress_bar: progress bars over the searches.
            callback: ``callback(step) -> bool`` after every decision of the searches.

        Returns:
            self.
        """
        env = self._require_env()
        seeds = training_seeds(self.seed, self.episodes)
        t0 = time.perf_counter()
        features: list[tuple[str, list[float]]] = []
        timed: list[tuple[float, float, str]] = []
        played: list[tuple[str, str, float]] = []

        def on_step(step: dict[str, Any]) -> bool | None:
            info = step["info"]
            cond = info.get("condition")
            measured = measurement_from_info(info)
            if cond is not None:
                obs = np.asarray(step["obs"], dtype=np.float64)
                features.append((cond, [float(obs[i]) for i in _IDX]))
                if measured is not None:
                    d = float(measured.train_time_s)
                    timed.append((float(info["train_time_s"]) - d, d, cond))
                    played.append((str(info.get("config")), cond, d))
            return None if callback is None else callback(step)

        # the table classifies conditions by the probe it reads when it plays, so its
        # searches run the probe too (the oracles' own searches run without)
        probe = bool(self.reads_probe)
        static = OracleStaticAgent(env, seeds=seeds, entries=self.entries, probe=probe)
        static.learn(progress_bar=progress_bar, callback=on_step)
        oracle = OracleAdaptiveAgent(
            env, seeds=seeds, entries=self.entries, static=static, probe=probe
        )
        oracle.learn(progress_bar=progress_bar, callback=on_step)
        self.cost_s = time.perf_counter() - t0
        self.cost_decisions = static.search_decisions + oracle.search_decisions
        wins: dict[str, Counter[str]] = {}
        firsts: Counter[str] = Counter()
        opening: set[str] = set()
        for sched in oracle.schedules.values():
            firsts[sched.phases[0].entry] += 1
            opening.add(sched.phases[0].condition)
            for phase in sched.phases:
                wins.setdefault(phase.condition, Counter())[phase.entry] += 1
        order = [row.config for row in static.ranking]  # ties: the static ranking's order
        pick = lambda c: max(c, key=lambda e: (c[e], -order.index(e)))  # noqa: E731
        self.table = {cond: pick(c) for cond, c in wins.items()}
        self.first = pick(firsts)
        self._fit_centres(features)
        self._fit_switches(timed, played)
        if len(opening) > 1 and self._risky(self.first):
            # the reset observation shows no condition, and training episodes opened under
            # more than one: the first decision may meet any of them
            self.first = self.safe
        self._cache_actions()
        return self

    def _fit_switches(
        self, timed: list[tuple[float, float, str]], played: list[tuple[str, str, float]]
    ) -> None:
        """How long conditions last and what each table entry's decision costs in each."""
        self.dwell_s = condition_runs(timed, self.resolution_s)
        costs: dict[str, dict[str, list[float]]] = {}
        for entry, cond, d in played:
            costs.setdefault(entry, {}).setdefault(cond, []).append(d)
        self.decision_s = {
            e: {c: float(np.median(v)) for c, v in by.items()} for e, by in costs.items()
        }
        worst = {e: self._dearest(e) for e in set(self.table.values())}
        worst = {e: w for e, w in worst.items() if math.isfinite(w)}
        self.safe = min(worst, key=lambda e: (worst[e], e)) if worst else None

    def _fit_centres(self, features: list[tuple[str, list[float]]]) -> None:
        """Nearest-centre classifier of the conditions (features scaled by their spread)."""
        if not features:
            self.centres = {}
            return
        x = np.array([f for _, f in features], dtype=np.float64)
        spread = x.std(axis=0)
        self.scale = [float(s) if s > 1e-9 else 1.0 for s in spread]
        self.centres = {}
        for cond in {c for c, _ in features}:
            rows = np.array([f for c, f in features if c == cond]) / self.scale
            self.centres[cond] = [float(v) for v in np.median(rows, axis=0)]

    def _cache_actions(self) -> None:
        names = {*self.table.values(), *(e for e in (self.first, self.safe) if e)}
        self._actions = {e: self.menu.encode(StaticAgent(self.env, preset=e).config) for e in names}

    def condition_of(self, obs: np.ndarray) -> str | None:
        """The learned condition an observation shows (None before ``learn`` or at reset)."""
        if not self.centres or float(obs[_ELAPSED]) == 0.0:
            return None
        f = np.array([float(obs[i]) for i in _IDX]) / self.scale
        return min(self.centres, key=lambda c: float(np.sum((f - self.centres[c]) ** 2)))

    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        if not self.table:
            raise RuntimeError(
                "rollout-table has no table yet: call learn() (it searches the training "
                "seeds) or load a saved one"
            )
        cond = self.condition_of(obs)
        entry = self.table.get(cond, self.first) if cond is not None else self.first
        budget = (self.trained_on or {}).get("time_budget_s")
        if not budget:
            return self._actions[entry].copy(), None
        # state: (condition, when it was first possibly in force, elapsed at this call), s
        now = float(obs[_ELAPSED]) * float(budget)
        last_cond, since, last_now = state if state is not None else (None, 0.0, 0.0)
        if cond != last_cond and last_cond is not None:
            since = last_now  # it changed during the decision that just ended
        if self._may_end(cond, entry, now - since):
            entry = self.safe
        return self._actions[entry].copy(), (cond, since, now)

    def _may_end(self, cond: str | None, entry: str, in_condition_s: float) -> bool:
        """Whether the condition could end within the next decision of ``entry``."""
        if not self.anticipate or cond is None or self.safe is None or entry == self.safe:
            return False
        dwell = self.dwell_s.get(cond)
        cost = self.decision_s.get(entry, {}).get(cond)
        if dwell is None or cost is None or in_condition_s + cost < dwell:
            return False
        return self._risky(entry)

    def _risky(self, entry: str | None) -> bool:
        """Whether ``entry``'s dearest decision exceeds the safe entry's by the risk ratio.

        Playing the safe entry instead is worth it only then: a small excess is repaid by
        the better entry's progress, a large one (a dense decision on a slow link) is not.
        """
        if not self.anticipate or entry is None or self.safe is None or entry == self.safe:
            return False
        return self._dearest(entry) > _RISK_RATIO * self._dearest(self.safe)

    def _dearest(self, entry: str) -> float:
        """The dearest decision of ``entry`` over the table's conditions, s (inf: unknown)."""
        by = self.decision_s.get(entry, {})
        return max((by.get(c, math.inf) for c in self.table), default=math.inf)

    def _get_state(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "first": self.first,
            "centres": self.centres,
            "scale": self.scale,
            "dwell_s": self.dwell_s,
            "decision_s": self.decision_s,
            "safe": self.safe,
            "cost_s": self.cost_s,
            "cost_decisions": self.cost_decisions,
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        if not state.get("table"):
            return
        self.table = dict(state["table"])
        self.first = state["first"]
        self.centres = {k: list(v) for k, v in state["centres"].items()}
        self.scale = list(state["scale"])
        self.dwell_s = {k: float(v) for k, v in state.get("dwell_s", {}).items()}
        self.decision_s = {
            e: {c: float(v) for c, v in by.items()} for e, by in state.get("decision_s", {}).items()
        }
        self.safe = state.get("safe")
        self.cost_s = state.get("cost_s")
        self.cost_decisions = int(state.get("cost_decisions", 0))
        self._cache_actions()
