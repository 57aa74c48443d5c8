"""Behaviour cloning of the simulator's oracle, the warm start of an RL agent.

Imitating an oracle first is far more sample-efficient than RL from scratch (Comyco, Huang
et al., ACM MM 2019; MLGO, Trofin et al. 2021, whose behaviour cloning beat its PPO);
recent adaptive-bitrate work clones an oracle and then fine-tunes with RL. In
``commgym/Sim-v1`` the oracle is exact and cheap: the dynamic programme of
:func:`~commgym.env.sim.planner.best_schedule` (``oracle-adaptive`` run inside the
simulator, milliseconds an episode) gives the best one-entry-per-phase schedule of the
running episode, and :class:`SimScheduleExpert` plays it decision by decision.

:func:`oracle_demonstrations` rolls the expert out through the very ``VecEnv`` the SB3
algorithm learns on (its frame stack and normaliser included), so the recorded observations
are the ones the policy will see; :meth:`~commgym.agents.sb3.SB3Agent.behaviour_clone` then
fits the policy to the expert's actions (negative log-likelihood plus a small entropy bonus,
the loss of the ``imitation`` library's ``BC``; that library pins gymnasium ~0.29 and
stable-baselines3 ~2.2, below this project's, so the loop is ours) and the value head to
the demonstrations' discounted returns, so that RL fine-tuning starts from a critic that
knows the cloned policy's values instead of tearing the policy down while its critic learns.

The expert reads the simulator's state (the episode's link schedule, seed and clock): it
exists only in the simulator; on real ranks the same schedules are what
``oracle-adaptive``'s search finds, at real cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["AgentExpert", "Demonstrations", "SimScheduleExpert", "oracle_demonstrations"]


class SimScheduleExpert:
    """``oracle-adaptive`` inside ``commgym/Sim-v1``: the best schedule of the running episode.

    At each decision it plays the entry that :func:`~commgym.env.sim.planner.best_schedule`
    gives for the phase the decision starts in, the schedule computed (once per episode) on
    the episode's own conditions: its episode seed, its config (a
    :class:`~commgym.env.sim.randomize.RandomizedConditions` redraw included) and its probe.
    Where no schedule reaches the target within the budget it has no advice (``None``).

    The default ``reaction_lag=1`` is the expert a reactive policy can follow: the first
    decision in a new link phase keeps the previous entry, because the policy learns of the
    new link only from that decision's observation. Cloning the anticipating schedule
    (``reaction_lag=0``) teaches entries that are best only when the switch is known in
    advance: on flaky-link's calibration of 2026-12-05 the clone played ``none/H1`` into the
    10 Mbit/s phase (one decision ~24 s) and missed the target on every seed.

    Where each episode draws its link (``profiles``, e.g. link-lottery), the first decision
    is blind as well: a reactive expert opens every episode with one entry whatever the
    link, ``opening``, and plays the best schedule from the second decision on.

    Args:
        reaction_lag: decisions before the expert acts on a new link (0 or 1).
        opening: the first decision's entry (``str(CommConfig)``, e.g.
            ``"topk:0.01/25MB/H2"``); ``"best"``: where the env draws its link per episode
            and ``reaction_lag`` is 1, the best blind entry in the simulator
            (:func:`~commgym.env.sim.planner.reactive_opening` over reset seeds 0-31), else
            none; ``None``: none (the first decision follows the schedule, as when the
            first link is the scenario's, known in advance). An entry that times the
            links far apart can serve a policy that reads the link from its own timing
            better than the best blind entry does (docs/simulator.md).

    Attributes:
        episodes: episodes planned so far.
        missed: of them, episodes where no schedule reaches the target.

    Raises:
        ValueError: ``reaction_lag`` other than 0 or 1; at the first call, an ``opening``
            that is not an entry of the env's menu.
    """

    def __init__(self, reaction_lag: int = 1, opening: str | None = "best") -> None:
        if reaction_lag not in (0, 1):
            raise ValueError(f"reaction_lag must be 0 or 1 (decisions), got {reaction_lag!r}")
        self.reaction_lag = reaction_lag
        self.opening = opening
        self._opening_k: dict[str, int | None] = {}  # per network config and probe: entry
        self._key: tuple[Any, ...] | None = None
        self._plan: list[tuple[float, int]] = []
        self._prev: tuple[int, int] | None = None  # (phase, flat entry) of the last decision
        self._reaches = False
        self.episodes = 0
        self.missed = 0

    def __call__(self, env: Any) -> np.ndarray | None:
        """The expert's ``MultiDiscrete`` action ``(3,)`` int64 for ``env``'s next decision.

        Args:
            env: a :class:`~commgym.env.sim.SimEnv` (unwrapped), reset and not ended.

        Returns:
            The menu indices, or ``None`` where the episode cannot reach its target.

        Raises:
            TypeError: ``env`` is not the simulator.
        """
        from commgym.env.sim import best_schedule

        _require_sim(env, "the schedule expert reads the simulator's state")
        cfg = env.config
        key = (env.episode_seed, repr(cfg.network), env.probe_bytes)
        opening = self._resolve_opening(env)
        if key != self._key or env.decisions == 0:
            t, self._plan = best_schedule(
                env.model,
                cfg,
                probe_bytes=env.probe_bytes,
                episode_seed=env.episode_seed,
                reaction_lag=self.reaction_lag,
                opening=opening,
            )
            self._key = key
            self._prev = None
            self.episodes += 1
            self._reaches = t is not None
            self.missed += not self._reaches
        if not self._reaches:
            return None
        if opening is not None and env.decisions == 0:
            self._prev = (0, opening)
            return np.asarray(np.unravel_index(opening, tuple(env.menu.nvec)), dtype=np.int64)
        if not self._plan:  # the opening alone reaches the target: keep it
            k = opening if self._prev is None else self._prev[1]
            return np.asarray(np.unravel_index(k, tuple(env.menu.nvec)), dtype=np.int64)
        t = env.train_time_s
        starts = env.link_phase_starts
        phase = int(np.searchsorted(starts, max(t, 0.0), side="right")) - 1
        k = self._plan[0][1]
        for start, entry in self._plan:
            if start <= t:
                k = entry
        if self.reaction_lag and self._prev is not None and phase != self._prev[0]:
            k = self._prev[1]  # the link changed under the last decision: not seen yet
        self._prev = (phase, k)
        return np.asarray(np.unravel_index(k, tuple(env.menu.nvec)), dtype=np.int64)

    def _resolve_opening(self, env: Any) -> int | None:
        """The flat entry of the first decision on ``env``'s conditions (``None``: none)."""
        net = f"{env.config.network!r}|{env.probe_bytes}"
        if net in self._opening_k:
            return self._opening_k[net]
        from commgym.env.sim import reactive_opening

        entries = list(env.model.entries)
        if self.opening is None:
            k = None
        elif self.opening == "best":
            drawn = env.config.network_plan.kind == "profiles"
            k = (
                reactive_opening(env.model, env.config, range(32), env.probe_bytes)[0]
                if drawn and self.reaction_lag
                else None
            )
        elif self.opening in entries:
            k = entries.index(self.opening)
        else:
            raise ValueError(
                f"opening {self.opening!r} is not an entry of this menu; valid: "
                f"{', '.join(entries)} (or 'best', or None)"
            )
        self._opening_k[net] = k
        return k


class AgentExpert:
    """An agent's own decisions in the simulator as the demonstrations to clone.

    The expert for a policy that should do what a planner does from what it observes:
    ``mpc`` (:class:`~commgym.agents.mpc.ModelPredictiveAgent`) anticipates a link change
    from the dwells it learned, which the schedule oracle (:class:`SimScheduleExpert`)
    cannot teach a reactive policy (its anticipating schedule knows the future). The agent
    acts on the simulator's own observation (:attr:`~commgym.env.sim.SimEnv.last_observation`,
    the raw layout, whatever the learner's wrappers add), deterministically, its state
    kept per env and reset at each episode's first decision.

    Args:
        agent: a commgym agent whose ``predict`` reads the env's observation layout.
    """

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self._states: dict[int, Any] = {}
        self.episodes = 0
        self.missed = 0  # an agent always advises
        #: regret of every flat entry at the last advice, s (``None``: the agent planned
        #: nothing there): its plan's expected times less the best, where it exposes them
        #: (``plan_times``, the model-predictive agent's)
        self.last_regret_s: np.ndarray | None = None

    def __call__(self, env: Any) -> np.ndarray:
        """The agent's ``MultiDiscrete`` action ``(3,)`` int64 for ``env``'s next decision.

        Raises:
            TypeError: ``env`` is not the simulator.
        """
        _require_sim(env, "an agent expert acts on the simulator's observation")
        start = env.decisions == 0
        self.episodes += start
        action, state = self.agent.predict(
            env.last_observation,
            self._states.get(id(env)),
            episode_start=np.array([start]),
            deterministic=True,
        )
        self._states[id(env)] = state
        times = getattr(self.agent, "plan_times", None)
        self.last_regret_s = None if times is None else times - times.min()
        return np.asarray(action, dtype=np.int64).reshape(3)


def _require_sim(env: Any, why: str) -> None:
    """Refuse an env that is not the simulator, saying ``why`` the expert needs it.

    Raises:
        TypeError: ``env`` is not a :class:`~commgym.env.sim.SimEnv`.
    """
    from commgym.env.sim import SimEnv

    if not isinstance(env, SimEnv):
        raise TypeError(
            f"{why}; got {type(env).__name__} (behaviour cloning runs in commgym/Sim-v1: "
            "env_kind: sim)"
        )


@dataclass
class Demonstrations:
    """Decisions an expert played, as the learner sees them.

    Attributes:
        observations: ``(n, d)`` float32, as the algorithm's ``VecEnv`` returns them, except
            that a normaliser's scaling is not applied (the learner's statistics at cloning
            time are).
        actions: ``(n, 3)`` int64 menu indices.
        returns: ``(n,)`` float32 discounted return from each decision to the end of its
            episode, in the rewards the algorithm learns from (normalised where it
            normalises them).
        episodes: whole episodes recorded.
        skipped: decisions played without advice (an episode no schedule can finish; they
            are not recorded).
        regret_s: ``(n, entries)`` float64, the expert's expected regret of every flat
            menu entry at each decision, s (NaN rows where it planned nothing), or ``None``
            where the expert exposes none (:attr:`AgentExpert.last_regret_s`).
    """

    observations: np.ndarray
    actions: np.ndarray
    returns: np.ndarray
    episodes: int
    skipped: int
    regret_s: np.ndarray | None = None

    def __add__(self, other: Demonstrations) -> Demonstrations:
        """Both sets of decisions, in order (a DAgger round's aggregation)."""
        regret = None
        if self.regret_s is not None and other.regret_s is not None:
            regret = np.concatenate([self.regret_s, other.regret_s])
        return Demonstrations(
            observations=np.concatenate([self.observations, other.observations]),
            actions=np.concatenate([self.actions, other.actions]),
            returns=np.concatenate([self.returns, other.returns]),
            episodes=self.episodes + other.episodes,
            skipped=self.skipped + other.skipped,
            regret_s=regret,
        )


def oracle_demonstrations(
    venv: Any,
    expert: Callable[[Any], np.ndarray | None],
    episodes: int,
    *,
    gamma: float,
    normalizer: Any = None,
    explore: float = 0.0,
    learner: Callable[[np.ndarray], np.ndarray] | None = None,
    seed: int = 0,
    callback: Callable[[], None] | None = None,
) -> Demonstrations:
    """Roll ``expert`` out on ``venv`` for ``episodes`` whole episodes and record it.

    Args:
        venv: the SB3 ``VecEnv`` the algorithm learns on, over in-process envs (a
            ``DummyVecEnv``, possibly stacked and normalised); stepping it advances the
            algorithm's own env (it is reset first).
        expert: ``expert(unwrapped env) -> action or None`` (:class:`SimScheduleExpert`).
        episodes: whole episodes to record (int >= 1).
        gamma: discount of the returns (the algorithm's).
        normalizer: the ``VecNormalize`` in ``venv``, if any: observations are recorded
            before its scaling (:meth:`get_original_obs`).
        explore: probability, per decision, of playing a uniformly drawn menu entry
            instead of the expert's while still recording the expert's action as the label
            (DART's noise injection, Laskey et al., CoRL 2017): the demonstrations then
            cover the states a learner's own mistakes lead to, and the normaliser's
            statistics the observation fields that the expert alone never varies.
        learner: ``learner(observations (n_envs, d) as venv returns them) -> actions
            (n_envs, 3)``: where given, the learner plays every decision and the expert
            only labels it (a DAgger round, Ross, Gordon & Bagnell, AISTATS 2011, with
            the mixing weight 0 after the first round): the demonstrations are the
            states the learner's own policy reaches, where a clone's rare mistakes (a
            dense entry kept into a slow phase) lead. ``explore`` still applies on top.
        seed: seed of the exploration's draws.
        callback: called after each finished episode (a progress bar's advance).

    Returns:
        The recorded :class:`Demonstrations`; episodes of which no decision had advice
        still count towards ``episodes``.

    Raises:
        ValueError: ``episodes`` < 1; ``explore`` outside ``[0, 1)``.
    """
    from commgym.collectives.checks import check_int

    check_int("episodes", episodes, 1)
    if not 0.0 <= float(explore) < 1.0:
        raise ValueError(f"explore must be a probability in [0, 1), got {explore!r}")
    n = venv.num_envs
    envs = venv.get_attr("unwrapped")
    obs = venv.reset()
    raw = normalizer.get_original_obs() if normalizer is not None else obs
    trails: list[list[tuple[np.ndarray, np.ndarray, float, np.ndarray | None]]] = [
        [] for _ in range(n)
    ]
    out_obs: list[np.ndarray] = []
    out_act: list[np.ndarray] = []
    out_ret: list[float] = []
    out_reg: list[np.ndarray | None] = []
    regrets: list[np.ndarray | None] = [None] * n
    done_eps = skipped = 0
    rng = np.random.default_rng(seed)
    while done_eps < episodes:
        actions = np.zeros((n, 3), dtype=np.int64)
        played = np.zeros((n, 3), dtype=np.int64)
        advised = []
        own = None if learner is None else np.asarray(learner(obs), dtype=np.int64)
        for i, env in enumerate(envs):
            # the expert is asked at every decision, whoever plays it: a stateful expert
            # (mpc's link filter) must see each decision's outcome to label the next
            a = expert(env)
            advised.append(a is not None)
            regrets[i] = getattr(expert, "last_regret_s", None)
            drawn = [int(rng.integers(v)) for v in env.menu.nvec]
            # no schedule finishes this episode: any action ends it at the budget
            actions[i] = a if a is not None else drawn
            chosen = actions[i] if own is None or a is None else own.reshape(n, 3)[i]
            played[i] = drawn if a is None or rng.random() < explore else chosen
        obs_before = np.asarray(raw, dtype=np.float32)
        obs, rewards, dones, _ = venv.step(played)
        raw = normalizer.get_original_obs() if normalizer is not None else obs
        for i in range(n):
            if advised[i]:
                trails[i].append(
                    (obs_before[i].copy(), actions[i].copy(), float(rewards[i]), regrets[i])
                )
            else:
                skipped += 1
            if dones[i]:
                ret = 0.0
                rows = []
                for o, a, r, g in reversed(trails[i]):
                    ret = r + gamma * ret
                    rows.append((o, a, ret, g))
                for o, a, r, g in reversed(rows):
                    out_obs.append(o)
                    out_act.append(a)
                    out_ret.append(r)
                    out_reg.append(g)
                trails[i] = []
                done_eps += 1
                if callback is not None:
                    callback()
    d = int(np.prod(venv.observation_space.shape))
    regret = None
    if any(g is not None for g in out_reg):
        width = next(len(g) for g in out_reg if g is not None)
        regret = np.array(
            [np.full(width, np.nan) if g is None else g for g in out_reg], dtype=np.float64
        ).reshape(-1, width)
    return Demonstrations(
        observations=np.asarray(out_obs, dtype=np.float32).reshape(-1, d),
        actions=np.asarray(out_act, dtype=np.int64).reshape(-1, 3),
        returns=np.asarray(out_ret, dtype=np.float32),
        episodes=done_eps,
        skipped=skipped,
        regret_s=regret,
    )
