"""The simulator's own oracles: every menu entry's time to target, and the best schedule.

Both run the pure dynamics of :class:`~commgym.env.sim.model.SimModel` on the conditions
the env config resolves for each episode seed (:func:`~commgym.env.sim.env.episode_conditions`),
with the real env's rules: the link applies from the first decision that starts at or
after a switch, the time to target is the training time of the first decision whose
held-out loss is ``<= target_loss``, the episode is truncated at ``time_budget_s`` (a miss
counts as the budget in means), and seeds are ``env.reset`` seeds (the episode seed is
drawn from them as the envs draw it).

* :func:`static_ranking`: ``oracle-static`` in the simulator: every entry on every seed,
  ranked by the real oracle's rule (:meth:`~commgym.agents.oracle.OracleEntry.rank_key`:
  seeds missed, mean time with misses at the budget, mean final loss).
* :func:`adaptive_times`: ``oracle-adaptive`` in the simulator. A schedule (links that
  switch inside an episode): dynamic programming over the phase sequence, one entry per
  phase as the real oracle plays them, exact for the simulator's deterministic dynamics:
  the states reached at each phase boundary (training time, held-out loss, last entry) are
  kept where no other state with the same last entry is both earlier and lower (a Pareto
  front), and every entry is tried from each. Conditions drawn per episode (``profiles``)
  or fixed: the contextual oracle, the best entry per drawn condition by its mean over that
  condition's seeds. (The real oracle-adaptive is greedy over phases, so it can only be
  slower than this optimum.)
* :func:`best_schedule`: that dynamic programme's schedule itself, and with
  ``reaction_lag=1`` the best schedule of a *reactive* player: the first decision that starts
  in a new link phase keeps the previous entry, because a policy learns of a new link only
  from the observation after a decision on it. The anticipating optimum is the headroom's
  bound; the reactive one is what a policy that reads the link (and knows everything else)
  can reach, and the expert behaviour cloning imitates (:mod:`commgym.agents.imitation`).
  Where each episode draws its link (``profiles``), a reactive player's first decision is
  blind too: it plays one ``opening`` entry on every seed, and :func:`reactive_opening` is
  the best such entry (the reactive bound of a lottery of links).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.utils import seeding

from commgym.env.schedule import episode_seed as draw_episode_seed
from commgym.env.schedule import split_phases
from commgym.env.sim.env import episode_conditions
from commgym.env.sim.model import SimModel

__all__ = [
    "EntryTimes",
    "adaptive_times",
    "best_schedule",
    "best_schedule_time",
    "episode_seed_of",
    "headroom",
    "reactive_opening",
    "simulate",
    "static_ranking",
]

#: States kept per (phase, last entry) in the dynamic programme.
MAX_FRONT = 64


def episode_seed_of(reset_seed: int) -> int:
    """The episode seed an env draws after ``reset(seed=reset_seed)`` (both envs draw it so)."""
    rng, _ = seeding.np_random(int(reset_seed))
    return draw_episode_seed(rng)


@dataclass(frozen=True)
class EntryTimes:
    """One entry's simulated episodes over the seeds (a row of the ranking).

    Attributes:
        config: the entry, ``str(CommConfig)``.
        times_s: per seed, time to target (``None``: missed).
        final_losses: per seed, the last held-out loss.
        budget_s: the env's time budget (what a miss counts as).
    """

    config: str
    times_s: tuple[float | None, ...]
    final_losses: tuple[float, ...]
    budget_s: float

    @property
    def mean_s(self) -> float:
        """Mean time to target, misses at the budget."""
        return float(np.mean([self.budget_s if t is None else t for t in self.times_s]))

    @property
    def missed(self) -> int:
        """Seeds that missed the target."""
        return sum(t is None for t in self.times_s)

    def rank_key(self) -> tuple[int, float, float]:
        """The real oracle-static's ranking rule."""
        return (self.missed, self.mean_s, float(np.mean(self.final_losses)))


