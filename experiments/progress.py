"""Progress bars for the CLI's long phases (rich), one look for every phase.

Every phase of a command that can take more than a few seconds (recording real
decisions, fitting the surrogate, learning, tuning a baseline, evaluating on real ranks,
replaying, starting the UI) runs inside :func:`phase`, which shows what is being done,
how far it is and an estimate of the time left (rich's ``TimeRemainingColumn``: the rate
over the last 30 s). Phases of unknown length show a spinner and the elapsed time.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console

__all__ = ["console", "phase"]

#: The console of tables, messages and progress bars; wide enough for the comparison
#: table when output is piped or captured (no terminal).
console = Console(width=None if sys.stdout.isatty() else 160)


@contextlib.contextmanager
def phase(
    description: str,
    total: float | None = None,
    *,
    unit: str = "",
    to: Console | None = None,
) -> Iterator[Callable[[float], None]]:
    """Show a progress bar while the ``with`` block runs.

    Args:
        description: what is being done, e.g. ``"recording real decisions"``.
        total: amount of work in ``unit`` (``None``: unknown, a spinner is shown).
        unit: unit of ``total`` printed after the count (``"decisions"``, ``"s training"``).
        to: the console to draw on (default: :data:`console`).

    Yields:
        ``advance(amount=1)``: records finished work (ignored beyond ``total``).
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        count = (
            MofNCompleteColumn()
            if float(total).is_integer()
            else TextColumn("{task.completed:.1f}/{task.total:.1f}")
        )
        columns += [BarColumn(), count, TextColumn(unit), TaskProgressColumn()]
        columns += [TextColumn("eta"), TimeRemainingColumn(), TextColumn("elapsed")]
    columns.append(TimeElapsedColumn())
    out = to or console
    if not out.is_terminal:
        # piped or logged output gets rich's bar only once, at the end: say what starts now
        out.print(f"{description} ...")
    with Progress(*columns, console=out, transient=False) as progress:
        task = progress.add_task(description, total=total)

        def advance(amount: float = 1.0) -> None:
            t = progress.tasks[0]
            left = (t.total - t.completed) if t.total is not None else amount
            progress.advance(task, min(float(amount), max(left, 0.0)))

        yield advance
        if total is not None:
            progress.update(task, completed=total)
