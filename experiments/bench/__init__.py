"""Benchmarks, one module per ``commgym bench`` command (measured side by side in one run).

=============================  ==============================================================
command                        module
=============================  ==============================================================
``commgym bench sync``         :mod:`~commgym.experiments.bench.sync`: torch DDP vs the
                               synchronizer on the same ranks, model and batches
``commgym bench env``          :mod:`~commgym.experiments.bench.env`: env-step wall time vs
                               the ranks' own training time
``commgym bench kernels``      :mod:`~commgym.experiments.bench.kernels`: compression kernels
                               next to a copy of the same buffer
``commgym bench netem``        :mod:`~commgym.experiments.bench.netem`: all-reduce bus
                               bandwidth over emulated links
``commgym bench collectives``  :mod:`~commgym.experiments.bench.collectives`: all-reduce /
                               all-gather timings and the surrogate's alpha-beta prior
``commgym bench surrogate``    :mod:`~commgym.experiments.bench.surrogate`: Surrogate-v1 env
                               steps per second
``commgym bench surrogate-``   :mod:`~commgym.experiments.bench.surrogate_holdout`: held-out
``holdout``                    accuracy of the surrogate (rates, seeds, configurations)
``commgym bench executor``     :mod:`~commgym.experiments.bench.executor`: episodes per
                               minute, local vs env actors on Ray, the driver's overhead
=============================  ==============================================================

Benchmarks that need ranks start them the one way the env does: a
:class:`~commgym.env.cluster.Cluster` of :mod:`commgym.env.worker` ranks (torchrun, over
emulated links when asked), sending the worker's benchmark commands
(:mod:`commgym.env.rank_bench`). The commands and their option tables are
:mod:`~commgym.experiments.bench.commands`; ``python -m commgym.experiments.bench`` runs the
same group.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

__all__ = ["write_json"]


def write_json(result: Any, json_path: str | Path | None, console: Console | None = None) -> None:
    """Write a benchmark result as JSON (parents created) when ``json_path`` is given."""
    if json_path is None:
        return
    path = Path(json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=float))
    if console is not None:
        console.print(f"[dim]wrote {path}[/dim]")