class _Run:
    """Conditions and constants of one episode seed."""

    def __init__(
        self,
        model: SimModel,
        cfg: Any,
        reset_seed: int | None,
        probe_bytes: int,
        episode_seed: int | None = None,
        every_s: float | None = None,
    ) -> None:
        self.model = model
        self.cfg = cfg
        if episode_seed is None:
            episode_seed = episode_seed_of(int(reset_seed))  # type: ignore[arg-type]
        schedule, _, _ = episode_conditions(cfg, episode_seed)
        self.schedule = schedule
        links = [(0.0, None)] if schedule is None else [(float(t), s) for t, s in schedule]
        # the link phases, split into search phases of at most every_s (a phase of the
        # grid keeps its link; ``link`` says which link phase each grid phase belongs to)
        budget = float(cfg.time_budget_s)
        grid = split_phases([(t, i) for i, (t, _) in enumerate(links)], every_s, budget)
        self.starts = [t for t, _ in grid]
        self.link = [i for _, i in grid]
        self.rates = [None if links[i][1] is None else links[i][1].rate_bit_s for i in self.link]
        self.timings = [model.timings(r) for r in self.rates]
        self.probe = [model.probe_s(probe_bytes, r) for r in self.rates]
        self.budget = float(cfg.time_budget_s)
        self.target = -math.inf if cfg.target_loss is None else float(cfg.target_loss)

    def phase(self, t: float) -> int:
        return int(np.searchsorted(self.starts, max(t, 0.0), side="right")) - 1

    def decision(
        self, k: int, prev: int, loss: float, t: float, fresh: bool = False
    ) -> tuple[float, float]:
        """``(new training time, new loss)`` after one decision of ``k`` starting at ``t``.

        ``fresh``: the decision before switched into ``prev`` (its second decision's cost).
        """
        i = self.phase(t)
        switched = prev >= 0 and prev != k
        dt = self.timings[i][k].train_s + self.probe[i]
        if switched:
            dt += self.model.switch_s(prev, k, self.rates[i])
        return t + dt, self.model.next_loss(k, loss, prev, fresh)


def simulate(
    model: SimModel,
    cfg: Any,
    reset_seed: int,
    schedule: Sequence[tuple[float, int]],
    probe_bytes: int = 0,
    reaction_lag: int = 0,
    opening: int | None = None,
) -> tuple[float | None, float, float]:
    """One simulated episode of a piecewise-constant schedule of flat entries.

    Args:
        model: the dynamics.
        cfg: the env config (conditions, budget, target).
        reset_seed: the ``env.reset`` seed.
        schedule: ``(start_s, flat entry)`` pairs from 0 s (a static entry: one pair).
        probe_bytes: the probe each decision runs (0: a probe-free player).
        reaction_lag: 1: the first decision starting in a new link phase keeps the
            previous decision's entry (:func:`best_schedule`'s rule); 0: it does not.
        opening: the flat entry of the episode's first decision (``None``: the schedule's);
            ``schedule`` then applies from the second decision and may be empty where the
            opening alone reaches the target.

    Returns:
        ``(time to target or None, final held-out loss, final training time)``.
    """
    run = _Run(model, cfg, reset_seed, probe_bytes)
    starts = [s for s, _ in schedule]
    t, loss, prev, prev_phase = 0.0, model.progress.initial_loss, -1, 0
    fresh = False  # the last decision switched entries
    while True:
        if opening is not None and prev < 0:
            k = opening
        else:
            k = schedule[int(np.searchsorted(starts, t, side="right")) - 1][1]
        phase = run.phase(t)
        if reaction_lag and prev >= 0 and phase != prev_phase:
            k = prev
        prev_phase = phase
        t, loss = run.decision(k, prev, loss, t, fresh)
        fresh, prev = prev >= 0 and k != prev, k
        if loss <= run.target:
            return t, loss, t
        if t >= run.budget:
            return None, loss, t


