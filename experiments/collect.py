"""``commgym collect``: record real decisions for the surrogate, logged to MLflow.

Runs ``commgym/AllReduce-v1`` under an exploration policy (``sticky``: a uniform menu
entry held for a geometric number of decisions, mean 4, so the data shows both fresh
switches and configurations that ran long enough for error feedback and warm starts to
settle, as a learned policy runs them; ``random``: a new uniform entry every decision;
``grid``: every entry in turn, repeated), records every decision with
:class:`~commgym.env.surrogate.TransitionRecorder`, optionally times all-reduce and
all-gather on the same ranks (for the alpha-beta prior, :func:`bench_collectives`) and
logs the dataset as an MLflow artifact.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from commgym.env import EnvConfig

__all__ = [
    "collect",
    "collect_transitions",
    "concat_streams",
    "fit_surrogate",
    "record_dataset",
    "record_on_ray",
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
    _log_collection(run, path, bench_path, decisions, secs)
    return path, bench_path, secs


def _log_collection(
    run: Any, path: Path, bench_path: Path | None, decisions: int, secs: float
) -> None:
    """Both files and ``collect/*`` metrics into ``run`` (``None``: nothing logged)."""
    if run is not None:
        for f in (bench_path, path):
            if f is not None:
                run.log_artifact(f)
        run.log_metrics({"collect/decisions": decisions, "collect/seconds": secs}, step=0)


def record_on_ray(
    executor: Any,
    config: EnvConfig,
    out: str | Path,
    decisions: int,
    policy: str = "sticky",
    seed: int = 0,
    bench: bool = True,
    run: Any = None,
    on_stream: Callable[[float], None] | None = None,
) -> tuple[Path, Path | None, float]:
    """:func:`record_dataset` in parallel streams on the env actors of a Ray executor.

    One stream per env actor (``executor.envs``, or as many as the cluster holds, at
    most ``decisions``): stream ``k`` records its share of ``decisions`` from seed
    ``seed + k`` (one stream: the very recording :func:`record_dataset` makes here);
    the first also times the collectives. The streams land in ``out`` one after another,
    episodes renumbered (:func:`concat_streams`).

    Args:
        executor: a :class:`~commgym.experiments.executor.RayExecutor`.
        config: the env configuration recorded.
        out: transitions file (CSV); the collective timings go next to it.
        decisions: real decisions in all.
        policy: exploration policy (:data:`POLICIES`).
        seed: seed of the first stream.
        bench: time all-reduce / all-gather first (in the first stream).
        run: a ``RunLogger`` for the files and ``collect/*`` metrics, or ``None``.
        on_stream: called with a stream's decisions when it is in (progress display).

    Returns:
        ``(transitions path, bench path or None, wall seconds)``.
    """
    out = Path(out)
    if out.suffix == ".parquet":
        raise ValueError("parallel recording writes CSV; give --out a .csv file")
    wanted = executor.envs if executor.envs is not None else executor.capacity(config)
    k = max(1, min(wanted, decisions))
    shares = [decisions // k + (i < decisions % k) for i in range(k)]
    jobs = [(n, policy, seed + i, bench and i == 0) for i, n in enumerate(shares)]
    t0 = time.perf_counter()
    texts, bench_text = [], None
    for i, (text, timings, _) in executor.run(config, record_stream, jobs):
        texts.append(text)
        bench_text = timings if i == 0 else bench_text
        if on_stream is not None:
            on_stream(shares[i])
    secs = time.perf_counter() - t0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(concat_streams(texts))
    bench_path = None
    if bench_text is not None:
        bench_path = out.with_suffix(".bench.json")
        bench_path.write_text(bench_text)
    _log_collection(run, out, bench_path, decisions, secs)
    return out, bench_path, secs


def record_stream(
    env: Any, decisions: int, policy: str, seed: int, bench: bool
) -> tuple[str, str | None, float]:
    """A recording cell (runs in an env actor): :func:`~commgym.experiments.collect.record_dataset`.

    Returns:
        ``(transitions CSV text, collective timings JSON text or None, seconds)``.
    """
    with tempfile.TemporaryDirectory(prefix="commgym-record-") as tmp:
        path, bench_path, secs = record_dataset(
            env, Path(tmp) / "transitions.csv", decisions, policy, seed, bench
        )
        return (
            Path(path).read_text(),
            None if bench_path is None else Path(bench_path).read_text(),
            secs,
        )


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


def fit_surrogate(
    data: list[str | Path], out: str | Path, bench: str | Path | None = None, menu: Any = None
) -> Any:
    """Fit a :class:`~commgym.env.surrogate.SurrogateModel` and save it to ``out``.

    Args:
        data: transition files.
        out: model file (joblib).
        bench: JSON of ``[kind, world_size, bytes, seconds]`` samples for the prior.
        menu: action menu (default menu when ``None``).
    """
    from commgym.env.spaces import ActionMenu
    from commgym.env.surrogate import AlphaBeta, SurrogateModel, read_transitions

    ab = None
    if bench is not None and Path(bench).exists():
        ab = AlphaBeta.fit([tuple(s) for s in json.loads(Path(bench).read_text())])
    model = SurrogateModel(ActionMenu.from_any(menu), alpha_beta=ab).fit(read_transitions(*data))
    model.save(out)
    return model


def collect(
    env_config: EnvConfig | dict[str, Any] | None = None,
    *,
    decisions: int = 200,
    policy: str = "random",
    seed: int = 0,
    out: str | Path = "commgym-out/transitions.csv",
    bench: bool = True,
    tracking_uri: str | None = None,
    experiment: str = "commgym",
    executor: Any = None,
) -> dict[str, Any]:
    """Collect a dataset on real ranks and log it as an MLflow run.

    Args:
        env_config: the scenario the surrogate will stand in for: an ``EnvConfig`` (used
            as it is, e.g. ``load_run_config(...).env_config``), or its fields
            (``workload``, ``world_size``, ``network``, ``steps_per_decision``, ...), e.g.
            the ``env`` section of ``experiments/configs/default.yaml``. Its ``seed`` is
            set to ``seed``.
        decisions: real decisions to record (episodes restart as they end).
        policy: exploration policy, ``"sticky"``, ``"random"`` or ``"grid"``.
        seed: seed of the first episode and of the exploration policy.
        out: transitions file (CSV, or Parquet for ``.parquet``).
        bench: also time all-reduce / all-gather on the same ranks (alpha-beta prior),
            written next to ``out`` as ``.bench.json``.
        tracking_uri: MLflow tracking URI (default store when ``None``).
        experiment: MLflow experiment name.
        executor: a :class:`~commgym.experiments.executor.RayExecutor`: record in
            parallel streams on its env actors (:func:`record_on_ray`); ``None``: here.

    Returns:
        ``{"path", "bench_path", "decisions", "seconds", "run_id"}``.

    Raises:
        ValueError: an invalid env field or exploration policy (before anything runs).
    """
    import gymnasium as gym

    import commgym.env  # noqa: F401 - registers the env
    from commgym.env import EnvConfig
    from commgym.experiments.tracking import Tracker, reproducibility_params

    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid: {list(POLICIES)}")
    out = Path(out)
    if not isinstance(env_config, EnvConfig):
        env_config = EnvConfig(**{**(env_config or {}), "seed": seed})
    elif env_config.seed != seed:
        env_config = dataclasses.replace(env_config, seed=seed)
    tracker = Tracker(tracking_uri, experiment=experiment)
    params = {
        **{k: v for k, v in env_config.to_dict().items() if k != "action_menu"},
        "decisions": decisions, "policy": policy,
    }  # fmt: skip
    env = None if executor is not None else gym.make("commgym/AllReduce-v1", config=env_config)
    try:
        with tracker.start_run(
            f"collect-{policy}", params={**params, **reproducibility_params()},
            tags={"commgym.command": "collect"},
        ) as run:  # fmt: skip
            from commgym.experiments.progress import phase

            with phase(f"recording real decisions ({policy})", decisions, unit="decisions") as adv:
                if executor is None:
                    path, bench_path, secs = record_dataset(
                        env, out, decisions, policy, seed, bench, run, on_step=lambda: adv(1)
                    )
                else:
                    path, bench_path, secs = record_on_ray(
                        executor, env_config, out, decisions, policy, seed, bench, run, adv
                    )
    finally:
        if env is not None:
            env.close()
    return {
        "path": path, "bench_path": bench_path, "decisions": decisions, "seconds": secs,
        "run_id": run.run_id,
    }  # fmt: skip
