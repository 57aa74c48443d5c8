"""Action-independent features a memoryless policy cannot compute from one observation.

A frame stack (``history``) shows a policy the last few decisions; it cannot show how long
the current link has lasted once that is longer than the stack, nor how long the same link
lasted the last time it held. Those are what anticipation needs: where links alternate
(``flaky-link``) the best entry late in a fast phase hedges against the slow one to come,
and the model-predictive agent (:mod:`commgym.agents.mpc`) plans from exactly them (a
link's typical dwell, learned, and this episode's). Aurora's observation was a history of
the last intervals; Pensieve's the last chunks' throughput and download times. The link
clock summarises the whole episode's probe readings in three numbers instead.

The clock reads only the probe all-reduce's bandwidth (``log10_probe_gbps``, which no
action changes: the same 64 KiB buffer every decision) and the training clock
(``elapsed_frac``), so it is the same function on real ranks and in the simulator. Which
link a reading shows is decided one of two ways:

* **by the links' levels** (``levels``: the probe's reading on each link the policy can
  meet, log10 Gbit/s, e.g. from the simulator's calibration, :func:`probe_levels`): a
  reading belongs to the nearest level, and a phase changes where that link changes. The
  split between two links lies halfway (in decades) between their levels, so a reading's
  spread on one link only counts as a change once it crosses half the gap. Measured on real
  ranks (record 2026-12-06_085551_train-flaky-link-clock): the 64 KiB probe on the 10 Gbit/s
  link read 1.6-21.3 ms (median 6.8 ms, 0.22 decades s.d.; 4 ranks on 2 cores), on 10 Mbit/s
  74.6-84.4 ms; the split of the calibrated levels lies at ~25 ms.
* **by a move** (no levels): a reading more than ``change_decades`` from the median of the
  current phase's readings starts a new phase. The first rule used the reading that opened
  the phase, and one low reading there made every later one a "change" (57 changes seen for
  18 on that record).

:class:`FilterClock` gives the same features from the link history of the model-predictive
agent reading its own timing, so a policy can run without the probe.

:class:`LinkClock` is the one place the probe's features are computed: :class:`LinkClockWrapper`
appends them while a policy learns (per env, under SB3's frame stack and normaliser) and
:meth:`commgym.agents.sb3.SB3Agent.predict` appends them while it acts, from the same
state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from commgym.env.spaces import OBSERVATION_FIELDS, ObservationField

__all__ = [
    "FILTER_CLOCK_FIELDS",
    "LINK_CLOCK_FIELDS",
    "FilterClock",
    "LinkClock",
    "LinkClockWrapper",
    "check_levels",
    "clock_fields",
    "clock_space",
    "probe_levels",
]

#: The features the clock appends, in order (units: fractions of the episode's budget).
LINK_CLOCK_FIELDS: tuple[ObservationField, ...] = (
    ObservationField(
        "link_age_frac", "1", 0.0, 1.0,
        "training time since the probe's reading last changed / time_budget_s",
    ),
    ObservationField(
        "link_last_dwell_frac", "1", 0.0, 1.0,
        "how long the current link lasted the last time it held / time_budget_s "
        "(0: not seen before in this episode)",
    ),
    ObservationField(
        "link_changes", "1", 0.0, 1.0, "link changes seen in this episode / 8 (at most 1)"
    ),
)  # fmt: skip

#: What ``link_clock: {reader: mpc, belief: true}`` appends after :data:`LINK_CLOCK_FIELDS`:
#: the filter's own view of the link, which its most probable link (the three fields above)
#: leaves out. Measured on real ranks (records 2026-12-06_134056/135536): while a policy
#: plays an entry whose time is alike on both links (PowerSGD), the filter's readings are
#: unsure, its most probable link stays "fast, for 5 s" where it is "probably slow since
#: 4 s", and a clone of mpc (which plans on the belief and the change probability) went back
#: to a dense entry inside the slow phase.
FILTER_CLOCK_FIELDS: tuple[ObservationField, ...] = (
    ObservationField(
        "link_log10_gbps", "log10 Gbit/s", -3.0, 3.0,
        "the filter's current link rate (0 before a reading; unshaped loopback reads 3)",
    ),
    ObservationField(
        "link_belief", "1", 0.0, 1.0, "the filter's probability of its current link"
    ),
    ObservationField(
        "link_change_prob", "1", 0.0, 1.0,
        "the filter's probability that the link changes by the next decision "
        "(mpc's hazard and learned dwells)",
    ),
)  # fmt: skip


def clock_fields(settings: dict[str, Any] | None) -> tuple[ObservationField, ...]:
    """The fields a ``link_clock`` setting appends to the observation, in order.

    Args:
        settings: the agent's resolved ``link_clock`` (``None``: no clock).

    Returns:
        ``()`` without a clock; :data:`LINK_CLOCK_FIELDS`, followed by
        :data:`FILTER_CLOCK_FIELDS` for ``{reader: mpc, belief: true}``.
    """
    if settings is None:
        return ()
    if settings.get("reader") == "mpc" and settings.get("belief"):
        return LINK_CLOCK_FIELDS + FILTER_CLOCK_FIELDS
    return LINK_CLOCK_FIELDS


_NAMES = [f.name for f in OBSERVATION_FIELDS]
_PROBE = _NAMES.index("log10_probe_gbps")
_ELAPSED = _NAMES.index("elapsed_frac")
#: link changes after which ``link_changes`` reads 1
_CHANGES_SCALE = 8.0


@dataclass
class LinkClock:
    """The link clock of one episode, advanced one observation at a time.

    Args:
        change_decades: without ``levels``, a reading this far (log10 Gbit/s) from the
            median of the current phase's readings starts a new phase. The default 0.5 (a
            factor of 3.2) lies between the probe's spread on one link and the factor of
            ~10 between flaky-link's links as the probe reads them (its 64 KiB all-reduce is
            latency-bound on the fast link).
        levels: the probe's reading (log10 Gbit/s) on each link the episode can meet
            (:func:`probe_levels`); a reading belongs to the nearest one. ``None``: the
            ``change_decades`` rule.

    Raises:
        ValueError: ``change_decades`` not a finite number > 0; ``levels`` not a non-empty
            list of finite numbers.
    """

    change_decades: float = 0.5
    levels: tuple[float, ...] | None = None
    level: float | None = None  # the current phase's link (its level, or its readings' median)
    start: float = 0.0  # elapsed_frac at which the current phase was first read
    changes: int = 0
    dwells: list[tuple[float, float]] | None = None  # (level, length) of ended phases
    readings: list[float] | None = None  # the current phase's readings (the move rule)
    fields: ClassVar[tuple[ObservationField, ...]] = LINK_CLOCK_FIELDS  # what update returns

    def __post_init__(self) -> None:
        c = self.change_decades
        if (
            isinstance(c, bool)
            or not isinstance(c, int | float)
            or not (math.isfinite(c) and c > 0)
        ):
            raise ValueError(f"change_decades must be a finite number > 0, got {c!r}")
        if self.levels is not None:
            self.levels = check_levels(self.levels)
        if self.dwells is None:
            self.dwells = []
        if self.readings is None:
            self.readings = []

    def link_of(self, reading: float) -> float:
        """The link ``reading`` (log10 Gbit/s) shows: its nearest level, or the reading itself."""
        if self.levels is None:
            return reading
        return min(self.levels, key=lambda v: abs(v - reading))

    def _same(self, a: float, b: float) -> bool:
        """Whether two phases' links are the same link."""
        return a == b if self.levels is not None else abs(a - b) <= self.change_decades

    def update(self, observation: np.ndarray) -> np.ndarray:
        """Advance the clock by one observation and return its features.

        Args:
            observation: one commgym observation ``(len(OBSERVATION_FIELDS),)``; a probe
                reading of exactly 0 means no probe ran (the episode's first observation).

        Returns:
            float32 ``(len(LINK_CLOCK_FIELDS),)``: age of the current link, its last dwell,
            changes seen, each in ``[0, 1]``.
        """
        reading = float(observation[_PROBE])
        now = float(observation[_ELAPSED])
        assert self.dwells is not None and self.readings is not None
        if reading != 0.0:
            link = self.link_of(reading)
            if self.level is None:  # the first reading: the phase began with the episode
                self.level, self.readings = link, [reading]
            elif not self._same(link, self.level):
                self.dwells.append((self.level, now - self.start))
                self.level, self.start, self.readings = link, now, [reading]
                self.changes += 1
            elif self.levels is None:
                self.readings.append(reading)
                self.level = float(np.median(self.readings))
        last = 0.0
        if self.level is not None:
            for level, length in reversed(self.dwells):
                if self._same(level, self.level):
                    last = length
                    break
        age = now - self.start
        out = (age, last, min(self.changes / _CHANGES_SCALE, 1.0))
        return np.clip(np.asarray(out, dtype=np.float32), 0.0, 1.0)


