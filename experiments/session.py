"""What every command that runs real ranks shares: the env, its ranks, the MLflow store.

``commgym train``, ``evaluate``, ``replay`` and ``leaderboard`` each build the real env from
the one resolved config (:func:`make_env`), start its ranks under a spinner and say which
network they run on (:func:`start_ranks`), tell where the runs are logged
(:func:`announce`), and name files after agents (:func:`slug`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from commgym.experiments.config import RunConfig
from commgym.experiments.progress import console, phase

__all__ = ["announce", "make_env", "parent_params", "slug", "start_ranks"]


def make_env(cfg: RunConfig) -> gym.Env:
    """``commgym/AllReduce-v0`` from ``cfg.env_config`` (no rank starts before a reset)."""
    import commgym.env  # noqa: F401 - registers the env

    return gym.make("commgym/AllReduce-v0", config=cfg.env_config)


def start_ranks(cfg: RunConfig, env: gym.Env, executor: Any = None) -> None:
    """Launch the ranks (first reset) under a spinner; say what network they run on.

    With a :class:`~commgym.experiments.executor.RayExecutor` no rank starts here: say
    where the env actors run instead (each launches its own ranks when first used).
    """
    world, plan = cfg.env_config.world_size, cfg.env_config.network_plan
    if executor is not None:
        console.print(executor.summary(cfg.env_config))
        return
    where = "on an emulated network" if plan.emulated else "on loopback"
    with phase(f"starting {world} ranks with torchrun {where}"):
        env.reset(seed=cfg.seed)
    net = getattr(env.unwrapped, "network", None)
    if net is not None:
        d = net.describe()
        shaped = d["effective_spec"]
        note = "" if shaped == d["spec"] else f" (applied: {shaped}; the rest needs sch_netem)"
        console.print(
            f"network: emulated [bold]{d['spec']}[/bold]{note}, {d['world_size']} Linux network "
            f"namespaces ({d['name']}*) on one bridge, every link shaped with tc {d['backend']}"
        )
    elif not plan.emulated:
        console.print("network: loopback, unshaped (--network emulates one; needs root)")


def announce(tracker: Any) -> None:
    """Print where the runs are logged and how to browse them (or that tracking is off)."""
    from commgym.experiments.tracking import ui_command

    if not tracker.enabled:
        console.print(f"MLflow tracking is off: {tracker.tracking_uri} could not be opened")
        return
    console.print(f"MLflow tracking URI: [bold]{tracker.tracking_uri}[/bold]")
    console.print(
        f"open the UI with:    [bold]{ui_command(tracker.tracking_uri)}[/bold]  (or: commgym ui)"
    )


def parent_params(cfg: RunConfig, extra: dict[str, Any]) -> dict[str, Any]:
    """A parent run's parameters: the resolved config, ``extra``, what reproduces the run."""
    from commgym.experiments.tracking import reproducibility_params

    return {**cfg.to_dict(), **extra, **reproducibility_params()}


def slug(name: str) -> str:
    """``name`` as a file or metric name part (``static:int8/4MB/H1`` -> ``static_int8_4MB_H1``)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
