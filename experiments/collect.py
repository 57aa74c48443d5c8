"""``commgym collect``: record real decisions for the surrogate, logged to MLflow.

:func:`collect` records a scenario's decisions under an exploration policy through an
executor (:meth:`~commgym.experiments.executors.Executor.record`: here, or in parallel
streams on Ray's env actors; the recording itself is :mod:`commgym.experiments.recording`)
and logs the dataset as an MLflow artifact; :func:`fit_surrogate` fits the surrogate on it.
The recording names are re-exported here, where they lived before.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from commgym.experiments.executors import LOCAL
from commgym.experiments.recording import (
    POLICIES,
    collect_transitions,
    concat_streams,
    record_dataset,
    record_stream,
)

if TYPE_CHECKING:  # pragma: no cover
    from commgym.env import EnvConfig
    from commgym.experiments.executors import Executor

__all__ = [
    "POLICIES",
    "collect",
    "collect_transitions",
    "concat_streams",
    "fit_surrogate",
    "record_dataset",
    "record_stream",
]


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
    executor: Executor = LOCAL,
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
        executor: where the decisions are recorded
            (:meth:`~commgym.experiments.executors.Executor.record`: here, or in parallel
            streams on Ray's env actors).

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
    env = gym.make("commgym/AllReduce-v1", config=env_config)  # no rank starts before a reset
    try:
        with tracker.start_run(
            f"collect-{policy}", params={**params, **reproducibility_params()},
            tags={"commgym.command": "collect"},
        ) as run:  # fmt: skip
            from commgym.experiments.progress import phase

            with phase(f"recording real decisions ({policy})", decisions, unit="decisions") as adv:
                path, bench_path, secs = executor.record(
                    env, env_config, out, decisions, policy, seed, bench, run, adv
                )
    finally:
        env.close()
    return {
        "path": path, "bench_path": bench_path, "decisions": decisions, "seconds": secs,
        "run_id": run.run_id,
    }  # fmt: skip
