"""What every executor answers (:class:`Executor`), and the cells both kinds play.

An executor is where a command's real episodes run, as a ``VecEnv`` is where SB3's
environments step (``DummyVecEnv`` in the process, ``SubprocVecEnv`` elsewhere): the code
above it (evaluation, the leaderboard, training, collection) calls the same methods on a
:class:`~commgym.experiments.executors.LocalExecutor` and on a
:class:`~commgym.experiments.executors.RayExecutor` and never asks which it has. What an
executor cannot ship elsewhere it runs on the driver's env itself (a schedule found per
seed in hindsight, ``for_seed``, is no policy file; an oracle that forks episodes runs on
the driver's ranks).

The cells here run wherever an executor puts them: :func:`play_here` plays one episode on
an env it is given (the local executor's every episode, and a Ray executor's driver-side
ones); :func:`play_episode` and :func:`tune_agent` run inside an env actor.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from commgym.agents.rollout import Episode, rollout

__all__ = [
    "Executor",
    "PlayedEpisode",
    "failed_episode",
    "load_policy",
    "play_episode",
    "play_here",
    "policy_bytes",
    "tune_agent",
]

#: ``(action, reward, terminated, truncated, info)`` of one ``env.step``.
Transition = tuple[Any, float, bool, bool, dict[str, Any]]


@dataclass(frozen=True)
class PlayedEpisode:
    """One played episode, with what the driver needs to log it.

    Attributes:
        episode: the rollout's record (``reason == "failure"`` when an actor died).
        transitions: per ``env.step``: ``(action, reward, terminated, truncated, info)``,
            what :class:`~commgym.experiments.tracking.TrackingWrapper` logs.
        node_id: the Ray node the episode ran on (``""``: the driver).
        actor: the env actor's tag (``""``: the driver).
        actor_s: wall seconds of the cell (policy loaded, rollout played).
        wall_s: wall seconds from the driver's submission to the result.
    """

    episode: Episode
    transitions: list[Transition] = field(repr=False)
    node_id: str
    actor: str
    actor_s: float
    wall_s: float = math.nan


@runtime_checkable
class Executor(Protocol):
    """Where a command's real episodes run; every method is answered by every executor.

    Used as a context manager (leaving it closes what it opened). ``config`` arguments are
    the env's :class:`~commgym.env.EnvConfig`; ``env`` is the driver's real env of it.
    """

    #: how the tuning phase names the place (``"on real ranks"``, ``"on a Ray env actor"``)
    where: str

    def start(self, env: Any, config: Any, seed: int) -> None:
        """Bring up what the episodes run on (the driver's ranks, or say where actors run)."""
        ...

    def play(
        self,
        env: Any,
        config: Any,
        cells: Sequence[tuple[str, int]],
        players: dict[str, Any],
        target_loss: float | None,
        on_step: Callable[[dict[str, Any]], Any] | None = None,
    ) -> Iterator[tuple[int, PlayedEpisode]]:
        """Play the episode cells ``(player name, seed)``; yield ``(cell index, played)``.

        ``on_step`` sees the steps of episodes played on the driver (progress display).
        """
        ...

    def search(self, agent: Any, on_episode: Callable[[float], Any] | None = None) -> None:
        """Run an oracle's search (``agent.learn`` or its episodes elsewhere + ``rank``)."""
        ...

    def tune(
        self,
        name: str,
        agent: Any,
        kwargs: dict[str, Any],
        decisions: int,
        on_decision: Callable[[float], Any] | None = None,
    ) -> tuple[Any, float]:
        """Tune baseline ``name`` for ``decisions`` real decisions: ``(agent, seconds)``."""
        ...

    def record(
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
        """Record real decisions for the surrogate: ``(transitions, bench or None, seconds)``."""
        ...

    def learning_env(self, env: Any, config: Any, agent_cls: Any) -> tuple[Any, Any]:
        """Where an agent learns on real ranks: ``(vec_env or None, env)``."""
        ...

    def real_env(self, env: Any, config: Any) -> Any:
        """One real env to step (fine-tuning): ``env`` itself or one standing for it."""
        ...

    def release(self, config: Any) -> None:
        """Let go of what was opened for ``config`` (a scenario is done)."""
        ...

    def close(self, *, interrupted: bool = False) -> None:
        """Let go of everything."""
        ...

    def __enter__(self) -> Executor: ...

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None: ...


def policy_bytes(agent: Any) -> bytes:
    """The agent's policy file (``agent.save``), as bytes to send to an actor."""
    with tempfile.TemporaryDirectory(prefix="commgym-policy-") as tmp:
        return Path(agent.save(Path(tmp) / "policy.zip")).read_bytes()


def load_policy(env: Any, policy: bytes) -> Any:
    """The agent of a policy file's bytes (:func:`policy_bytes`), acting in ``env``."""
    from commgym.agents import load_agent

    with tempfile.TemporaryDirectory(prefix="commgym-policy-") as tmp:
        path = Path(tmp) / "policy.zip"
        path.write_bytes(policy)
        return load_agent(path, env=env)


def _played(
    env: Any,
    agent: Any,
    seed: int,
    target_loss: float | None,
    on_step: Callable[[dict[str, Any]], Any] | None,
) -> tuple[Episode, list[Transition]]:
    """THE rollout of ``agent`` on ``seed``, keeping every step's transition."""
    steps: list[Transition] = []

    def keep(step: dict[str, Any]) -> Any:
        steps.append(
            (step["action"], step["reward"], step["terminated"], step["truncated"], step["info"])
        )
        return None if on_step is None else on_step(step)

    return rollout(env, agent, seed, target_loss=target_loss, on_step=keep), steps


def play_here(
    env: Any,
    agent: Any,
    seed: int,
    target_loss: float | None,
    on_step: Callable[[dict[str, Any]], Any] | None = None,
) -> PlayedEpisode:
    """One episode cell on ``env`` in this process; a per-seed schedule plays its seed's.

    Args:
        env: the driver's env.
        agent: the player; one with ``for_seed`` (a schedule found in hindsight) plays
            ``agent.for_seed(seed)``.
        seed: the episode's seed.
        target_loss: passed to the rollout.
        on_step: called after every step (progress display).
    """
    t0 = time.perf_counter()
    player = agent.for_seed(seed) if hasattr(agent, "for_seed") else agent
    episode, steps = _played(env, player, seed, target_loss, on_step)
    secs = time.perf_counter() - t0
    return PlayedEpisode(episode, steps, "", "", secs, secs)


def _node_id() -> str:
    from commgym.agents.ray_env import import_ray

    return import_ray().get_runtime_context().get_node_id()


def play_episode(
    env: Any, policy: bytes, seed: int, target_loss: float | None, tag: str = ""
) -> PlayedEpisode:
    """An episode cell (runs in an env actor): load the policy, play THE rollout.

    Args:
        env: the actor's env.
        policy: the agent's policy file (:func:`policy_bytes`).
        seed: the episode's seed.
        target_loss: passed to the rollout.
        tag: the actor's tag, echoed in the result.
    """
    t0 = time.perf_counter()
    agent = load_policy(env, policy)
    episode, steps = _played(env, agent, seed, target_loss, None)
    return PlayedEpisode(episode, steps, _node_id(), tag, time.perf_counter() - t0)


def failed_episode(seed: int | None, why: str) -> Episode:
    """The record of an episode lost with its actor or node: ``reason == "failure"``."""
    return Episode(
        seed=seed,
        decisions=0,
        train_time_s=0.0,
        time_to_target_s=None,
        final_eval_loss=math.nan,
        final_eval_acc=math.nan,
        bytes_per_step=0.0,
        episode_return=0.0,
        reason="failure",
        final_info={"failure": why, "reason": "failure"},
    )


def tune_agent(env: Any, name: str, kwargs: dict[str, Any], decisions: int) -> tuple[bytes, float]:
    """A tuning cell (runs in an env actor): build ``name``, learn ``decisions`` real decisions.

    Returns:
        ``(policy file bytes, tuning wall seconds)``.
    """
    from commgym.agents import make_agent

    agent = make_agent(name, env, **kwargs)
    t0 = time.perf_counter()
    agent.learn(decisions)
    return policy_bytes(agent), time.perf_counter() - t0