class FilterClock:
    """:class:`LinkClock`'s features read from a link filter's history, probe-free.

    The filter is the model-predictive agent reading the link from its decisions' own
    timing (:class:`~commgym.agents.mpc.ModelPredictiveAgent` with ``link_from="timing"``:
    a Bayesian filter over the calibrated links with a hazard and the dwells it learned).
    It is stepped beside the policy, one ``predict`` per observation, and its history of
    the link (since when the current link holds, its completed dwells, the changes) gives
    the three features. The probe all-reduce then need not run at all: on real ranks its
    readings spread over 1.1 decades on a fast link and it costs a decision's share on a
    slow one, where the decision's own timing is measured anyway.

    Args:
        agent: the filter (an mpc agent reading ``"timing"``; its learned dwells set).
        budget_s: the episode's training-time budget, s (the features' unit).
        belief: also return :data:`FILTER_CLOCK_FIELDS` (the filter's link rate, its
            probability, and the probability of a change by the next decision).
    """

    def __init__(self, agent: Any, budget_s: float, belief: bool = False) -> None:
        self.agent = agent
        self.budget_s = float(budget_s)
        self.belief = bool(belief)
        self.fields = LINK_CLOCK_FIELDS + (FILTER_CLOCK_FIELDS if self.belief else ())
        self.state: Any = None
        self._first = True
        #: the filter's expected time to target of every flat entry after the last
        #: :meth:`update`, s (``None`` before its first reading of the link): what its plan
        #: prices each entry at, with the chance that the link changes (``plan_times``)
        self.plan_times: np.ndarray | None = None

    def update(self, observation: np.ndarray) -> np.ndarray:
        """Advance the filter by one observation and return the clock's features.

        Args:
            observation: one commgym observation ``(len(OBSERVATION_FIELDS),)``, unmasked.

        Returns:
            float32 ``(len(self.fields),)``: :meth:`LinkClock.update`'s three, then with
            ``belief`` the filter's view (:data:`FILTER_CLOCK_FIELDS`).
        """
        _, self.state = self.agent.predict(
            observation, self.state, episode_start=np.array([self._first])
        )
        self._first = False
        # this observation's plan (the filter is shared by every row's clock): a shield reads it
        self.plan_times = None if self.agent.plan_times is None else self.agent.plan_times.copy()
        st = self.state or {}
        if "since_s" not in st:  # no reading of the link yet
            return np.zeros(len(self.fields), dtype=np.float32)
        now = float(observation[_ELAPSED]) * self.budget_s
        last = (st["dwells"].get(st["rate"]) or [0.0])[-1]
        out = np.clip(
            np.asarray(
                (
                    (now - st["since_s"]) / self.budget_s,
                    last / self.budget_s,
                    min(st["changes"] / _CHANGES_SCALE, 1.0),
                ),
                dtype=np.float32,
            ),
            0.0,
            1.0,
        )
        if not self.belief:
            return out
        rate, belief, change = self.agent.link_outlook(st, now)
        gbps = 3.0 if rate is None else math.log10(rate / 1e9)
        view = np.asarray((np.clip(gbps, -3.0, 3.0), belief, change), dtype=np.float32)
        return np.concatenate([out, view])


