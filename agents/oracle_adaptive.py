"""The best schedule in hindsight over a scenario's phases: the upper bound of adaptation.

``oracle-static`` says how fast the best *single* menu entry reaches the target on the
evaluation seeds; this oracle says how fast a *schedule* of entries can, where the
scenario's conditions change (the link's rate, straggler jitter). The gap between the two
is the headroom for adaptation (:mod:`commgym.experiments.headroom`); a scenario whose
conditions never change has none by construction.

**Conditions that change inside an episode** (a schedule of links or stragglers): the
episode is split into its phases (:attr:`~commgym.env.AllReduceEnv.episode_phases`) and
the schedule is built greedily, phase by phase, by the *rollout algorithm* (Bertsekas,
"Rollout Algorithms for Discrete Optimization", 2013; policy improvement on a base
policy): at each phase boundary the ranks' state is saved
(:meth:`~commgym.env.AllReduceEnv.snapshot`) and every candidate entry is tried for the
phase from that same state, then followed by the *base* (the best static entry) until the
target; the entry whose continuation reaches the target first is kept, the episode goes on
from the end of its phase (forked from a snapshot, not replayed), and the next phase is
searched the same way. A candidate whose phase ends later *and* at a higher held-out loss
than the base's is dominated and is not continued; a continuation stops once it is slower
than the best so far; a candidate whose shortest decision under the phase's condition
(seen earlier in the search) would already end after the best time so far is not tried.
The result is an achievable piecewise-constant schedule, at least as good as the base in
expectation; greedy, so it can understate the speed of the true best schedule (which
could trade one phase against a later one).

**Conditions that never change but a training state that does.** Where the best entry
depends on the remaining loss (long local-SGD periods cost little progress at a high loss
and much at a low one) or on the switch history, a schedule gains even on one link;
``search_every_s`` splits every condition phase into search phases of at most that many
seconds of training (:func:`~commgym.env.schedule.split_phases`, the same grid the
simulator's dynamic programme takes as ``every_s``), and the rollout algorithm runs over
those. Without it a condition that never changes gets the best static entry (below).

**Conditions drawn per episode** (``{"profiles": [...]}``) or fixed: the contextual
oracle, the best entry per condition: seeds are grouped by the condition their episode
drew and each group gets the entry with the best mean time to target over its seeds (from
``oracle-static``'s per-seed episodes).

Selection in hindsight favours whichever candidate had a lucky run, so neither oracle's
search times are reported: like ``oracle-static``'s best entry, each seed's schedule is
run again for the evaluation (:meth:`OracleAdaptiveAgent.for_seed`), and that fresh run is
what tables compare. A re-run can train slower than its search and still be short of the
target when the searched phases end: from there it plays, phase by phase, the entry chosen
for the condition in force (:meth:`OracleAdaptiveAgent.full_schedule`), never its last
entry into a condition it was not chosen for. The contextual oracle's per-condition entries
are re-run the same way as ``oracle-static``'s: the evaluation re-runs every entry near-tied
in the search and keeps the best re-run per condition
(:mod:`commgym.experiments.evaluation`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import gymnasium as gym
import numpy as np

from commgym.agents.base import LearnCallback, Preparation, Progress, StepAgent
from commgym.agents.baselines import StaticAgent
from commgym.agents.oracle import DEFAULT_SEEDS, OracleStaticAgent, check_seeds
from commgym.agents.rollout import Episode, EpisodeStep, rollout
from commgym.env.schedule import check_every_s, split_phases
from commgym.env.spaces import OBSERVATION_FIELDS

__all__ = ["OracleAdaptiveAgent", "PhaseChoice", "ScheduleAgent", "SeedSchedule"]

_ELAPSED = [f.name for f in OBSERVATION_FIELDS].index("elapsed_frac")


@dataclass(frozen=True)
class PhaseChoice:
    """The entry a schedule plays from one phase boundary on.

    Attributes:
        start_s: training time at which the phase begins (its condition switches), s.
        condition: what the phase runs on (``"20mbit, stragglers off"``).
        entry: the menu entry played, ``str(CommConfig)``.
        tried: candidate -> time to target of "candidate for this phase, then the base"
            in the search (``None``: pruned or never reached); empty for contextual choices.
    """

    start_s: float
    condition: str
    entry: str
    tried: tuple[tuple[str, float | None], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain values."""
        return {
            "start_s": self.start_s,
            "condition": self.condition,
            "entry": self.entry,
            "tried": [list(t) for t in self.tried],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PhaseChoice:
        """Inverse of :meth:`to_dict`."""
        tried = tuple((str(e), None if t is None else float(t)) for e, t in d["tried"])
        return cls(float(d["start_s"]), str(d["condition"]), str(d["entry"]), tried)


@dataclass(frozen=True)
class SeedSchedule:
    """One evaluation seed's schedule in hindsight.

    Attributes:
        seed: the evaluation seed.
        mode: ``"phases"`` (rollout algorithm over the episode's phases) or
            ``"context"`` (best entry for the condition the episode drew).
        phases: the entries by phase, in time order.
        search: the search's own path (its phases' winning segments joined): what the
            search measured, optimistic by selection; evaluations re-run the schedule.
        conditions: every phase of the seed's episode over the whole budget,
            ``(start_s, condition)`` (the env's ``episode_phases``, split every
            ``search_every_s`` where the oracle had a search grid): a re-run slower than
            its search goes on past the phases the search needed, and plays by condition
            there (:meth:`OracleAdaptiveAgent.full_schedule`).
    """

    seed: int
    mode: str
    phases: tuple[PhaseChoice, ...]
    search: Episode | None = None
    conditions: tuple[tuple[float, str], ...] = ()

    @property
    def schedule(self) -> list[tuple[float, str]]:
        """``(start_s, entry)`` pairs, in time order."""
        return [(p.start_s, p.entry) for p in self.phases]

    def to_dict(self) -> dict[str, Any]:
        """Plain values (the search path's outcome only)."""
        return {
            "seed": self.seed,
            "mode": self.mode,
            "phases": [p.to_dict() for p in self.phases],
            "search": None if self.search is None else self.search.to_dict(),
            "conditions": [list(c) for c in self.conditions],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SeedSchedule:
        """Inverse of :meth:`to_dict` (files without ``conditions`` read as before)."""
        search = None if d.get("search") is None else Episode.from_dict(d["search"])
        phases = tuple(PhaseChoice.from_dict(p) for p in d["phases"])
        conditions = tuple((float(t), str(c)) for t, c in d.get("conditions", ()))
        return cls(int(d["seed"]), str(d["mode"]), phases, search, conditions)


class ScheduleAgent(StepAgent):
    """Plays a piecewise-constant schedule of menu entries over the episode's training time.

    The training time comes from the observation (``elapsed_frac x time_budget_s``), so
    the entry of a phase starts at the first decision that begins at or after the phase's
    start, as in the search that found the schedule.

    Args:
        env: the commgym env (menu and ``config.time_budget_s``).
        schedule: ``(start_s, entry)`` pairs, the first at 0 s, strictly increasing; an
            entry is a menu string (``"topk:0.01/25MB/H2"``) or a static preset.
        seed: unused.

    Raises:
        ValueError: an empty schedule, one not starting at 0 or not increasing, an entry
            not on the menu.
        TypeError: the env has no ``config.time_budget_s``.
    """

    reads_probe = False

    name = "schedule"

    def __init__(
        self, env: gym.Env, schedule: Sequence[tuple[float, str]], *, seed: int | None = None
    ) -> None:
        pairs = [(float(t), str(e)) for t, e in schedule]
        if not pairs or pairs[0][0] != 0.0:
            raise ValueError(f"a schedule needs (start_s, entry) pairs from 0 s, got {schedule!r}")
        if any(b[0] <= a[0] for a, b in itertools.pairwise(pairs)):
            raise ValueError(f"schedule start times must strictly increase, got {schedule!r}")
        super().__init__(env, seed=seed, schedule=pairs)
        budget = getattr(getattr(env.unwrapped, "config", None), "time_budget_s", None)
        if budget is None:
            raise TypeError(
                f"{type(env.unwrapped).__name__} has no config.time_budget_s: a schedule "
                "over training time needs a commgym env"
            )
        self.budget_s = float(budget)
        self.schedule = pairs
        self._starts = [t for t, _ in pairs]
        self._actions = [self.menu.encode(StaticAgent(env, preset=e).config) for _, e in pairs]

    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        # float32 observations carry the time to ~1e-7 of the budget: a decision that
        # starts within microseconds of a boundary may fall on either side of it
        t = float(obs[_ELAPSED]) * self.budget_s
        i = int(np.searchsorted(self._starts, t, side="right")) - 1
        return self._actions[max(i, 0)].copy(), None


class OracleAdaptiveAgent(StepAgent):
    """Oracle: the best schedule in hindsight over the scenario's phases or conditions.

    See the module docstring for the two modes and why evaluations re-run the schedules.
    ``learn()`` needs ``oracle-static``'s ranking (the base entry and the per-seed times);
    pass a learned :class:`~commgym.agents.oracle.OracleStaticAgent` as ``static`` to
    share its search (the leaderboard does), else it runs one first (its cost counted).

    It is not a policy: a schedule belongs to one seed's episode, so
    :meth:`for_seed` gives the agent that plays it and :meth:`predict` raises.

    Args:
        env: the real commgym env (:class:`~commgym.env.AllReduceEnv`, possibly wrapped):
            the search forks its episodes (``snapshot``/``restore``).
        seeds: evaluation seeds (default ``DEFAULT_SEEDS``).
        entries: candidate entries (menu strings or presets; default: the whole menu).
        static: a learned ``oracle-static`` over the same seeds and entries.
        seed: unused.
        probe: fork episodes that run the probe all-reduce (as ``OracleStaticAgent``'s
            ``probe``: for a learner that learns from them and reads the probe); the
            static search it runs itself runs alike. ``static``'s must match.
        search_every_s: also start a search phase every this many seconds of training
            time inside a condition (same label; ``None``: only where conditions change).
            Where the best entry depends on the training state (the remaining loss, the
            switch history) and not only on the link, a schedule can gain even where the
            link never changes; this grid is where the rollout algorithm may switch there.

    Raises:
        ValueError: bad ``seeds``/``entries``/``search_every_s``; ``static`` over other
            seeds or another ``probe``.
    """

    reads_probe = False

    name = "oracle-adaptive"
    oracle = True
    needs_real_env = True
    acts = False

    def __init__(
        self,
        env: gym.Env,
        *,
        seed: int | None = None,
        seeds: Sequence[int] = DEFAULT_SEEDS,
        entries: Sequence[str] | None = None,
        static: OracleStaticAgent | None = None,
        probe: bool = False,
        search_every_s: float | None = None,
    ) -> None:
        seeds = check_seeds(seeds)
        if not isinstance(probe, bool):
            raise ValueError(f"probe must be true or false, got {probe!r}")
        search_every_s = check_every_s(search_every_s, "search_every_s")
        super().__init__(
            env,
            seed=seed,
            seeds=seeds,
            entries=None if entries is None else list(entries),
            probe=probe,
        )
        if static is not None and list(static.seeds) != seeds:
            raise ValueError(
                f"static oracle searched seeds {static.seeds}, this one evaluates {seeds}"
            )
        if static is not None and static.probe != probe:
            raise ValueError(
                f"static oracle's episodes ran with probe={static.probe}, this one's would run "
                f"with probe={probe}: one search, one setting"
            )
        self.seeds = seeds
        #: whether the forked episodes run the probe (``probe``)
        self.probe = probe
        #: a search boundary at least this often, s of training time (None: at condition
        #: changes only)
        self.search_every_s = search_every_s
        self.static = static or OracleStaticAgent(env, seeds=seeds, entries=entries, probe=probe)
        self.entries = list(self.static.entries)
        #: per seed, the schedule found (empty before ``learn``)
        self.schedules: dict[int, SeedSchedule] = {}
        #: wall time of the search (the static search's own cost not included), s
        self.search_cost_s: float | None = None
        #: ``env.step`` calls of the search (static search included when run here)
        self.search_decisions = 0
        #: training time the search's decisions took, s
        self.search_train_time_s = 0.0
        # (condition, entry) -> the shortest decision seen: bounds hopeless candidates
        self._decision_s: dict[tuple[str, str], float] = {}

    @property
    def display_name(self) -> str:
        """``oracle-adaptive (oracle)``: it has seen the evaluation seeds."""
        return f"{self.name} (oracle)"

    @property
    def base(self) -> str:
        """The base entry: ``oracle-static``'s best."""
        if not self.static.ranking:
            raise RuntimeError("oracle-adaptive has no base before learn()")
        return self.static.ranking[0].config

    @property
    def preparation(self) -> Preparation:
        """What preparing it cost: its search's wall time and decisions."""
        return Preparation(self.search_cost_s, int(self.search_decisions))

    # -- search -----------------------------------------------------------------------
    def learn(
        self,
        total_timesteps: int | None = None,
        progress_bar: bool = False,
        callback: LearnCallback | None = None,
        on_phase: Callable[[float], Any] | None = None,
    ) -> OracleAdaptiveAgent:
        """Find every evaluation seed's schedule (see the module docstring).

        Args:
            total_timesteps: unused (the search is complete by construction); must be
                None.
            progress_bar: a progress bar over seeds and phases.
            callback: ``callback(step) -> bool`` after every decision of the search
                (``timestep`` counts its decisions); ``False`` stops it with an error.
            on_phase: ``on_phase(n)`` as ``n`` search phases are decided (a seed whose
                search reaches the target early counts the rest at once): the
                evaluation's progress bar over :meth:`planned_phases`.

        Returns:
            self, with :attr:`schedules` and the search cost set.

        Raises:
            ValueError: ``total_timesteps`` is not None.
            TypeError: the env cannot fork episodes (not ``commgym/AllReduce``).
            RuntimeError: the callback stopped the search.
        """
        if total_timesteps is not None:
            raise ValueError(
                f"oracle-adaptive searches every phase completely; total_timesteps must be "
                f"None, got {total_timesteps!r}"
            )
        env = self._require_env()
        for method in ("snapshot", "restore", "drop_snapshots", "episode_phases"):
            if not hasattr(type(env.unwrapped), method):
                raise TypeError(
                    f"oracle-adaptive forks episodes and needs the real env "
                    f"(commgym/AllReduce); {type(env.unwrapped).__name__} has no {method}"
                )
        if not self.static.ranking:
            self.static.learn(progress_bar=progress_bar)
            self.search_decisions += self.static.search_decisions
            self.search_train_time_s += self.static.search_train_time_s
        cfg = env.unwrapped.config
        target = cfg.target_loss
        t0 = time.perf_counter()
        labels = {}
        for s in self.seeds:
            env.reset(seed=s, options={"probe": self.probe})
            labels[s] = self._phases(env)
        phased = [s for s in self.seeds if len(labels[s]) > 1]
        bar = (
            Progress(sum(len(labels[s]) for s in phased) or 1, type(self).__name__)
            if progress_bar
            else None
        )

        def progress(n: int) -> None:
            for _ in range(n if bar is not None else 0):
                bar.advance()
            if on_phase is not None and n:
                on_phase(n)

        def on_step(step: dict[str, Any]) -> bool:
            self.search_decisions += 1
            if (
                callback is not None
                and callback({**step, "timestep": self.search_decisions}) is False
            ):
                raise RuntimeError(
                    f"oracle-adaptive stopped by its callback after {self.search_decisions} "
                    "decisions"
                )
            return True

        try:
            for s in phased:
                self.schedules[s] = self._search_seed(env, s, target, on_step, progress)
            self._contextual([s for s in self.seeds if s not in phased], labels)
        finally:
            env.unwrapped.drop_snapshots()
            self.search_cost_s = time.perf_counter() - t0
            if bar is not None:
                bar.close()
        return self

    def planned_phases(self) -> int:
        """Search phases :meth:`learn` decides over its seeds (its progress bar's total).

        Seeds whose conditions never change and no ``search_every_s`` get the contextual
        choice and count none. Read from the config as the env resolves each seed's
        episode (:func:`~commgym.env.sim.episode_conditions`), without a reset.
        """
        from commgym.env.schedule import episode_phases
        from commgym.env.sim import episode_conditions, episode_seed_of

        cfg = self._require_env().unwrapped.config
        n = 0
        for s in self.seeds:
            conditions = episode_conditions(cfg, episode_seed_of(s))
            phases = split_phases(
                episode_phases(cfg, *conditions), self.search_every_s, cfg.time_budget_s
            )
            n += len(phases) if len(phases) > 1 else 0
        return n

    def _phases(self, env: gym.Env) -> list[tuple[float, str]]:
        """The running episode's condition phases, split every ``search_every_s``."""
        core = env.unwrapped
        return split_phases(
            core.episode_phases, self.search_every_s, float(core.config.time_budget_s)
        )

    def _contextual(self, seeds: list[int], labels: dict[int, list[tuple[float, str]]]) -> None:
        """Best entry per condition over the seeds whose episode drew that condition."""
        if not seeds:
            return
        times: dict[str, dict[int, float]] = {}
        budget = float(self.env.unwrapped.config.time_budget_s)
        for row in self.static.ranking:
            for ep in row.episodes:
                t = ep.time_to_target_s
                times.setdefault(row.config, {})[int(ep.seed)] = budget if t is None else t
        by_condition: dict[str, list[int]] = {}
        for s in seeds:
            by_condition.setdefault(labels[s][0][1], []).append(s)
        for condition, group in by_condition.items():
            # ties keep oracle-static's order (its ranking is the tie-break)
            best = min(
                (row.config for row in self.static.ranking),
                key=lambda e: float(np.mean([times[e][s] for s in group])),
            )
            for s in group:
                phase = PhaseChoice(0.0, condition, best)
                self.schedules[s] = SeedSchedule(s, "context", (phase,), None)

    def _search_seed(
        self, env: gym.Env, seed: int, target: float | None, on_step: Any, progress: Any
    ) -> SeedSchedule:
        """The rollout algorithm over one seed's phases (forks from snapshots)."""
        core = env.unwrapped
        base = StaticAgent(env, preset=self.base)
        candidates = [self.base] + [e for e in self.entries if e != self.base]
        agents = {e: StaticAgent(env, preset=e) for e in candidates}
        # probe-free, as the static entries it extends and its schedule's re-run (unless
        # a learner that reads the probe learns from these episodes: ``probe``)
        obs, info = env.reset(seed=seed, options={"probe": self.probe})
        phases = self._phases(env)
        choices: list[PhaseChoice] = []
        segments: list[Episode] = []
        advanced = 0  # phases reported to ``progress``
        for k, (start_s, condition) in enumerate(phases):
            end_s = phases[k + 1][0] if k + 1 < len(phases) else None
            if end_s is not None and float(info.get("train_time_s", 0.0)) >= end_s:
                progress(1)
                advanced += 1
                continue  # a long decision of the phase before ran past this phase
            root = core.snapshot()
            root_state = (obs, info)
            best: tuple[float, str, Episode | None, str | None] = (math.inf, self.base, None, None)
            base_end: tuple[float, float] | None = None
            tried: list[tuple[str, float | None]] = []
            for entry in candidates:
                t_now = float(root_state[1].get("train_time_s", 0.0))
                shortest = self._decision_s.get((condition, entry))
                if entry != self.base and shortest is not None and t_now + shortest >= best[0]:
                    # one decision of it under this condition already ends after the best
                    # time to target found: it cannot win (a bound, not a guess)
                    tried.append((entry, None))
                    continue
                obs_r = core.restore(root)
                seg = rollout(
                    env,
                    agents[entry],
                    start=(obs_r, root_state[1]),
                    target_loss=target,
                    max_train_time_s=end_s,
                    on_step=on_step,
                )
                self.search_train_time_s += seg.train_time_s - t_now
                for st in seg.steps:  # the shortest decision each entry took per condition
                    key = (st.condition or condition, entry)
                    dt = float(st.measured.train_time_s)
                    self._decision_s[key] = min(dt, self._decision_s.get(key, math.inf))
                t_total, snap = self._score(env, seg, base, best[0], base_end, target, on_step)
                if entry == self.base and seg.steps:
                    base_end = (seg.train_time_s, seg.final_eval_loss)
                tried.append((entry, None if not math.isfinite(t_total) else t_total))
                if t_total < best[0] or (best[2] is None and entry == self.base):
                    best = (t_total, entry, seg, snap)
            _, entry, seg, snap = best
            choices.append(PhaseChoice(start_s, condition, entry, tuple(tried)))
            progress(1)
            advanced += 1
            if seg is None or not seg.steps:
                break
            segments.append(seg)
            if snap is None:  # the winner ended the episode (target, budget, failure)
                break
            obs = core.restore(snap)
            info = seg.final_info or info
            core.drop_snapshots()  # the phase is decided: its forks are no longer needed
        progress(len(phases) - advanced)  # the phases after the target: not needed
        return SeedSchedule(seed, "phases", tuple(choices), _join(seed, segments), tuple(phases))

    def _score(
        self,
        env: gym.Env,
        seg: Episode,
        base: StaticAgent,
        best_s: float,
        base_end: tuple[float, float] | None,
        target: float | None,
        on_step: Any,
    ) -> tuple[float, str | None]:
        """Time to target of "this segment, then the base"; the segment end's snapshot."""
        core = env.unwrapped
        if seg.time_to_target_s is not None:
            return seg.time_to_target_s, None
        if seg.reason is not None or not seg.steps:  # the episode ended without the target
            return math.inf, None
        if base_end is not None and (
            seg.train_time_s >= base_end[0] and seg.final_eval_loss >= base_end[1]
        ):
            return math.inf, None  # dominated by the base's own segment: not continued
        snap = core.snapshot()
        cont = rollout(
            env,
            base,
            start=(seg.final_obs, seg.final_info),
            target_loss=target,
            max_train_time_s=best_s if math.isfinite(best_s) else None,
            on_step=on_step,
        )
        self.search_train_time_s += cont.train_time_s - seg.train_time_s
        t = cont.time_to_target_s
        return (math.inf if t is None else t), snap

    # -- evaluation -------------------------------------------------------------------
    def for_seed(self, seed: int) -> StepAgent:
        """The agent that plays ``seed``'s schedule (a :class:`ScheduleAgent`).

        Raises:
            KeyError: ``seed`` is not one of the searched seeds.
        """
        return ScheduleAgent(self._require_env(), self.full_schedule(seed))

    def full_schedule(self, seed: int) -> list[tuple[float, str]]:
        """``seed``'s schedule over the whole budget, as its re-run plays it.

        The searched phases' entries, then, from the first phase the search did not
        need (it reached the target before), the entry chosen last for that phase's
        condition (the base entry for a condition the search never met): a re-run that
        trains slower than its search switches with the link in force instead of running
        its last entry into a phase it was never chosen for.

        Raises:
            KeyError: ``seed`` is not one of the searched seeds.
        """
        if int(seed) not in self.schedules:
            raise KeyError(
                f"oracle-adaptive has no schedule for seed {seed}; searched: "
                f"{sorted(self.schedules) or 'none yet (call learn())'}"
            )
        sched = self.schedules[int(seed)]
        out = list(sched.schedule)
        last = sched.phases[-1].start_s
        by_condition = {p.condition: p.entry for p in sched.phases}  # the latest per condition
        for start_s, condition in sched.conditions:
            if start_s > last:
                out.append((start_s, by_condition.get(condition, self.base)))
        return out

    def contextual_groups(self) -> dict[str, list[int]]:
        """Condition -> the seeds whose episode drew it (the contextual seeds only)."""
        groups: dict[str, list[int]] = {}
        for s in self.seeds:
            sched = self.schedules.get(s)
            if sched is not None and sched.mode == "context":
                groups.setdefault(sched.phases[0].condition, []).append(s)
        return groups

    def searched_until_s(self, seed: int) -> float:
        """Training time where ``seed``'s searched phases end (``inf``: they cover it all).

        A re-run that has not reached the target by then plays past its search.
        """
        sched = self.schedules[int(seed)]
        last = sched.phases[-1].start_s
        later = [t for t, _ in sched.conditions if t > last]
        return min(later) if later else math.inf

    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        raise RuntimeError(
            "oracle-adaptive is a bound found per evaluation seed in hindsight, not a policy: "
            "evaluate it with for_seed(seed) (the evaluation and the leaderboard do)"
        )

    def _get_state(self) -> dict[str, Any]:
        return {
            "static": self.static._get_state(),
            "schedules": [s.to_dict() for s in self.schedules.values()],
            "search_cost_s": self.search_cost_s,
            "search_decisions": self.search_decisions,
            "search_train_time_s": self.search_train_time_s,
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        if not state.get("schedules"):
            return
        self.static._set_state(state["static"])
        self.schedules = {
            s.seed: s for s in (SeedSchedule.from_dict(d) for d in state["schedules"])
        }
        self.search_cost_s = state["search_cost_s"]
        self.search_decisions = int(state["search_decisions"])
        self.search_train_time_s = float(state["search_train_time_s"])


def _join(seed: int, segments: list[Episode]) -> Episode | None:
    """One episode record from consecutive segments of the same episode."""
    if not segments:
        return None
    steps: list[EpisodeStep] = []
    for seg in segments:
        for st in seg.steps:
            steps.append(replace(st, decision=len(steps) + 1))
    last = segments[-1]
    t_target = next((s.time_to_target_s for s in segments if s.time_to_target_s is not None), None)
    return Episode(
        seed=seed,
        decisions=len(steps),
        train_time_s=last.train_time_s,
        time_to_target_s=t_target,
        final_eval_loss=last.final_eval_loss,
        final_eval_acc=last.final_eval_acc,
        bytes_per_step=float(np.mean([float(s.measured.bytes_per_step) for s in steps]))
        if steps
        else 0.0,
        episode_return=sum(s.reward for s in steps),
        reason=last.reason,
        steps=tuple(steps),
        final_obs=last.final_obs,
        final_info=last.final_info,
    )