def static_ranking(
    model: SimModel, cfg: Any, seeds: Sequence[int], probe_bytes: int = 0
) -> list[EntryTimes]:
    """Every flat entry on every seed, best first (the real oracle-static's rule)."""
    rows = []
    for k, entry in enumerate(model.entries):
        res = [simulate(model, cfg, s, [(0.0, k)], probe_bytes) for s in seeds]
        rows.append(
            EntryTimes(
                entry,
                tuple(r[0] for r in res),
                tuple(r[1] for r in res),
                float(cfg.time_budget_s),
            )
        )
    return sorted(rows, key=EntryTimes.rank_key)


#: A state of the dynamic programme: (training time, loss, last entry, schedule, whether
#: the last decision switched into that entry, the link phase the last decision started in).
_State = tuple[float, float, int, tuple, bool, int]


def _front(
    states: list[_State], after_switch: Sequence[float], by_link: bool = False
) -> list[_State]:
    out: list[_State] = []
    by_prev: dict[tuple[int, bool, int], list[_State]] = {}
    for s in states:
        # a last entry just switched into whose next decision costs something is another
        # state; where it costs nothing (the pair form: every entry) the groups are the
        # old ones, so such calibrations plan exactly as before. A reactive player whose
        # last decision started on another link lags where this one does not (by_link).
        key = (s[2], s[4] and after_switch[s[2]] > 0.0, s[5] if by_link else 0)
        by_prev.setdefault(key, []).append(s)
    for group in by_prev.values():
        group.sort(key=lambda s: (s[0], s[1]))
        best = math.inf
        kept = []
        for s in group:
            if s[1] < best:
                kept.append(s)
                best = s[1]
        out.extend(kept[:MAX_FRONT])
    return out