def check_levels(levels: Any) -> tuple[float, ...]:
    """``levels`` as a sorted tuple of floats; ``ValueError`` naming the value if it is not one."""
    ok = (
        isinstance(levels, list | tuple)
        and len(levels) > 0
        and all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for v in levels
        )
    )
    if not ok:
        raise ValueError(
            f"levels must be a non-empty list of finite numbers (the probe's log10 Gbit/s on "
            f"each link), got {levels!r}"
        )
    return tuple(sorted(float(v) for v in levels))


def probe_levels(env: gym.Env, merge_decades: float = 0.1) -> list[float]:
    """The probe's modelled reading on each link a simulator's episodes can meet.

    Args:
        env: a :class:`~commgym.env.sim.SimEnv`, or a wrapper of one.
        merge_decades: levels closer than this (log10 Gbit/s) are one link as the probe
            sees it (above a few hundred Mbit/s the 64 KiB probe fits the link's burst and
            reads alike on every rate); the merged level is their mean.

    Returns:
        Sorted log10 Gbit/s, one per link the probe can tell apart: the calibration's
        modelled probe time on each rate of the config's network plan (unshaped loopback
        included where the plan has it).

    Raises:
        ValueError: ``env`` is not a simulator, or its config runs no probe.
    """
    from commgym.env.spaces import probe_gbps

    sim = env.unwrapped
    model, cfg = getattr(sim, "model", None), getattr(sim, "config", None)
    if model is None or not hasattr(model, "probe_s"):
        raise ValueError(
            f"probe levels come from a simulator's calibration; {type(sim).__name__} is not "
            "commgym/Sim-v1 (give link_clock: {levels: [...]} or {change_decades: x})"
        )
    if not cfg.probe_bytes:
        raise ValueError("the env's config runs no probe (probe_bytes 0): no level to read")
    rates = sorted({s.rate_bit_s for s in cfg.network_plan.specs}, key=lambda r: r or math.inf)
    values = sorted(
        math.log10(probe_gbps(cfg.probe_bytes, model.probe_s(cfg.probe_bytes, r), cfg.world_size))
        for r in rates
    )
    groups: list[list[float]] = []
    for v in values:
        if groups and v - groups[-1][-1] < merge_decades:
            groups[-1].append(v)
        else:
            groups.append([v])
    return [round(sum(g) / len(g), 6) for g in groups]


