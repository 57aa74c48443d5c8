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
(``elapsed_frac``), so it is the same function on real ranks and in the simulator. A new
link phase starts where the reading moves more than ``change_decades`` from the reading
that opened the current phase.

:class:`LinkClock` is the one place the features are computed: :class:`LinkClockWrapper`
appends them while a policy learns (per env, under SB3's frame stack and normaliser) and
:meth:`commgym.agents.sb3.SB3Agent.predict` appends them while it acts, from the same
state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from commgym.env.spaces import OBSERVATION_FIELDS, ObservationField

__all__ = ["LINK_CLOCK_FIELDS", "LinkClock", "LinkClockWrapper", "clock_space"]

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

_NAMES = [f.name for f in OBSERVATION_FIELDS]
_PROBE = _NAMES.index("log10_probe_gbps")
_ELAPSED = _NAMES.index("elapsed_frac")
#: link changes after which ``link_changes`` reads 1
_CHANGES_SCALE = 8.0


@dataclass
class LinkClock:
    """The link clock of one episode, advanced one observation at a time.

    Args:
        change_decades: a reading this far (log10 Gbit/s) from the one that opened the
            current phase starts a new phase. The default 0.5 (a factor of 3.2) lies between
            the probe's decision-to-decision spread on one link (~13 %) and the factor of
            ~10 between flaky-link's links as the probe reads them (its 64 KiB all-reduce is
            latency-bound on the fast link).

    Raises:
        ValueError: ``change_decades`` not a finite number > 0.
    """

    change_decades: float = 0.5
    level: float | None = None  # the reading that opened the current phase
    start: float = 0.0  # elapsed_frac at which the current phase was first read
    changes: int = 0
    dwells: list[tuple[float, float]] | None = None  # (level, length) of ended phases

    def __post_init__(self) -> None:
        c = self.change_decades
        if (
            isinstance(c, bool)
            or not isinstance(c, int | float)
            or not (math.isfinite(c) and c > 0)
        ):
            raise ValueError(f"change_decades must be a finite number > 0, got {c!r}")
        if self.dwells is None:
            self.dwells = []

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
        if reading != 0.0:
            if self.level is None:
                self.level = reading  # the first reading: the phase began with the episode
            elif abs(reading - self.level) > self.change_decades:
                assert self.dwells is not None
                self.dwells.append((self.level, now - self.start))
                self.level, self.start = reading, now
                self.changes += 1
        last = 0.0
        if self.level is not None:
            for level, length in reversed(self.dwells or []):
                if abs(level - self.level) <= self.change_decades:
                    last = length
                    break
        age = now - self.start
        out = (age, last, min(self.changes / _CHANGES_SCALE, 1.0))
        return np.clip(np.asarray(out, dtype=np.float32), 0.0, 1.0)


def clock_space(space: gym.spaces.Box) -> gym.spaces.Box:
    """``space`` (a commgym observation space) with the clock's fields appended."""
    low = np.concatenate([space.low, [f.low for f in LINK_CLOCK_FIELDS]]).astype(np.float32)
    high = np.concatenate([space.high, [f.high for f in LINK_CLOCK_FIELDS]]).astype(np.float32)
    return gym.spaces.Box(low, high, dtype=np.float32)


class LinkClockWrapper(gym.ObservationWrapper):
    """The env's observations with :class:`LinkClock`'s features appended.

    Args:
        env: a commgym env (its observation the layout of
            :data:`~commgym.env.spaces.OBSERVATION_FIELDS`), or a wrapper of one.
        change_decades: :class:`LinkClock`'s threshold.

    Raises:
        ValueError: the env's observation is not commgym's layout.
    """

    def __init__(self, env: gym.Env, change_decades: float = 0.5) -> None:
        super().__init__(env)
        shape = getattr(env.observation_space, "shape", None)
        if shape != (len(OBSERVATION_FIELDS),):
            raise ValueError(
                f"the link clock reads commgym's observation layout ({len(OBSERVATION_FIELDS)} "
                f"fields); got an observation space of shape {shape}"
            )
        self.change_decades = change_decades
        self.clock = LinkClock(change_decades)
        self.observation_space = clock_space(env.observation_space)

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:  # noqa: D102
        self.clock = LinkClock(self.change_decades)
        return super().reset(**kwargs)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """``observation`` with the clock's features appended (float32)."""
        extra = self.clock.update(observation)
        return np.concatenate([np.asarray(observation, dtype=np.float32), extra])
