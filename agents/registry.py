"""The agent registry: ``AGENTS``, ``make_agent`` and ``load_agent``."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import gymnasium as gym

from commgym.agents.autotune import AutotuneAgent
from commgym.agents.bandit import SlidingWindowUCBAgent
from commgym.agents.base import Agent, read_policy_json
from commgym.agents.baselines import (
    STATIC_PRESETS,
    AccordionAgent,
    AdaCommAgent,
    GridAgent,
    RandomAgent,
    StaticAgent,
)
from commgym.agents.bayesopt import BayesOptAgent
from commgym.agents.mpc import ModelPredictiveAgent
from commgym.agents.oracle import BestStaticAgent, OracleStaticAgent
from commgym.agents.oracle_adaptive import OracleAdaptiveAgent
from commgym.agents.rollout_table import RolloutTableAgent
from commgym.agents.sb3 import A2CAgent, DQNAgent, PPOAgent, RecurrentPPOAgent

__all__ = ["AGENTS", "agent_names", "load_agent", "make_agent"]

#: Agent classes by registry name. ``static`` also answers ``static:<preset>``.
AGENTS: dict[str, type[Agent]] = {
    cls.name: cls
    for cls in (
        StaticAgent,
        RandomAgent,
        GridAgent,
        BayesOptAgent,
        AutotuneAgent,
        OracleStaticAgent,
        BestStaticAgent,
        OracleAdaptiveAgent,
        ModelPredictiveAgent,
        RolloutTableAgent,
        SlidingWindowUCBAgent,
        AccordionAgent,
        AdaCommAgent,
        PPOAgent,
        RecurrentPPOAgent,
        A2CAgent,
        DQNAgent,
    )
}


def agent_names() -> list[str]:
    """Every name ``make_agent`` accepts without a menu lookup (static presets included)."""
    from commgym.agents.autotune import OBJECTIVES

    return [
        *AGENTS,
        *(f"static:{p}" for p in STATIC_PRESETS),
        *(f"autotune:{o}" for o in sorted(OBJECTIVES)),
    ]


def make_agent(name: str, env: gym.Env, **kwargs: Any) -> Agent:
    """Build an agent by registry name.

    Args:
        name: a key of :data:`AGENTS`, or ``static:<preset>`` where ``<preset>`` is
            ``ddp-default``, ``fp16-dense`` or a menu entry like ``int8/4MB/H1``, or
            ``autotune:<objective>`` (``progress`` or ``throughput``: the objective wins
            over an ``objective`` keyword).
        env: the commgym env the agent acts in.
        **kwargs: ``seed`` and the agent's hyperparameters.

    Returns:
        The agent (not yet trained).

    Raises:
        ValueError: unknown name (lists the known ones and suggests a close match), or
            invalid hyperparameters / an off-menu static preset.
    """
    if not isinstance(name, str):
        raise TypeError(f"agent name must be a str, got {name!r}")
    base, sep, preset = name.partition(":")
    if base == "static" and sep:
        if "preset" in kwargs:
            raise ValueError(f"give the preset once: {name!r} and preset={kwargs['preset']!r}")
        return StaticAgent(env, preset=preset, **kwargs)
    if base == "autotune" and sep:  # autotune:<objective>, e.g. autotune:progress
        return AutotuneAgent(env, **{**kwargs, "objective": preset})
    if name not in AGENTS:
        known = agent_names()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown agent {name!r}{hint} Known agents: {', '.join(known)} "
            "(static:<menu entry> also accepted, e.g. static:int8/4MB/H1)"
        )
    return AGENTS[name](env, **kwargs)


def load_agent(path: str | Path, env: gym.Env | None = None) -> Agent:
    """Load any commgym policy file; the class comes from its ``commgym_agent.json``.

    .. warning:: SB3 policy files contain pickles: loading one from an untrusted source
       can execute arbitrary code.

    Args:
        path: policy zip written by ``Agent.save``.
        env: optional env; its action menu and observation fields are checked.

    Raises:
        ValueError: unknown agent class in the file, or an incompatible env (the message
            names the differing menu entries / observation fields).
    """
    meta = read_policy_json(path)
    by_class = {cls.__name__: cls for cls in AGENTS.values()}
    cls = by_class.get(meta.get("class", ""))
    if cls is None:
        raise ValueError(
            f"{path} holds an unknown agent class {meta.get('class')!r}; known: {sorted(by_class)}"
        )
    return cls.load(path, env=env)
