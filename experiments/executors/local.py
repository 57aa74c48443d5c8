"""``--executor local`` (the default): every episode on the driver's env, one after another.

The embedded path every command has always taken: one ``commgym/AllReduce-v1`` env in this
process, its ranks on this machine. It answers the :class:`~commgym.experiments.executors.
Executor` protocol as a ``DummyVecEnv`` answers SB3's ``VecEnv``: the same calls, run here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from commgym.experiments.executors.base import PlayedEpisode, play_here
from commgym.experiments.progress import console, phase

__all__ = ["LOCAL", "LocalExecutor", "search_here", "start_here"]


def start_here(env: Any, config: Any, seed: int) -> None:
    """Launch the driver's ranks (first reset) under a spinner; say what network they run on."""
    world, plan = config.world_size, config.network_plan
    where = "on an emulated network" if plan.emulated else "on loopback"
    with phase(f"starting {world} ranks with torchrun {where}"):
        env.reset(seed=seed)
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


def search_here(agent: Any, on_episode: Callable[[float], Any] | None = None) -> None:
    """An oracle's search on its own env: ``agent.learn``, ``on_episode(1)`` per episode.

    An oracle that forks episodes (``oracle-adaptive``) reports search phases instead
    (``on_episode(n)`` as ``n`` are decided, out of its ``planned_phases()``).
    """
    if on_episode is None:
        agent.learn()
        return
    if hasattr(agent, "planned_phases"):
        agent.learn(on_phase=on_episode)
        return

    def counted(step: dict[str, Any]) -> None:
        if step["terminated"] or step["truncated"]:
            on_episode(1)

    agent.learn(callback=counted)


class LocalExecutor:
    """Every cell on the driver's env, in order (stateless: a context manager holding nothing)."""

    where = "on real ranks"

    def start(self, env: Any, config: Any, seed: int) -> None:  # noqa: D102 - Executor
        start_here(env, config, seed)

    def play(  # noqa: D102 - Executor
        self,
        env: Any,
        config: Any,
        cells: Sequence[tuple[str, int]],
        players: dict[str, Any],
        target_loss: float | None,
        on_step: Callable[[dict[str, Any]], Any] | None = None,
    ) -> Iterator[tuple[int, PlayedEpisode]]:
        for i, (name, seed) in enumerate(cells):
            yield i, play_here(env, players[name], seed, target_loss, on_step)

    def search(  # noqa: D102 - Executor
        self, agent: Any, on_episode: Callable[[float], Any] | None = None
    ) -> None:
        search_here(agent, on_episode)

    def tune(  # noqa: D102 - Executor
        self,
        name: str,
        agent: Any,
        kwargs: dict[str, Any],
        decisions: int,
        on_decision: Callable[[float], Any] | None = None,
    ) -> tuple[Any, float]:
        import time

        t0 = time.perf_counter()
        callback = None if on_decision is None else (lambda _: on_decision(1))
        agent.learn(decisions, callback=callback)
        return agent, time.perf_counter() - t0

    def record(  # noqa: D102 - Executor
        self,
        env: Any,
        config: Any,
        out: str | Path,
        decisions: int,
        policy: str,
        seed: int,
        bench: bool = True,
        run: Any = None,
        on_decisions: Callable[[float], Any] | None = None,
    ) -> tuple[Path, Path | None, float]:
        from commgym.experiments.recording import record_dataset

        on_step = None if on_decisions is None else (lambda: on_decisions(1))
        return record_dataset(env, out, decisions, policy, seed, bench, run, on_step=on_step)

    def learning_env(self, env: Any, config: Any, agent_cls: Any) -> tuple[Any, Any]:  # noqa: D102
        return None, env

    def real_env(self, env: Any, config: Any) -> Any:  # noqa: D102 - Executor
        return env

    def release(self, config: Any) -> None:  # noqa: D102 - nothing is held per config
        return None

    def close(self, *, interrupted: bool = False) -> None:  # noqa: D102 - nothing to close
        return None

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(interrupted=exc_type is not None)


#: The default executor of every function that takes one: the caller's env, here.
LOCAL = LocalExecutor()
