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
from commgym.experiments.executors import LOCAL, Executor
from commgym.experiments.progress import console

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
    from commgym.env.net import host_check

    found = host_check(plan.specs, strict)
    if found is not None:
        kind, problem = found
        fix = {
            "host": "without a network the ranks run on unshaped loopback",
            "impairments": "add --drop-impairments to drop delay/jitter/loss with a warning and "
            "keep the rate shaping",
        }[kind]
        raise ValueError(f"{source} ({plan.label()}): {problem}; {fix}")


def start_ranks(cfg: RunConfig, env: gym.Env, executor: Executor = LOCAL) -> None:
    """Bring up what the episodes run on, and say so (:meth:`Executor.start`).

    The local executor launches the ranks (first reset) under a spinner and says what
    network they run on; a Ray executor starts no rank here and says where its env actors
    run (each launches its own ranks when first used).
    """
    executor.start(env, cfg.env_config, cfg.seed)


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
