"""``commgym bench surrogate``: ``commgym/Surrogate-v1`` env steps per second on one core."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

__all__ = ["run_surrogate_benchmark", "time_surrogate"]

console = Console()


def time_surrogate(model: Any, steps: int) -> tuple[float, list[str]]:
    """Steps per second of ``commgym/Surrogate-v1`` on ``model`` (random actions).

    A model fitted on shaped links is stepped with ``network={"profiles": [...]}`` of its
    fitted rates (a seeded rate per episode, as collected), so the figure includes the
    link look-up.

    Args:
        model: a fitted :class:`~commgym.env.surrogate.SurrogateModel`.
        steps: env steps to time (resets included).

    Returns:
        ``(steps per second, the fitted links' specs)``.
    """
    import gymnasium as gym

    import commgym.env  # noqa: F401 - registers the env
    from commgym.env.net import UNSHAPED_LINK_GBPS, NetworkSpec
    from commgym.env.surrogate import benchmark_steps

    shaped = [
        str(NetworkSpec(round(r * 1e9))) for r in model.link_rates_gbps if r < UNSHAPED_LINK_GBPS
    ]
    network = {"profiles": shaped} if shaped else None
    env = gym.make("commgym/Surrogate-v1", model_path=model, network=network)
    return benchmark_steps(env, steps), shaped


def run_surrogate_benchmark(model_path: str | Path, steps: int = 20000) -> float:
    """Steps per second of ``gymnasium.make("commgym/Surrogate-v1")`` (random actions).

    Raises:
        FileNotFoundError: no file at ``model_path``.
        ValueError: the file is not a surrogate model of this version.
    """
    from commgym.env.surrogate import SurrogateModel

    rate, shaped = time_surrogate(SurrogateModel.load(model_path), steps)
    links = f", links {', '.join(shaped)} per episode" if shaped else ""
    console.print(f"commgym/Surrogate-v1: {rate:,.0f} env steps/s ({steps} steps, one core{links})")
    return rate