def clock_space(
    space: gym.spaces.Box, fields: tuple[ObservationField, ...] = LINK_CLOCK_FIELDS
) -> gym.spaces.Box:
    """``space`` (a commgym observation space) with the clock's ``fields`` appended."""
    low = np.concatenate([space.low, [f.low for f in fields]]).astype(np.float32)
    high = np.concatenate([space.high, [f.high for f in fields]]).astype(np.float32)
    return gym.spaces.Box(low, high, dtype=np.float32)


class LinkClockWrapper(gym.ObservationWrapper):
    """The env's observations with :class:`LinkClock`'s features appended.

    Args:
        env: a commgym env (its observation the layout of
            :data:`~commgym.env.spaces.OBSERVATION_FIELDS`), or a wrapper of one.
        change_decades: :class:`LinkClock`'s threshold (without ``levels``).
        levels: :class:`LinkClock`'s links (log10 Gbit/s; ``None``: the threshold rule).
        clock: makes each episode's clock instead (e.g. a :class:`FilterClock`); the two
            settings above are then unused.

    Raises:
        ValueError: the env's observation is not commgym's layout.
    """

    def __init__(
        self,
        env: gym.Env,
        change_decades: float = 0.5,
        levels: list[float] | tuple[float, ...] | None = None,
        clock: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(env)
        shape = getattr(env.observation_space, "shape", None)
        if shape != (len(OBSERVATION_FIELDS),):
            raise ValueError(
                f"the link clock reads commgym's observation layout ({len(OBSERVATION_FIELDS)} "
                f"fields); got an observation space of shape {shape}"
            )
        self.change_decades = change_decades
        self.levels = levels
        self._make = clock if clock is not None else lambda: LinkClock(change_decades, levels)
        self.clock = self._make()
        self.observation_space = clock_space(env.observation_space, self.clock.fields)

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:  # noqa: D102
        self.clock = self._make()
        return super().reset(**kwargs)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """``observation`` with the clock's features appended (float32)."""
        extra = self.clock.update(observation)
        return np.concatenate([np.asarray(observation, dtype=np.float32), extra])
