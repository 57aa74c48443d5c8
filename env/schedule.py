"""Conditions that change over an episode's training time: fixed, scheduled or drawn per episode.

One form for every condition a scenario varies (the link's rate, straggler jitter):

* a single value (``"100mbit"``, ``"40ms"``): constant;
* a schedule ``[[elapsed_training_s, value], ...]`` (``{"schedule": [...], "shift_s": s}``
  moves every switch after the first by a seeded uniform shift in ``[-s, s]`` per episode);
* ``{"profiles": [value, ...]}``: one value per episode, drawn from the episode seed.

:class:`Condition` parses these once; :meth:`Condition.for_episode` gives the episode's
piecewise-constant :class:`Phases`, which the real env, the surrogate and the oracles read.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = [
    "Condition",
    "Phases",
    "condition_label",
    "episode_phases",
    "episode_seed",
    "check_every_s",
    "means_off",
    "split_phases",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Phases(Generic[T]):
    """A piecewise-constant value over elapsed training time (one episode's).

    Attributes:
        entries: ``(start_s, value)`` pairs, strictly increasing, the first at 0.
    """

    entries: tuple[tuple[float, T], ...]

    def value_at(self, elapsed_s: float) -> T:
        """The value in force after ``elapsed_s`` seconds of training."""
        times = [t for t, _ in self.entries]
        return self.entries[bisect.bisect_right(times, max(0.0, elapsed_s)) - 1][1]

    @property
    def boundaries(self) -> tuple[float, ...]:
        """Training times (s) at which the value switches (the first entry's 0 excluded)."""
        return tuple(t for t, _ in self.entries[1:])


@dataclass(frozen=True)
class Condition(Generic[T]):
    """A condition of a scenario in one of its three forms (see the module docstring).

    Attributes:
        kind: ``"fixed"``, ``"schedule"`` or ``"profiles"``.
        entries: fixed: one ``(0, value)``; schedule: ``(start_s, value)`` pairs;
            profiles: ``(index, value)`` pairs, one per profile.
        shift_s: schedule only: bound of each switch's seeded shift, seconds.
        name: what the condition is called in error messages (``"network"``).
    """

    kind: str
    entries: tuple[tuple[float, T], ...]
    shift_s: float = 0.0
    name: str = "condition"

    def __post_init__(self) -> None:
        if not self.entries:
            raise ValueError(f"{self.name} needs at least one entry")
        if self.kind != "schedule":
            return
        times = [t for t, _ in self.entries]
        if times[0] != 0:
            raise ValueError(f"a {self.name} schedule must start at 0 s, got {times[0]}")
        for prev, cur in itertools.pairwise(times):
            if not cur > prev:
                raise ValueError(f"{self.name} schedule times must strictly increase: {times}")
        shift = self.shift_s
        if isinstance(shift, bool) or not isinstance(shift, int | float) or not shift >= 0:
            raise ValueError(f"{self.name} schedule shift_s must be a number >= 0, got {shift!r}")
        gaps = [cur - prev for prev, cur in itertools.pairwise(times)]
        if shift and gaps and 2 * shift >= min(gaps):
            raise ValueError(
                f"{self.name} schedule shift_s={shift} must be below half the shortest gap "
                f"between switches ({min(gaps)} s in {times}), so shifted switches keep order"
            )

    @classmethod
    def parse(cls, value: Any, parse_value: Callable[[Any], T], name: str) -> Condition[T]:
        """Validates one of the three forms; each value goes through ``parse_value``.

        Raises:
            ValueError: a malformed form or value (the message names ``name``).
        """
        if isinstance(value, dict):
            keys = set(value)
            if keys not in ({"profiles"}, {"schedule"}, {"schedule", "shift_s"}):
                raise ValueError(
                    f"{name} dict must be {{'profiles': [...]}} or {{'schedule': [[t, value], "
                    f"...]}} with an optional 'shift_s' (seconds) next to 'schedule', got "
                    f"{value!r}"
                )
            if "profiles" in value:
                profiles = [parse_value(p) for p in value["profiles"]]
                if not profiles:
                    raise ValueError(f"{name} profiles must not be empty")
                return cls("profiles", tuple(enumerate(profiles)), name=name)  # type: ignore[arg-type]
            return cls._schedule(value["schedule"], value.get("shift_s", 0.0), parse_value, name)
        if isinstance(value, list | tuple):
            return cls._schedule(value, 0.0, parse_value, name)
        return cls("fixed", ((0.0, parse_value(value)),), name=name)

    @classmethod
    def _schedule(
        cls, items: Any, shift_s: Any, parse_value: Callable[[Any], T], name: str
    ) -> Condition[T]:
        entries = []
        for item in items:
            try:
                t, v = item
            except (TypeError, ValueError):
                raise ValueError(
                    f"{name} schedule entries must be (seconds, value) pairs, got {item!r}"
                ) from None
            if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
                raise ValueError(f"{name} schedule time must be a finite number, got {t!r}")
            if t < 0:
                raise ValueError(f"{name} schedule time must be >= 0, got {t!r}")
            entries.append((float(t), parse_value(v)))
        if isinstance(shift_s, int | float) and not isinstance(shift_s, bool):
            shift_s = float(shift_s)  # anything else is refused, not converted, below
        return cls("schedule", tuple(entries), shift_s, name)

    @property
    def values(self) -> list[T]:
        """Every value the condition can take, in order."""
        return [v for _, v in self.entries]

    def for_episode(self, seed: int | None) -> Phases[T]:
        """The episode's phases: a profile drawn, or the schedule's switches shifted.

        Args:
            seed: the episode seed; the same seed always gives the same phases.
        """
        if self.kind == "fixed":
            return Phases(self.entries)
        if self.kind == "profiles":
            return Phases(((0.0, random.Random(seed).choice(self.values)),))
        if not self.shift_s:
            return Phases(self.entries)
        rng = random.Random(seed)
        moved = [self.entries[0]]
        for t, v in self.entries[1:]:
            moved.append((round(t + rng.uniform(-self.shift_s, self.shift_s), 3), v))
        return Phases(tuple(moved))


def means_off(value: Any) -> bool:
    """Whether a condition's value is its "off" form: ``"off"``, ``None`` or ``False``.

    ``False`` because YAML 1.1 (PyYAML) reads an unquoted ``off`` as a boolean, so
    ``stragglers: off`` in a scenario file arrives as ``False``. ``True`` (``on``) is no
    form of any condition and is left to the value's parser to refuse.
    """
    return value is None or value is False or (isinstance(value, str) and value == "off")


def episode_seed(np_random: Any) -> int:
    """The seed of one episode's draws, from the env's generator.

    Both commgym envs call it once per ``reset``, after ``reset(seed=s)`` has seeded
    ``np_random`` (gymnasium's ``seeding.np_random(s)``): the episode's link profile,
    schedule shifts and straggler draws (:meth:`Condition.for_episode`) and the ranks' data
    order all come from it, so a seed means the same episode in the real env and the
    surrogate.

    Args:
        np_random: the env's ``numpy.random.Generator``.

    Returns:
        An int in ``[0, 2**31 - 1)``.
    """
    return int(np_random.integers(0, 2**31 - 1))


def condition_label(cfg: Any, schedule: Any, stragglers: Phases, crossing: Phases, t: float) -> str:
    """The label of the conditions in force after ``t`` s of an episode's training.

    ``"<link>, stragglers <spec>"``: the link spec (``loopback`` when unshaped) and the
    straggler jitter (``off`` without); scenarios with cross traffic append
    ``", cross traffic <spec>"``. The real env and the simulator both label with it, so a
    condition means the same string in both (decisions carry it in ``info["condition"]``).

    Args:
        cfg: the episode's :class:`~commgym.env.config.EnvConfig`.
        schedule: the episode's network schedule (``spec_at(t)``), or None (unshaped).
        stragglers: the episode's straggler phases.
        crossing: the episode's cross-traffic phases.
        t: elapsed training time, seconds.
    """
    net = "loopback" if schedule is None else str(schedule.spec_at(t))
    label = f"{net}, stragglers {stragglers.value_at(t)}"
    if any(c.active for c in cfg.cross_traffic_condition.values):
        label += f", cross traffic {crossing.value_at(t)}"
    return label


def episode_phases(
    cfg: Any, schedule: Any, stragglers: Phases, crossing: Phases
) -> list[tuple[float, str]]:
    """An episode's condition phases: ``(start_training_s, label)`` pairs, first at 0.

    A new phase starts wherever the link, the straggler jitter or the cross traffic
    switches; each is labelled by :func:`condition_label` (arguments as there).
    """
    times = {0.0}
    if schedule is not None:
        times |= {t for t, _ in schedule}
    times |= set(stragglers.boundaries)
    times |= set(crossing.boundaries)
    return [(t, condition_label(cfg, schedule, stragglers, crossing, t)) for t in sorted(times)]


def check_every_s(every_s: Any, name: str = "every_s") -> float | None:
    """A search grid's spacing, s of training: a positive finite number, or None (no grid).

    Raises:
        ValueError: anything else, naming ``name`` and the value.
    """
    if every_s is None:
        return None
    if isinstance(every_s, bool) or not (
        isinstance(every_s, (int, float)) and 0.0 < every_s < math.inf
    ):
        raise ValueError(
            f"{name} (the search grid, s of training) must be a positive number or None "
            f"(search at condition changes only), got {every_s!r}"
        )
    return float(every_s)


def split_phases(
    phases: Sequence[tuple[float, T]], every_s: float | None, budget_s: float
) -> list[tuple[float, T]]:
    """Condition phases with a boundary at least every ``every_s`` inside each.

    Where the best entry depends on the training state (the remaining loss), a schedule
    may switch inside a condition; the oracles search such switches on this grid (the
    real ``oracle-adaptive``'s ``search_every_s``, the simulator's ``best_schedule``).

    Args:
        phases: ``(start_s, label)`` pairs, first at 0, in time order.
        every_s: the longest search phase, s (None: ``phases`` unchanged).
        budget_s: the episode's training-time budget (the last phase's end), s.

    Raises:
        ValueError: ``every_s`` not a positive, finite number (or None).

    Returns:
        ``(start_s, label)`` pairs: each phase split into equal parts of at most
        ``every_s`` (the last runs to ``budget_s``), each repeating its label.
    """
    every_s = check_every_s(every_s)
    if every_s is None:
        return list(phases)
    out = []
    for k, (start, condition) in enumerate(phases):
        end = phases[k + 1][0] if k + 1 < len(phases) else budget_s
        n = max(1, math.ceil((end - start) / every_s - 1e-9))
        out.extend((start + i * (end - start) / n, condition) for i in range(n))
    return out
