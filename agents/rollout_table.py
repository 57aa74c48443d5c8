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
   ``log10_link_gbps``/``straggler_ms`` when the env reveals them, ``privileged_obs``).

One approximate policy-iteration step with a tabular policy over observed conditions:
it adapts exactly as far as the conditions are observable and the winners consistent
across training seeds. Its cost is the two searches on the training seeds.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from commgym.agents.base import LearnCallback, StepAgent
from commgym.agents.baselines import StaticAgent
from commgym.agents.oracle import OracleStaticAgent
from commgym.agents.oracle_adaptive import OracleAdaptiveAgent
from commgym.env.spaces import OBSERVATION_FIELDS

__all__ = ["CONDITION_FIELDS", "RolloutTableAgent", "training_seeds"]

#: The observation fields a condition is recognised from.
CONDITION_FIELDS = ("log10_probe_gbps", "log10_link_gbps", "straggler_ms")
_IDX = [[f.name for f in OBSERVATION_FIELDS].index(n) for n in CONDITION_FIELDS]
_ELAPSED = [f.name for f in OBSERVATION_FIELDS].index("elapsed_frac")


def training_seeds(seed: int | None, n: int) -> list[int]:
    """The episode seeds a learner searches: ``10_000 + 100 * seed + i`` (never 1000-1099).

    Evaluation seeds are ``eval_seed + i`` with ``eval_seed = 1000`` in every shipped
    scenario, so training and evaluation episodes never coincide.
    """
    return [10_000 + 100 * int(seed or 0) + i for i in range(n)]


class RolloutTableAgent(StepAgent):
    """Learned table condition -> menu entry (see the module docstring).

    Args:
        env: the real commgym env (the searches fork its episodes).
        seed: picks the training seeds (:func:`training_seeds`).
        episodes: training seeds searched (>= 1).
        entries: candidate entries (default: the whole menu).

    Raises:
        ValueError: ``episodes`` < 1.
        TypeError: the env cannot fork episodes (as ``oracle-adaptive``).
    """

    name = "rollout-table"
    learned = True
    needs_real_env = True

    def __init__(
        self,
        env: gym.Env,
        *,
        seed: int | None = None,
        episodes: int = 3,
        entries: Sequence[str] | None = None,
    ) -> None:
        if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
            raise ValueError(f"episodes must be an integer >= 1, got {episodes!r}")
        super().__init__(
            env, seed=seed, episodes=episodes, entries=None if entries is None else list(entries)
        )
        self.episodes = episodes
        self.entries = None if entries is None else list(entries)
        #: condition -> the entry played there
        self.table: dict[str, str] = {}
        #: the entry of the first decision (the reset observation shows no condition)
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

        def on_step(step: dict[str, Any]) -> bool | None:
            cond = step["info"].get("condition")
            if cond is not None:
                obs = np.asarray(step["obs"], dtype=np.float64)
                features.append((cond, [float(obs[i]) for i in _IDX]))
            return None if callback is None else callback(step)

        static = OracleStaticAgent(env, seeds=seeds, entries=self.entries)
        static.learn(progress_bar=progress_bar, callback=on_step)
        oracle = OracleAdaptiveAgent(env, seeds=seeds, entries=self.entries, static=static)
        oracle.learn(progress_bar=progress_bar, callback=on_step)
        self.cost_s = time.perf_counter() - t0
        self.cost_decisions = static.search_decisions + oracle.search_decisions
        wins: dict[str, Counter[str]] = {}
        firsts: Counter[str] = Counter()
        for sched in oracle.schedules.values():
            firsts[sched.phases[0].entry] += 1
            for phase in sched.phases:
                wins.setdefault(phase.condition, Counter())[phase.entry] += 1
        order = [row.config for row in static.ranking]  # ties: the static ranking's order
        pick = lambda c: max(c, key=lambda e: (c[e], -order.index(e)))  # noqa: E731
        self.table = {cond: pick(c) for cond, c in wins.items()}
        self.first = pick(firsts)
        self._fit_centres(features)
        self._cache_actions()
        return self

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
        names = {*self.table.values(), *([self.first] if self.first else [])}
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
        return self._actions[entry].copy(), None

    def _get_state(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "first": self.first,
            "centres": self.centres,
            "scale": self.scale,
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
        self.cost_s = state.get("cost_s")
        self.cost_decisions = int(state.get("cost_decisions", 0))
        self._cache_actions()
