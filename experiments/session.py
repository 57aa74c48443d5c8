"""What every command that runs real ranks shares: the env, its ranks, the MLflow store.

``commgym train``, ``evaluate``, ``replay`` and ``leaderboard`` each build the real env from
the one resolved config (:func:`make_env`), start its ranks under a spinner and say which
network they run on (:func:`start_ranks`), tell where the runs are logged
(:func:`announce`), and name files after agents (:func:`slug`).
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym

from commgym.experiments.config import RunConfig
from commgym.experiments.progress import console, phase

__all__ = ["announce", "check_network", "make_env", "parent_params", "slug", "start_ranks"]


def make_env(cfg: RunConfig) -> gym.Env:
    """``commgym/AllReduce-v1`` from ``cfg.env_config`` (no rank starts before a reset)."""
    import commgym.env  # noqa: F401 - registers the env

    return gym.make("commgym/AllReduce-v1", config=cfg.env_config)


def check_network(plan: Any, strict: bool = True, source: str = "--network") -> None:
    """Fail when the env's network cannot be emulated on this host, before anything exists.

    Every command that runs real ranks calls it before it creates a store, a folder or a
    run, so a missing privilege or a kernel without ``sch_netem`` is one error naming
    the flag that fixes it, not a traceback after the ranks were set up.

    Args:
        plan: the :class:`~commgym.env.net.NetworkPlan` (an env config's ``network_plan``).
        strict: the env's ``network_strict``: delay/jitter/loss without ``sch_netem`` fail.
        source: where the network was given (``"--network"``, ``"scenario 'slow-link'"``).

    Raises:
        ValueError: the host cannot emulate it (the message names the missing privilege
            or qdisc, and ``--drop-impairments`` where dropping delay/jitter/loss helps).
    """
    if not plan.emulated:
        return
    from commgym.env.net import emulation_problem

    problem = emulation_problem(plan.specs, strict=False)
    if problem:
        raise ValueError(
            f"{source} ({plan.label()}): {problem}; without a network the ranks run on "
            "unshaped loopback"
        )
    problem = emulation_problem(plan.specs) if strict else None
    if problem:
        raise ValueError(
            f"{source} ({plan.label()}): {problem}; add --drop-impairments to drop "
            "delay/jitter/loss with a warning and keep the rate shaping"
        )


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
    """``name`` as a file or metric name part.

    Every run of characters other than letters, digits, ``-``, ``_`` and ``.`` becomes one
    ``_``, and none is left at either end: ``static:int8/4MB/H1`` -> ``static_int8_4MB_H1``,
    ``ppo (learned)`` -> ``ppo_learned``.
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")
