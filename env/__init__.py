"""commgym.env: a gymnasium environment over real torchrun-launched all-reduce training.

Importing this package registers ``commgym/AllReduce-v1``::

    import gymnasium, commgym.env
    env = gymnasium.make("commgym/AllReduce-v1", workload="mlp-digits", world_size=2)

In a fresh process that has not imported ``commgym.env`` (e.g. SB3's ``SubprocVecEnv``
workers) use ``"commgym.env:commgym/AllReduce-v1"``: gymnasium imports the module first.

This package never imports stable-baselines3 or MLflow.
"""

import gymnasium

from commgym.env.allreduce_env import AllReduceEnv, EnvConfig, FlattenAction
from commgym.env.cluster import Cluster, LaunchConfig
from commgym.env.measure import DecisionMeasurement, DecisionRecorder, RankMeasurement
from commgym.env.spaces import (
    OBSERVATION_FIELDS,
    REWARDS,
    ActionMenu,
    ObservationBuilder,
    RewardContext,
)

__all__ = [
    "OBSERVATION_FIELDS",
    "REWARDS",
    "ActionMenu",
    "AllReduceEnv",
    "Cluster",
    "DecisionMeasurement",
    "DecisionRecorder",
    "EnvConfig",
    "FlattenAction",
    "LaunchConfig",
    "ObservationBuilder",
    "RankMeasurement",
    "RewardContext",
]

if "commgym/AllReduce-v1" not in gymnasium.registry:
    gymnasium.register(
        id="commgym/AllReduce-v1",
        entry_point="commgym.env.allreduce_env:AllReduceEnv",
        # observations hold measured wall times: identical seeds and actions give
        # identical losses, not identical timings
        nondeterministic=True,
    )
if "commgym/Surrogate-v1" not in gymnasium.registry:
    # learned model of AllReduce-v1 (same spaces and rewards), see commgym.env.surrogate
    gymnasium.register(id="commgym/Surrogate-v1", entry_point="commgym.env.surrogate:SurrogateEnv")
if "commgym/Sim-v1" not in gymnasium.registry:
    # factorised simulator of AllReduce-v1 (same spaces and records), see commgym.env.sim
    gymnasium.register(id="commgym/Sim-v1", entry_point="commgym.env.sim:SimEnv")