def best_schedule(
    model: SimModel,
    cfg: Any,
    reset_seed: int | None = None,
    probe_bytes: int = 0,
    *,
    episode_seed: int | None = None,
    reaction_lag: int = 0,
    opening: int | None = None,
    every_s: float | None = None,
) -> tuple[float | None, list[tuple[float, int]]]:
    """The best one-entry-per-phase schedule on one episode (the dynamic programme).

    Exact for the simulator's deterministic dynamics (module docstring): the states at each
    phase boundary are kept on a Pareto front of (training time, loss) per last entry (and,
    where the entry's switch costs its next decision, whether the last decision switched
    into it), each with the schedule that reached it.

    Args:
        model: the dynamics.
        cfg: the env config (conditions, budget, target).
        reset_seed: the ``env.reset`` seed (the episode seed is drawn from it as the envs
            draw it); or give ``episode_seed`` itself (an env already reset).
        probe_bytes: the probe each decision runs (0: a probe-free player).
        episode_seed: the episode seed, instead of ``reset_seed``.
        reaction_lag: 0: each phase's entry applies from the phase's first decision (the
            oracle knows when the link switches); 1: the first decision that starts in a
            new phase still plays the previous phase's entry, as a policy that sees the link
            only through the decisions it played must (the observation after a decision
            reports that decision's link): the best schedule of a causal, reactive player
            with perfect knowledge of everything else.
        opening: the flat entry the first decision plays whatever the link (a player
            that has observed nothing yet, where each episode draws its link); the
            schedule then starts at the second decision. ``None``: the first decision
            is the first phase's entry (its link is the scenario's, known in advance).
        every_s: also a phase boundary every this many seconds inside each link phase
            (:func:`~commgym.env.schedule.split_phases`; the real ``oracle-adaptive``'s
            ``search_every_s``): where the best entry depends on the remaining loss, a
            schedule can switch where the link never changes. The reaction lag applies
            only where the link changes.

    Returns:
        ``(time to target or None, schedule)``: the schedule as ``(phase start_s, flat
        entry)`` pairs, one per phase the episode reached, which :func:`simulate` replays
        to the same time (with the same ``opening``); an episode that misses the target
        under every schedule gives ``(None, [])``.

    Raises:
        ValueError: neither or both of ``reset_seed`` and ``episode_seed``; a
            ``reaction_lag`` other than 0 or 1; an ``opening`` off the menu.
    """
    if reaction_lag not in (0, 1):
        raise ValueError(f"reaction_lag must be 0 or 1 (decisions), got {reaction_lag!r}")
    if (reset_seed is None) == (episode_seed is None):
        raise ValueError(
            f"give one of reset_seed and episode_seed, got reset_seed={reset_seed!r}, "
            f"episode_seed={episode_seed!r}"
        )
    if opening is not None and not 0 <= opening < len(model.entries):
        raise ValueError(
            f"opening must be a flat entry index in [0, {len(model.entries)}), got {opening!r}"
        )
    run = _Run(model, cfg, reset_seed, probe_bytes, episode_seed, every_s)
    n = len(run.starts)
    link0 = run.link[0]
    states: dict[int, list[_State]] = {
        0: [(0.0, model.progress.initial_loss, -1, (), False, link0)]
    }
    if opening is not None:
        t1, l1 = run.decision(opening, -1, model.progress.initial_loss, 0.0)
        if l1 <= run.target:
            return t1, []
        if t1 >= run.budget:
            return None, []
        # the only state with an empty schedule: the opening, which saw phase 0's link
        states = {run.phase(t1): [(t1, l1, opening, (), False, link0)]}
    best, plan = math.inf, ()
    for i in range(n):
        end = run.starts[i + 1] if i + 1 < n else math.inf
        for t_in, l_in, p0, sched, f_in, seen in _front(
            states.pop(i, []),
            model.after_switch,
            by_link=bool(reaction_lag) and every_s is not None,
        ):
            if t_in >= best:
                continue
            t0, l0, f0, seen0 = t_in, l_in, f_in, seen
            # a reactive player's last decision started on another link (``seen``) than
            # this phase's: the phase's first decision keeps its entry (simulate's rule)
            if reaction_lag and p0 >= 0 and run.link[i] != seen:
                t0, l0 = run.decision(p0, p0, l_in, t_in, f_in)
                f0, seen0 = False, run.link[i]
                if l0 <= run.target:
                    if t0 < best:
                        best, plan = t0, sched
                    continue
                if t0 >= run.budget or t0 >= best:
                    continue
                if t0 >= end:
                    states.setdefault(run.phase(t0), []).append((t0, l0, p0, sched, False, seen0))
                    continue
            for k in range(len(model.entries)):
                t, loss, prev, fresh = t0, l0, p0, f0
                here = (*sched, (run.starts[i], k))
                while True:
                    started = run.link[run.phase(t)]
                    t, loss = run.decision(k, prev, loss, t, fresh)
                    fresh, prev = prev >= 0 and k != prev, k
                    if loss <= run.target:
                        if t < best:
                            best, plan = t, here
                        break
                    if t >= run.budget or t >= best:
                        break
                    if t >= end:
                        states.setdefault(run.phase(t), []).append(
                            (t, loss, k, here, fresh, started)
                        )
                        break
    if not math.isfinite(best):
        return None, []
    return best, list(plan)


def best_schedule_time(
    model: SimModel,
    cfg: Any,
    reset_seed: int,
    probe_bytes: int = 0,
    reaction_lag: int = 0,
    every_s: float | None = None,
) -> float | None:
    """The best one-entry-per-phase schedule's time to target on one seed (DP; None: missed)."""
    return best_schedule(
        model, cfg, reset_seed, probe_bytes, reaction_lag=reaction_lag, every_s=every_s
    )[0]


