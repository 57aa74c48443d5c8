"""Recording real decisions on an env: the surrogate's data, as every executor records it.

:func:`record_dataset` times the collectives (for the alpha-beta prior) and records
decisions under an exploration policy on an open env (:func:`collect_transitions`;
``sticky``: a uniform menu entry held for a geometric number of decisions, mean 4, so the
data shows both fresh switches and configurations that ran long enough for error feedback
and warm starts to settle, as a learned policy runs them; ``random``: a new uniform entry
every decision; ``grid``: every entry in turn, repeated), each decision recorded with
:class:`~commgym.env.surrogate.TransitionRecorder`;
:func:`record_stream` is the same as a cell an env actor runs, and
:func:`concat_streams` joins parallel streams into one file. ``commgym collect``
(:mod:`commgym.experiments.collect`) runs them through an executor
(:meth:`~commgym.experiments.executors.Executor.record`).
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "POLICIES",
    "STICKY_MEAN_DECISIONS",
    "collect_transitions",
    "concat_streams",
    "log_collection",
    "record_dataset",
    "record_stream",
]

POLICIES = ("sticky", "random", "grid")

#: Mean number of decisions the ``sticky`` policy holds a configuration.
STICKY_MEAN_DECISIONS = 4


def collect_transitions(
    env: Any,
    path: str | Path,
    decisions: int,
    policy: str = "random",
    seed: int = 0,
    on_step: Callable[[], None] | None = None,
) -> Path:
    """Record ``decisions`` real decisions of ``env`` under ``policy`` to ``path``.

    Args:
        env: an (unwrapped or wrapped) ``commgym/AllReduce-v1`` env; not closed here.
        path: CSV or ``.parquet`` output.
        decisions: number of decisions (episodes are reset as they end).
        policy: ``"sticky"``, ``"random"`` or ``"grid"`` (see the module docstring).
        seed: seed of the first episode and of the random policy.
        on_step: called after each decision (progress display).

    Raises:
        ValueError: unknown policy.
    """
    from commgym.env.surrogate import TransitionRecorder

    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid: {list(POLICIES)}")
    rec = TransitionRecorder(env, path)
    nvec = np.asarray(env.action_space.nvec)
    size = int(np.prod(nvec))
    rng = np.random.default_rng(seed)
    rec.reset(seed=seed)
    flat, hold = 0, 0
    for i in range(decisions):
        if policy == "grid":
            flat = i % size
        elif policy == "random" or hold == 0:
            flat = int(rng.integers(size))
            hold = int(rng.geometric(1.0 / STICKY_MEAN_DECISIONS))
        hold -= 1
        a = np.array(np.unravel_index(flat, tuple(int(n) for n in nvec)), dtype=np.int64)
        _, _, term, trunc, _ = rec.step(a)
        if on_step is not None:
            on_step()
        if term or trunc:
            rec.reset()
    return rec.flush()


def record_dataset(
    env: Any,
    out: str | Path,
    decisions: int,
    policy: str = "sticky",
    seed: int = 0,
    bench: bool = True,
    run: Any = None,
    on_step: Callable[[], None] | None = None,
) -> tuple[Path, Path | None, float]:
    """Time the collectives (prior), then record decisions, on an open real env.

    Args:
        env: a ``commgym/AllReduce-v1`` env (possibly wrapped); not closed here.
        out: transitions file; the collective timings go next to it as ``.bench.json``.
        decisions: real decisions to record.
        policy: exploration policy (:data:`POLICIES`).
        seed: seed of the first episode and of the exploration policy.
        bench: time all-reduce / all-gather first (skipped for one rank); each sample
            gets the link rate it ran at (bit/s, ``None`` unshaped) as a fifth element.
        run: a ``RunLogger`` to log both files and ``collect/*`` metrics to, or ``None``.
        on_step: called after each recorded decision (progress display).

    Returns:
        ``(transitions path, bench path or None, seconds)``.
    """
    from commgym.env.surrogate import bench_collectives

    out = Path(out)
    t0 = time.perf_counter()
    env.reset(seed=seed)
    bench_path = None
    if bench and env.unwrapped.config.world_size > 1:
        bench_path = out.with_suffix(".bench.json")
        bench_path.parent.mkdir(parents=True, exist_ok=True)
        net = env.unwrapped.network
        # the timings include the shaped link's wire time: each sample carries the rate it
        # ran at, so AlphaBeta.fit separates the host's own costs from the link's
        rate = None if net is None else net.effective_spec.rate_bit_s
        samples = [[*s, rate] for s in bench_collectives(env.unwrapped.cluster)]
        bench_path.write_text(json.dumps(samples))
    path = collect_transitions(env, out, decisions, policy, seed, on_step)
    secs = time.perf_counter() - t0
    log_collection(run, path, bench_path, decisions, secs)
    return path, bench_path, secs


def log_collection(
    run: Any, path: Path, bench_path: Path | None, decisions: int, secs: float
) -> None:
    """Both files and ``collect/*`` metrics into ``run`` (``None``: nothing logged)."""
    if run is not None:
        for f in (bench_path, path):
            if f is not None:
                run.log_artifact(f)
        run.log_metrics({"collect/decisions": decisions, "collect/seconds": secs}, step=0)


def record_stream(
    env: Any, decisions: int, policy: str, seed: int, bench: bool
) -> tuple[str, str | None, float]:
    """A recording cell (runs in an env actor): :func:`record_dataset`.

    Returns:
        ``(transitions CSV text, collective timings JSON text or None, seconds)``.
    """
    from commgym.env.cluster import scratch_dir

    tmp = scratch_dir("record")  # a killed actor's folder goes at the next one's start
    try:
        path, bench_path, secs = record_dataset(
            env, tmp / "transitions.csv", decisions, policy, seed, bench
        )
        return (
            Path(path).read_text(),
            None if bench_path is None else Path(bench_path).read_text(),
            secs,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def concat_streams(texts: Sequence[str]) -> str:
    """Transition CSVs of parallel recording streams as one file, episodes renumbered.

    Stream ``k``'s episodes follow stream ``k-1``'s (the ``episode`` column counts on),
    so every episode keeps its own number, as in one long recording.
    """
    out = io.StringIO()
    writer: Any = None
    offset = 0
    for text in texts:
        rows = list(csv.DictReader(io.StringIO(text)))
        if writer is None and rows:
            writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
        last = -1
        for row in rows:
            ep = int(row["episode"])
            last = max(last, ep)
            writer.writerow({**row, "episode": ep + offset})
        offset += last + 1
    return out.getvalue()
