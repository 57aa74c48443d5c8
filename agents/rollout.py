"""THE rollout: one episode loop and one episode record, for every caller that runs episodes.

Training's evaluation, ``commgym evaluate``, the leaderboard, ``oracle-static`` (and any
oracle after it), ``commgym replay`` and the sim-to-real check all run an agent through
:func:`rollout` and get an :class:`Episode` back, as SB3's
``common/evaluation.py::evaluate_policy`` serves ``EvalCallback`` and users alike: one
definition of what an episode measured (time to target, final loss, bytes per step,
return). The record reads the typed :class:`~commgym.env.measure.DecisionMeasurement` of
each step (:func:`~commgym.env.measure.measurement_from_info`), never ``info`` keys, and is
plain picklable data, so it can come back from another process.

Side concerns stay outside: MLflow logging wraps the env
(:class:`~commgym.experiments.tracking.TrackingWrapper`), progress displays and search caps
hook in through ``on_step``. The loop prints nothing.

Beyond a whole episode from ``env.reset(seed)``, a rollout can continue from the env's
current state (``start=(obs, info)``, no reset: e.g. another agent taking over at a phase
boundary, from :attr:`Episode.final_obs` / :attr:`Episode.final_info` of the rollout
before) and stop before the env ends the episode (``stop``, ``max_train_time_s`` or
``on_step`` returning ``False``; the episode's ``reason`` is then ``None``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import gymnasium as gym
import numpy as np

from commgym.agents.base import step_report
from commgym.env.measure import (
    DecisionMeasurement,
    effective_bandwidth_gbps,
    measurement_from_info,
)
from commgym.env.net.plan import link_rate_gbps

__all__ = ["Episode", "EpisodeStep", "StepCallback", "rollout"]


#: ``on_step(step) -> bool | None`` after every ``env.step``; ``step`` is
#: :func:`~commgym.agents.base.step_report`'s dict (``obs, action, reward, terminated,
#: truncated, info, timestep``; ``timestep`` counts this rollout's steps). ``False``
#: stops the rollout after this step.
StepCallback = Callable[[dict[str, Any]], "bool | None"]


def finite_or_none(x: float) -> float | None:
    """``x`` when finite, else ``None`` (JSON has no NaN)."""
    return x if math.isfinite(x) else None


def nan_if_none(x: float | None) -> float:
    """Inverse of :func:`finite_or_none`."""
    return math.nan if x is None else float(x)


@dataclass(frozen=True)
class EpisodeStep:
    """One measured decision of a rollout.

    Attributes:
        decision: decisions of the rollout so far, this one included (1 for the first).
        train_time_s: the episode's training time after this decision
            (``info["train_time_s"]``), s.
        config: the configuration applied (``info["config"]``, e.g. ``int8/4MB/H2``).
        action: the menu indices chosen.
        reward: the env's reward.
        network: the link spec in force (``info["network"]``; ``None`` unshaped).
        measured: what the decision measured.
        condition: the conditions the decision ran under (``info["condition"]``: link and
            straggler jitter, e.g. ``"20mbit, stragglers off"``; ``None`` if not given).
    """

    decision: int
    train_time_s: float
    config: str
    action: tuple[int, ...]
    reward: float
    network: str | None
    measured: DecisionMeasurement
    condition: str | None = None

    def row(self) -> dict[str, Any]:
        """The plain row tables and figures read (``commgym.experiments.plots``).

        Keys: ``decision``, ``train_time_s``, ``config``, ``eval_loss``,
        ``bytes_per_step``, ``bytes_total``, ``comm_s``, ``comm_wait_s``,
        ``bandwidth_gbps`` (effective, :func:`~commgym.env.measure.effective_bandwidth_gbps`),
        ``link_rate_gbps`` (configured; NaN unshaped), ``condition`` and ``reward``.
        """
        m = self.measured
        return {
            "decision": self.decision,
            "train_time_s": self.train_time_s,
            "config": self.config,
            "eval_loss": float(m.eval_loss),
            "bytes_per_step": float(m.bytes_per_step),
            "bytes_total": float(m.bytes_total),
            "comm_s": float(m.comm_s),
            "comm_wait_s": float(m.comm_wait_s),
            "bandwidth_gbps": effective_bandwidth_gbps(m.bytes_total, m.comm_s),
            "link_rate_gbps": link_rate_gbps(self.network, unshaped=math.nan),
            "condition": self.condition,
            "reward": self.reward,
        }


@dataclass(frozen=True)
class Episode:
    """What one rollout measured (the one episode record).

    Two episodes are equal when their outcomes are (the fields up to ``reason``); the
    per-decision steps and the final observation do not take part.

    Attributes:
        seed: the ``env.reset`` seed (``None``: continued from a given state, or unseeded).
        decisions: measured decisions (``env.step`` calls that measured something).
        train_time_s: the episode's training time at the rollout's end, s.
        time_to_target_s: training time at the first decision whose held-out loss was
            ``<= target_loss``, s; ``None`` if none was (or no target was given).
        final_eval_loss: held-out loss at the end, nats (NaN when diverged).
        final_eval_acc: held-out accuracy at the end (NaN when not measured).
        bytes_per_step: mean over decisions of the bytes handed to collectives per
            iteration, B (0 without a decision).
        episode_return: sum of the env's rewards.
        reason: the env's ``info["reason"]`` of the last step (``target_reached``,
            ``time_budget``, ``max_decisions``, ``diverged``, ``failure``); ``None`` when
            the rollout stopped before the env ended the episode.
        steps: every measured decision, in order (not persisted by :meth:`to_dict`).
        final_obs: the observation after the last step (to continue from).
        final_info: the ``info`` of the last step (to continue from).
    """

    seed: int | None
    decisions: int
    train_time_s: float
    time_to_target_s: float | None
    final_eval_loss: float
    final_eval_acc: float
    bytes_per_step: float
    episode_return: float
    reason: str | None
    steps: tuple[EpisodeStep, ...] = field(default=(), repr=False, compare=False)
    final_obs: Any = field(default=None, repr=False, compare=False)
    final_info: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """:meth:`EpisodeStep.row` of every step (what tables and figures read)."""
        return [s.row() for s in self.steps]

    def to_dict(self, *, json_safe: bool = True) -> dict[str, Any]:
        """The outcome fields (``seed`` to ``reason``), in order; steps are not kept.

        Args:
            json_safe: non-finite numbers as ``None`` (``False``: as they are).
        """
        d = {name: getattr(self, name) for name in _OUTCOME_FIELDS}
        if json_safe:
            for k in ("final_eval_loss", "final_eval_acc", "episode_return", "bytes_per_step"):
                d[k] = finite_or_none(d[k])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Episode:
        """Inverse of :meth:`to_dict` (also reads the oracle files of earlier versions)."""
        return cls(
            seed=None if d["seed"] is None else int(d["seed"]),
            decisions=int(d["decisions"]),
            train_time_s=float(d["train_time_s"]),
            time_to_target_s=d["time_to_target_s"],
            final_eval_loss=nan_if_none(d["final_eval_loss"]),
            final_eval_acc=nan_if_none(d["final_eval_acc"]),
            bytes_per_step=nan_if_none(d["bytes_per_step"]),
            episode_return=nan_if_none(d["episode_return"]),
            reason=d["reason"],
        )


#: The outcome fields of :class:`Episode` (``seed`` .. ``reason``): compared, persisted.
_OUTCOME_FIELDS = tuple(f.name for f in fields(Episode) if f.compare)


def rollout(
    env: gym.Env,
    agent: Any,
    seed: int | None = None,
    *,
    target_loss: float | None = None,
    deterministic: bool = True,
    start: tuple[np.ndarray, Mapping[str, Any]] | None = None,
    stop: Callable[[EpisodeStep], bool] | None = None,
    max_train_time_s: float | None = None,
    on_step: StepCallback | None = None,
) -> Episode:
    """Run ``agent`` in ``env`` for one episode (or part of one) and record it.

    The agent acts with ``predict(obs, state=..., episode_start=..., deterministic=...)``,
    its state carried from call to call (``episode_start`` True on the first). The rollout
    ends when the env ends the episode (``terminated`` or ``truncated``), when a step
    measured nothing (a failed rank), or when the caller stops it after a step.

    Args:
        env: a commgym env (``info`` as :func:`~commgym.env.measure.decision_info`
            builds it), possibly wrapped.
        agent: anything with the ``Agent.predict`` signature.
        seed: ``env.reset(seed=seed, options={"probe": agent.reads_probe})`` (ignored
            with ``start``; an agent without ``reads_probe`` counts as reading it).
        target_loss: held-out loss whose first crossing defines the time to target.
        deterministic: passed to ``predict``.
        start: ``(obs, info)`` to continue from without a reset (a reset's or a step's
            ``info``; the env must be inside an episode).
        stop: called with every measured step; ``True`` stops the rollout after it.
        max_train_time_s: stop once the episode's training time reaches this, s.
        on_step: called after every ``env.step`` (see :data:`StepCallback`); ``False``
            stops the rollout after that step.

    Returns:
        The :class:`Episode`.
    """
    # a player that never reads the probe runs none (its time would count as training)
    probe = bool(getattr(agent, "reads_probe", True))
    obs, info = env.reset(seed=seed, options={"probe": probe}) if start is None else start
    loss, acc = _initial_losses(info)
    state: Any = None
    episode_start = np.array([True])
    total, bytes_sum, train_time = 0.0, 0.0, float(info.get("train_time_s", 0.0))
    t_target: float | None = None
    reason: str | None = None
    steps: list[EpisodeStep] = []
    timestep = 0
    while True:
        action, state = agent.predict(
            obs, state=state, episode_start=episode_start, deterministic=deterministic
        )
        episode_start = np.array([False])
        obs, reward, terminated, truncated, info = env.step(action)
        timestep += 1
        total += float(reward)
        reason = info.get("reason")
        measured = measurement_from_info(info)
        step = None
        if measured is not None:
            train_time = float(info["train_time_s"])
            loss, acc = float(measured.eval_loss), float(measured.eval_acc)
            bytes_sum += float(measured.bytes_per_step)
            if t_target is None and target_loss is not None and loss <= target_loss:
                t_target = train_time
            step = EpisodeStep(
                decision=len(steps) + 1,
                train_time_s=train_time,
                config=str(info.get("config")),
                action=tuple(int(a) for a in np.asarray(action).reshape(-1)),
                reward=float(reward),
                network=info.get("network"),
                measured=measured,
                condition=info.get("condition"),
            )
            steps.append(step)
        keep = True
        if on_step is not None:
            report = step_report(obs, action, reward, terminated, truncated, info, timestep)
            keep = on_step(report) is not False
        if terminated or truncated or measured is None:
            break
        if (
            not keep
            or (stop is not None and step is not None and stop(step))
            or (max_train_time_s is not None and train_time >= max_train_time_s)
        ):
            break
    return Episode(
        seed=seed if start is None else None,
        decisions=len(steps),
        train_time_s=train_time,
        time_to_target_s=t_target,
        final_eval_loss=loss,
        final_eval_acc=acc,
        bytes_per_step=bytes_sum / len(steps) if steps else 0.0,
        episode_return=total,
        reason=reason,
        steps=tuple(steps),
        final_obs=obs,
        final_info=info,
    )


def _initial_losses(info: Mapping[str, Any]) -> tuple[float, float]:
    """Held-out loss and accuracy where a rollout starts (a reset's or a step's ``info``)."""
    measured = measurement_from_info(info)
    if measured is not None:
        return float(measured.eval_loss), float(measured.eval_acc)
    return float(info.get("eval_loss", math.nan)), float(info.get("eval_acc", math.nan))
