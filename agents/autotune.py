"""A Horovod-style one-shot autotuner that searches inside every episode, then freezes."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from commgym.agents.base import LearnCallback, StepAgent, predict_each
from commgym.agents.bayesopt import best_sampled, menu_features, propose_ei
from commgym.collectives import CommConfig
from commgym.collectives.checks import check_int
from commgym.env.spaces import OBSERVATION_FIELDS

__all__ = ["OBJECTIVES", "AutotuneAgent"]

_FIELD = {f.name: i for i, f in enumerate(OBSERVATION_FIELDS)}
#: Shortest GP length scale, normalised index units. Neighbouring entries lie
#: 1 / (n - 1) apart (0.25 to 0.5 on the usual menus); shorter scales decorrelate them,
#: and with a handful of samples EI then only fills space instead of following the trend.
_MIN_LENGTH_SCALE = 0.2


def _progress_per_s(obs: np.ndarray, dt_s: float) -> float:
    return float(obs[_FIELD["loss_change"]]) / dt_s if dt_s > 0 else math.nan


def _throughput(obs: np.ndarray, dt_s: float) -> float:
    step = float(obs[_FIELD["step_time_s"]])
    return 1.0 / step if step > 0 else math.nan


#: ``objective(obs, dt) -> score`` (maximised; NaN: no sample). ``dt`` is the decision's
#: training time in seconds (``time_budget_s`` known) or in budget fractions.
OBJECTIVES: dict[str, Callable[[np.ndarray, float], float]] = {
    # held-out log-loss decrease per second of training: what time to target rewards
    "progress": _progress_per_s,
    # iterations per second, what Horovod's autotuner maximises (blind to convergence)
    "throughput": _throughput,
}


@dataclass
class _Tuning:
    """One episode's search (plain values, so it saves to JSON and resets per episode)."""

    rng: np.random.Generator
    sampled: list[int] = field(default_factory=list)  # flat index of each kept sample
    values: list[float] = field(default_factory=list)  # objective of each kept sample
    decisions: int = 0  # decisions chosen in the episode
    proposal: int | None = None  # entry under test, None before the first decision
    applied: int | None = None  # entry that produced the last observation
    since_change: int = 0  # decisions on ``applied`` since it last changed
    prev_elapsed: float = 0.0  # elapsed_frac of the last observation
    tuned: int | None = None  # frozen entry, None while tuning

    def to_dict(self) -> dict[str, Any]:
        return {
            "rng": self.rng.bit_generator.state,
            "sampled": list(self.sampled),
            "values": list(self.values),
            "decisions": self.decisions,
            "proposal": self.proposal,
            "applied": self.applied,
            "since_change": self.since_change,
            "prev_elapsed": self.prev_elapsed,
            "tuned": self.tuned,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> _Tuning:
        rng = np.random.default_rng()
        rng.bit_generator.state = d["rng"]
        return cls(
            rng=rng,
            sampled=[int(i) for i in d["sampled"]],
            values=[float(v) for v in d["values"]],
            decisions=int(d["decisions"]),
            proposal=d["proposal"],
            applied=d["applied"],
            since_change=int(d["since_change"]),
            prev_elapsed=float(d["prev_elapsed"]),
            tuned=d["tuned"],
        )


class AutotuneAgent(StepAgent):
    """One-shot GP autotuner: Bayesian optimisation in the first decisions, then frozen.

    Plays what Horovod's autotuner (``horovod/common/parameter_manager.cc``: GP + expected
    improvement over fusion buffer size and cycle time, warmup samples discarded after a
    change, then frozen), Bagua's Bayesian autotuner and AutoCCL (Xu et al., NSDI 2025;
    coordinate descent) do: search early **in the real job**, then keep the best setting
    for the rest of it. Every episode is one such job:

    * The first ``tuning_decisions`` decisions of an episode are the search. They are
      ordinary decisions of the episode, so their training time counts towards the
      episode's time to target.
    * Samples: the DDP default first (``ActionMenu.default_action``: ``none``/25 MiB/H1
      where on the menu), then ``n_initial - 1`` random unsampled entries, then the
      expected-improvement maximiser of a GP over the menu (``bayesopt.fit_gp``,
      ``bayesopt.propose_ei``; length scales >= 0.2 so neighbouring entries inform each
      other) among the entries not yet sampled. After a configuration change the next ``warmup``
      decisions are discarded (Horovod's warmup samples); an entry is held until it has
      given one kept sample. Warmup decisions count among the ``tuning_decisions``.
    * From decision ``tuning_decisions + 1`` on it plays, frozen, the sampled entry with
      the best GP posterior mean (``bayesopt.best_sampled``; the DDP default when no
      sample was kept).
    * The search state resets at every episode start (``predict(...,
      episode_start=[True])``, SB3's convention, or an observation with
      ``elapsed_frac == 0``, which only a reset observation has), and the random draws
      restart from ``seed``: an episode's search depends on its observations only, not
      on the episodes before it.

    **Scoring** reads only the observation (predict gets no reward). The observation after
    a decision carries the configuration that produced it (``compression_index``,
    ``bucket_index``, ``period_index``), and the sample is credited to that entry.

    * ``objective="progress"`` (default): ``loss_change / dt``, held-out log-loss decrease
      per second of training. ``dt`` is the difference of ``elapsed_frac`` between two
      observations times the env's ``time_budget_s``: that is exactly the decision's
      training time as the episode's clock counts it (iterations plus the decision's
      consensus averaging and reconfiguration), up to float32 rounding of
      ``elapsed_frac`` (``6e-8 * time_budget_s``). ``step_time_s * steps_per_decision``
      is not: ``step_time_s`` is a median iteration and leaves out the averaging, which
      is what local-SGD periods trade against. Without a known budget (an agent loaded
      without env) ``dt`` is in budget fractions; the ranking of entries is the same.
    * ``objective="throughput"``: ``1 / step_time_s``, iterations per second, the
      quantity Horovod's autotuner maximises. It ignores convergence, so it favours
      heavy compression and long periods.

    Tuning advice: early decisions reduce the loss most, so under ``progress`` the
    first samples (the DDP default among them) look better than later ones of equal
    speed; ``warmup`` does not remove that drift, a larger ``n_initial`` spreads it.

    ``predict`` ignores ``deterministic``: the search is the tuner's policy. The
    attributes below describe the episode of the last unbatched ``predict`` call;
    batched calls keep one search per row in the returned ``state``.

    Attributes:
        tuning_decisions_used: decisions of the current episode spent searching
            (``<= tuning_decisions``).
        frozen: True once the search is over in the current episode.
        tuned_config: the frozen :class:`CommConfig` (None while searching).
        samples: ``(config string, objective)`` of each kept sample of the episode.

    Args:
        env: commgym env (its ``config.time_budget_s`` converts ``elapsed_frac`` to s).
        tuning_decisions: ``N``, decisions searched per episode (int >= 0).
        objective: ``"progress"`` or ``"throughput"`` (see :data:`OBJECTIVES`).
        warmup: decisions discarded after a configuration change (int >= 0; 0 by default
            because one decision already averages ``steps_per_decision`` iterations).
        n_initial: samples before EI (default first, then random; int >= 1).
        xi: EI margin in standard deviations of the samples (>= 0).
        seed: seeds the random initial samples and the GP optimiser restarts.

    Raises:
        ValueError: invalid hyperparameters (the message gives the value).
    """

    reads_probe = False

    name = "autotune"
    online = True  # tunes inside every episode; its search counts in the measured time

    def __init__(
        self,
        env: gym.Env,
        *,
        seed: int | None = None,
        tuning_decisions: int = 8,
        objective: str = "progress",
        warmup: int = 0,
        n_initial: int = 3,
        xi: float = 0.01,
    ) -> None:
        for name, value, low in (
            ("tuning_decisions", tuning_decisions, 0), ("warmup", warmup, 0),
            ("n_initial", n_initial, 1),
        ):  # fmt: skip
            check_int(name, value, low)
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; valid: {sorted(OBJECTIVES)}")
        if not (isinstance(xi, int | float) and math.isfinite(xi) and xi >= 0):
            raise ValueError(f"xi must be a finite number >= 0, got {xi!r}")
        super().__init__(
            env, seed=seed, tuning_decisions=int(tuning_decisions), objective=objective,
            warmup=int(warmup), n_initial=int(n_initial), xi=float(xi),
        )  # fmt: skip
        self.tuning_decisions = int(tuning_decisions)
        self.objective = objective
        self.warmup = int(warmup)
        self.n_initial = int(n_initial)
        self.xi = float(xi)
        budget = getattr(getattr(env.unwrapped, "config", None), "time_budget_s", None)
        #: seconds per unit of ``elapsed_frac`` (None: unknown, scores per budget fraction)
        self.time_budget_s: float | None = None if budget is None else float(budget)
        self.features = menu_features(self.menu.nvec)
        self._default = self._flat(self.menu.default_action())
        self._tuning = self._new_tuning()

    # -- the search -------------------------------------------------------------------
    def _new_tuning(self) -> _Tuning:
        return _Tuning(rng=np.random.default_rng(self.seed))

    def _config_of(self, obs: np.ndarray) -> int:
        """Flat index of the entry that produced ``obs`` (from its normalised indices)."""
        return self._flat(self.menu.action_in(obs))

    def _record(self, t: _Tuning, obs: np.ndarray) -> bool:
        """Score the decision that produced ``obs``; True when a sample was kept."""
        entry = self._config_of(obs)
        elapsed = float(obs[_FIELD["elapsed_frac"]])
        dt = (elapsed - t.prev_elapsed) * (self.time_budget_s or 1.0)
        t.prev_elapsed = elapsed
        if entry != t.applied:
            t.applied, t.since_change = entry, 0
        t.since_change += 1
        if t.since_change <= self.warmup:
            return False
        score = OBJECTIVES[self.objective](obs, dt)
        if not math.isfinite(score):
            return False
        t.sampled.append(entry)
        t.values.append(score)
        return True

    def _propose(self, t: _Tuning) -> int:
        if t.decisions == 0:
            return self._default
        unsampled = sorted(set(range(self.menu.size)) - set(t.sampled))
        if len(t.sampled) < self.n_initial and unsampled:
            return int(t.rng.choice(unsampled))
        # a short search on a discrete menu learns more from a new entry than from
        # re-measuring one (the GP's noise term already averages what was measured)
        return propose_ei(
            self.features, t.sampled, t.values, self.xi, t.rng, self.seed,
            candidates=unsampled or None, min_length_scale=_MIN_LENGTH_SCALE,
        )  # fmt: skip

    def _decide(self, t: _Tuning, obs: np.ndarray) -> np.ndarray:
        if t.decisions == 0:
            # a reset observation: the env runs the entry it reports (the DDP default),
            # which needs no warmup, so the first sample is not discarded
            t.applied, t.since_change = self._config_of(obs), self.warmup
            t.prev_elapsed = float(obs[_FIELD["elapsed_frac"]])
        elif t.tuned is None:
            kept = self._record(t, obs)
            if kept:
                t.proposal = None
        if t.tuned is None and t.decisions >= self.tuning_decisions:
            t.tuned = (
                best_sampled(self.features, t.sampled, t.values, self.seed, _MIN_LENGTH_SCALE)
                if t.sampled
                else self._default
            )
        if t.tuned is not None:
            choice = t.tuned
        else:
            if t.proposal is None:
                t.proposal = self._propose(t)
            choice = t.proposal
        t.decisions += 1
        return self._unflat(choice)

    @staticmethod
    def _starts(obs: np.ndarray) -> bool:
        return float(obs[_FIELD["elapsed_frac"]]) == 0.0

    # -- what the current episode did -------------------------------------------------
    @property
    def tuning_decisions_used(self) -> int:
        """Decisions of the current episode spent searching (``<= tuning_decisions``)."""
        return min(self._tuning.decisions, self.tuning_decisions)

    @property
    def frozen(self) -> bool:
        """True once the current episode's search is over."""
        return self._tuning.tuned is not None

    @property
    def tuned_config(self) -> CommConfig | None:
        """The entry frozen on in the current episode (None while searching)."""
        t = self._tuning.tuned
        return None if t is None else self.menu.decode(self._unflat(t))

    @property
    def samples(self) -> list[tuple[str, float]]:
        """``(config string, objective)`` of each kept sample of the current episode."""
        t = self._tuning
        return [
            (str(self.menu.decode(self._unflat(i))), v)
            for i, v in zip(t.sampled, t.values, strict=True)
        ]

    # -- Agent API ---------------------------------------------------------------------
    def predict(  # noqa: D102 - documented on Agent
        self,
        observation: np.ndarray,
        state: Any = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = True,
    ) -> tuple[np.ndarray, Any]:
        def act(obs: np.ndarray, tuning: Any, start: bool) -> tuple[np.ndarray, _Tuning]:
            if start or self._starts(obs) or not isinstance(tuning, _Tuning):
                tuning = self._new_tuning()
            return self._decide(tuning, obs), tuning

        if np.ndim(observation) == 1:  # one env: its search lives on the agent
            action, self._tuning = predict_each(
                observation, self._obs_dim, self._tuning, episode_start, act
            )
            return action, None
        return predict_each(observation, self._obs_dim, state, episode_start, act)

    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        return self._decide(self._tuning, obs), None

    def learn(
        self,
        total_timesteps: int = 0,
        progress_bar: bool = False,
        callback: LearnCallback | None = None,
    ) -> AutotuneAgent:
        """Nothing to learn: the tuner searches afresh inside every episode.

        It carries nothing from one episode to the next (that is the baseline: what a
        user's job gets from a one-shot autotuner), so ``learn`` runs no decisions and
        leaves the agent unchanged; ``predict`` works untrained.

        Args:
            total_timesteps: accepted for the common interface (int >= 0); ignored.
            progress_bar: ignored.
            callback: never called.

        Returns:
            self.

        Raises:
            ValueError: ``total_timesteps`` is not an integer >= 0.
            RuntimeError: loaded without an env (as for every agent's ``learn``).
        """
        if (
            isinstance(total_timesteps, bool)
            or not isinstance(total_timesteps, int | np.integer)
            or total_timesteps < 0
        ):
            raise ValueError(f"total_timesteps must be an integer >= 0, got {total_timesteps!r}")
        self._require_env()
        return self

    def _episode_start(self, obs: np.ndarray) -> None:
        self._tuning = self._new_tuning()

    def _get_state(self) -> dict[str, Any]:
        return {"tuning": self._tuning.to_dict(), "time_budget_s": self.time_budget_s}

    def _set_state(self, state: dict[str, Any]) -> None:
        if "tuning" in state:
            self._tuning = _Tuning.from_dict(state["tuning"])
        if self.time_budget_s is None and state.get("time_budget_s") is not None:
            self.time_budget_s = float(state["time_budget_s"])
