"""commgym.agents: agents that choose communication configurations.

Every agent answers ``predict(obs, deterministic=True) -> (action, state)`` with
``MultiDiscrete`` menu indices, learns with ``learn(total_timesteps)`` and saves to one
zip file (``save(path)``, ``load_agent(path, env)``)::

    import gymnasium, commgym.env
    from commgym.agents import make_agent
    env = gymnasium.make("commgym/AllReduce-v1", workload="mlp-digits", world_size=2)
    agent = make_agent("bayesopt", env, seed=0).learn(60)
    action, _ = agent.predict(obs)
    episode = rollout(env, agent, seed=1000, target_loss=0.2)  # the one episode loop

.. warning:: SB3 policy files (``ppo``, ``a2c``, ``dqn``) contain pickles: loading one
   from an untrusted source can execute arbitrary code.

This package may import stable-baselines3; it never imports MLflow.
"""

from commgym.agents.autotune import AutotuneAgent
from commgym.agents.bandit import SlidingWindowUCBAgent
from commgym.agents.base import (
    Agent,
    StepAgent,
    check_compatible,
    layout_of,
    read_policy_json,
)
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
from commgym.agents.oracle import BestStaticAgent, OracleEntry, OracleStaticAgent
from commgym.agents.oracle_adaptive import OracleAdaptiveAgent, ScheduleAgent
from commgym.agents.registry import AGENTS, agent_names, load_agent, make_agent
from commgym.agents.rollout import Episode, EpisodeStep, rollout
from commgym.agents.rollout_table import RolloutTableAgent
from commgym.agents.sb3 import A2CAgent, DQNAgent, PPOAgent, RecurrentPPOAgent, SB3Agent

__all__ = [
    "AGENTS",
    "STATIC_PRESETS",
    "A2CAgent",
    "AccordionAgent",
    "AdaCommAgent",
    "Agent",
    "AutotuneAgent",
    "BayesOptAgent",
    "BestStaticAgent",
    "DQNAgent",
    "Episode",
    "EpisodeStep",
    "GridAgent",
    "ModelPredictiveAgent",
    "OracleEntry",
    "OracleAdaptiveAgent",
    "OracleStaticAgent",
    "RolloutTableAgent",
    "ScheduleAgent",
    "PPOAgent",
    "RecurrentPPOAgent",
    "RandomAgent",
    "SB3Agent",
    "SlidingWindowUCBAgent",
    "StaticAgent",
    "StepAgent",
    "agent_names",
    "check_compatible",
    "layout_of",
    "load_agent",
    "make_agent",
    "read_policy_json",
    "rollout",
]
