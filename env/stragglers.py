"""Straggler jitter: one rank at a time is slow for an iteration (sleep-based, no CPU).

In shared clusters a rank is regularly late for an iteration (a noisy neighbour, a garbage
collection, a slow data-loader fetch, an ECC retry). With an all-reduce every iteration
(sync period 1) every such delay stalls all ranks; with local SGD (period H) the delays of
H iterations only meet at the average, and the slowest rank's *sum* of delays is much
smaller than the sum of per-iteration *maxima* (Wang & Joshi, "Adaptive Communication
Strategies to Achieve the Best Error-Runtime Trade-off in Local-Update SGD", MLSys 2019,
which models exactly this). The delay is a ``time.sleep`` inside the timed iteration, so
it costs no CPU and the measured iteration times stay real.

A spec string: ``"off"``; ``"<delay>"`` (every iteration one rank drawn uniformly sleeps
``delay``); ``"<delay>:p=<prob>"`` (an iteration has a straggler with probability ``prob``).
Delays take ``s``, ``ms`` or ``us``: ``"40ms"``, ``"0.1s:p=0.5"``.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from typing import Any

from commgym.env.schedule import means_off

__all__ = ["StragglerSpec", "StragglerDraw"]

_DELAY_RE = re.compile(r"^(?P<value>\d+(?:\.\d+)?)(?P<unit>s|ms|us)$")
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


@dataclasses.dataclass(frozen=True)
class StragglerSpec:
    """Per-iteration straggler jitter.

    Attributes:
        delay_s: how long the straggling rank sleeps in an iteration, seconds (>= 0).
        prob: probability that an iteration has a straggler, in ``[0, 1]``.
    """

    delay_s: float = 0.0
    prob: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.delay_s) and 0 <= self.delay_s <= 60):
            raise ValueError(f"straggler delay must be in [0, 60] s, got {self.delay_s!r}")
        if not (math.isfinite(self.prob) and 0 <= self.prob <= 1):
            raise ValueError(f"straggler probability must be in [0, 1], got {self.prob!r}")

    @property
    def active(self) -> bool:
        """Whether any iteration can be delayed."""
        return self.delay_s > 0 and self.prob > 0

    @classmethod
    def parse(cls, text: str | bool | StragglerSpec | None) -> StragglerSpec:
        """Parses ``"off"``, ``"40ms"`` or ``"40ms:p=0.5"`` (None and ``"off"``: no jitter).

        ``False`` is ``"off"`` too (:func:`commgym.env.schedule.means_off`).

        Raises:
            ValueError: anything else (the message gives the forms).
        """
        if isinstance(text, cls):
            return text
        if means_off(text):
            return cls()
        forms = "'off', '<delay>' or '<delay>:p=<prob>' with delay like 40ms, 0.1s, 500us"
        if not isinstance(text, str):
            raise ValueError(f"straggler spec must be a string ({forms}), got {text!r}")
        delay, _, rest = text.partition(":")
        m = _DELAY_RE.match(delay.strip())
        prob = 1.0
        if rest:
            key, _, value = rest.partition("=")
            try:
                prob = float(value) if key.strip() == "p" else math.nan
            except ValueError:
                prob = math.nan
        if m is None or not math.isfinite(prob):
            raise ValueError(f"straggler spec must be {forms}, got {text!r}")
        return cls(float(m["value"]) * _UNITS[m["unit"]], prob)

    def __str__(self) -> str:
        if not self.active:
            return "off"
        ms = self.delay_s * 1e3
        delay = f"{ms:g}ms" if ms >= 1 else f"{self.delay_s * 1e6:g}us"
        return delay if self.prob == 1 else f"{delay}:p={self.prob:g}"

    def to_message(self) -> dict[str, Any]:
        """What a ``step`` command carries (plain floats)."""
        return {"delay_s": self.delay_s, "prob": self.prob}


class StragglerDraw:
    """The per-iteration straggler draws of one episode, identical on every rank.

    Every rank seeds it with the episode seed and draws once per iteration, so all ranks
    agree on which rank (if any) is late, whatever the spec in force.

    Args:
        seed: the episode seed.
        world_size: number of ranks.
    """

    def __init__(self, seed: int, world_size: int) -> None:
        self._rng = random.Random(f"straggler/{int(seed)}")
        self._world = world_size

    def getstate(self) -> Any:
        """The generator state (to fork an episode)."""
        return self._rng.getstate()

    def setstate(self, state: Any) -> None:
        """Restore :meth:`getstate` output."""
        self._rng.setstate(state)

    def delay_s(self, rank: int, spec: StragglerSpec) -> float:
        """This iteration's sleep for ``rank`` under ``spec`` (0 for all but the straggler)."""
        u, who = self._rng.random(), self._rng.randrange(self._world)
        return spec.delay_s if (spec.active and u < spec.prob and who == rank) else 0.0