def reactive_opening(
    model: SimModel,
    cfg: Any,
    seeds: Sequence[int],
    probe_bytes: int = 0,
    every_s: float | None = None,
) -> tuple[int, float]:
    """The best blind first entry of a reactive player over ``seeds`` (a lottery of links).

    Where each episode draws its link, a player that reads the link from its decisions
    plays its first decision without having seen it; this is the entry for that decision
    whose mean time to target over ``seeds`` (each then continued by the reactive best
    schedule, misses at the budget) is least.

    Args:
        model: the dynamics.
        cfg: the env config.
        seeds: the ``env.reset`` seeds to average over (at least one).
        probe_bytes: the probe each decision runs (0: probe-free).
        every_s: the continuation's search grid (:func:`best_schedule`).

    Returns:
        ``(flat entry index, mean time to target s)``.

    Raises:
        ValueError: no seeds.
    """
    if not seeds:
        raise ValueError("reactive_opening needs at least one seed")
    budget = float(cfg.time_budget_s)
    means = []
    for k in range(len(model.entries)):
        ts = [
            best_schedule(model, cfg, s, probe_bytes, reaction_lag=1, opening=k, every_s=every_s)[0]
            for s in seeds
        ]
        means.append(float(np.mean([budget if t is None else t for t in ts])))
    k = int(np.argmin(means))
    return k, means[k]


def adaptive_times(
    model: SimModel,
    cfg: Any,
    seeds: Sequence[int],
    ranking: Sequence[EntryTimes] | None = None,
    probe_bytes: int = 0,
    reaction_lag: int = 0,
    every_s: float | None = None,
) -> list[float | None]:
    """``oracle-adaptive``'s time to target per seed in the simulator (see the module docstring).

    Args:
        model: the dynamics.
        cfg: the env config.
        seeds: the ``env.reset`` seeds (the order of ``ranking``'s per-seed times).
        ranking: :func:`static_ranking` on ``seeds`` (computed when not given).
        probe_bytes: the probe each decision runs (0: probe-free, as the oracles play).
        reaction_lag: 1: the reactive bound (:func:`best_schedule`). On a link schedule
            each phase's first decision keeps the previous entry; where conditions are
            drawn per episode or fixed, the first decision plays the best blind entry
            over ``seeds`` (:func:`reactive_opening`) and each seed is then played by its
            best schedule.
        every_s: the search grid inside each link phase (the scenario's
            ``oracle-adaptive`` ``search_every_s``; :func:`best_schedule`). Given, every
            seed gets its best schedule on that grid, also where the link is drawn per
            episode or fixed (where else the best entry per link is the bound).
    """
    if reaction_lag and cfg.network_plan.kind != "schedule":
        opening, _ = reactive_opening(model, cfg, seeds, probe_bytes, every_s)
        return [
            best_schedule(
                model, cfg, s, probe_bytes, reaction_lag=1, opening=opening, every_s=every_s
            )[0]
            for s in seeds
        ]
    if cfg.network_plan.kind != "schedule" and every_s is None:
        ranking = ranking or static_ranking(model, cfg, seeds, probe_bytes)
        groups: dict[str, list[int]] = {}
        for i, s in enumerate(seeds):
            sched, _, _ = episode_conditions(cfg, episode_seed_of(s))
            label = "loopback" if sched is None else str(sched.spec_at(0.0))
            groups.setdefault(label, []).append(i)
        out: list[float | None] = [None] * len(seeds)
        budget = float(cfg.time_budget_s)
        for idx in groups.values():
            best = min(
                ranking,
                key=lambda r: (
                    sum(r.times_s[i] is None for i in idx),
                    float(np.mean([budget if r.times_s[i] is None else r.times_s[i] for i in idx])),
                ),
            )
            for i in idx:
                out[i] = best.times_s[i]
        return out
    return [best_schedule_time(model, cfg, s, probe_bytes, reaction_lag, every_s) for s in seeds]


def headroom(
    static_mean_s: float, adaptive: Sequence[float | None], budget_s: float
) -> tuple[float, float]:
    """``(T_adaptive, h)``, ``h = (T_static - T_adaptive) / T_static`` (misses at the budget)."""
    t_ad = float(np.mean([budget_s if t is None else t for t in adaptive]))
    return t_ad, (static_mean_s - t_ad) / static_mean_s
