"""Where a command's real episodes run: one :class:`Executor` interface, two executors.

As SB3 puts ``DummyVecEnv`` and ``SubprocVecEnv`` behind ``VecEnv``, commgym puts
:class:`LocalExecutor` (``--executor local``, the default: the driver's env, one episode
after another) and :class:`RayExecutor` (``--executor ray``: env actors of a Ray cluster)
behind :class:`Executor`; the experiments layer calls the same methods on either and
never asks which it has. :func:`open_executor` opens the one a run configuration names.

Modules: :mod:`~commgym.experiments.executors.base` (the protocol and the cells),
:mod:`~commgym.experiments.executors.local`, :mod:`~commgym.experiments.executors.ray`.
Ray is imported only when a :class:`RayExecutor` is made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from commgym.experiments.executors.base import (
    Executor,
    PlayedEpisode,
    failed_episode,
    load_policy,
    play_episode,
    play_here,
    policy_bytes,
    tune_agent,
)
from commgym.experiments.executors.local import LOCAL, LocalExecutor
from commgym.experiments.executors.ray import RayExecutor
from commgym.experiments.executors.ray_address import bootstrap_address, on_loopback, unreachable

__all__ = [
    "EXECUTORS",
    "LOCAL",
    "Executor",
    "LocalExecutor",
    "PlayedEpisode",
    "RayExecutor",
    "bootstrap_address",
    "failed_episode",
    "load_policy",
    "on_loopback",
    "open_executor",
    "play_episode",
    "play_here",
    "policy_bytes",
    "tune_agent",
    "unreachable",
]

#: ``RunConfig.executor`` name -> how that executor is opened from a run configuration.
EXECUTORS: dict[str, Callable[[Any], Executor]] = {
    "local": lambda cfg: LocalExecutor(),
    "ray": lambda cfg: RayExecutor(cfg.ray_address, cfg.ray_envs),
}


def open_executor(cfg: Any) -> Executor:
    """The executor ``cfg.executor`` names, to use as a context manager (never ``None``).

    Raises:
        ValueError: an unknown executor name (the known ones are listed).
        ModuleNotFoundError: ``"ray"`` without Ray installed.
    """
    try:
        make = EXECUTORS[cfg.executor]
    except KeyError:
        raise ValueError(f"unknown executor {cfg.executor!r}; known: {sorted(EXECUTORS)}") from None
    return make(cfg)
