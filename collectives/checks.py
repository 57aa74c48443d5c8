"""The number checks of every layer: ``check_int(name, value, low, high)``, ``check_float``.

Every constructor and config that takes a count (world size, episodes, seeds, periods,
budgets) checks it here, so a bad one fails the same way everywhere: ``ValueError`` naming
the field and the value, booleans refused (``True`` is an ``int`` to Python, never a
count), NumPy integers accepted. It lives in the lowest package so env, agents and
experiments read it alike (dependencies point one way).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["check_float", "check_int"]


def check_int(name: str, value: Any, low: int, high: int | None = None, note: str = "") -> int:
    """``value`` as an ``int`` if it is an integer in ``[low, high]``; else ``ValueError``.

    Args:
        name: the field, as the message names it.
        value: what was given.
        low: the smallest allowed value.
        high: the largest (``None``: no bound).
        note: words after the bound in the message (``" (decisions)"``).

    Raises:
        ValueError: ``"<name> must be an integer >= <low><note>, got <value!r>"`` (with a
            ``high``: ``"... an integer in <low>..<high><note> ..."``); booleans count as
            not integers.
    """
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if ok and low <= value and (high is None or value <= high):
        return int(value)
    bound = f">= {low}" if high is None else f"in {low}..{high}"
    raise ValueError(f"{name} must be an integer {bound}{note}, got {value!r}")


def check_float(
    name: str, value: Any, low: float, *, strict: bool = False, note: str = ""
) -> float:
    """``value`` as a ``float`` if it is a finite real number ``>= low``; else ``ValueError``.

    Args:
        name: the field, as the message names it.
        value: what was given.
        low: the bound.
        strict: the bound itself is refused (``> low``).
        note: words after the bound in the message (``" (seconds)"``).

    Raises:
        ValueError: ``"<name> must be a finite number > <low><note>, got <value!r>"``
            (``>=`` unless ``strict``); booleans, strings, NaN and infinities count as not
            numbers.
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok and math.isfinite(value) and (value > low if strict else value >= low):
        return float(value)
    raise ValueError(
        f"{name} must be a finite number {'>' if strict else '>='} {low:g}{note}, got {value!r}"
    )
