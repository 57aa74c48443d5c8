"""PPO and RecurrentPPO from scratch, the same decisions in the simulator, then evaluated.

PPO with an 8-observation history and RecurrentPPO learn DECISIONS probe-free decisions on
flaky-link's randomised simulator, then play the scenario's own schedule (docs/simulator.md).

``python recurrent_learn.py CAL.json DECISIONS``
"""

import sys
import time
import warnings

import numpy as np

from commgym.agents import PPOAgent, RecurrentPPOAgent
from commgym.agents.rollout import rollout
from commgym.env.sim import Calibration, SimEnv
from commgym.env.sim.randomize import RandomizedConditions
from commgym.experiments.config import load_run_config

warnings.simplefilter("ignore")
rc = load_run_config("flaky-link-ppo")
cfg = rc.env_config
cal = Calibration.load(sys.argv[1])
n = int(sys.argv[2])
seeds = list(range(1000, 1008))
common = {
    "normalize": True,
    "gamma": 0.999,
    "ent_coef": 0.003,
    "n_steps": 2048,
    "batch_size": 256,
    "n_epochs": 5,
    "probe": False,
}
ev = SimEnv(cal, cfg)
for cls, extra in ((PPOAgent, {"history": 8}), (RecurrentPPOAgent, {})):
    env = RandomizedConditions(SimEnv(cal, cfg), **rc.sim_randomize)
    agent = cls(env, seed=0, **common, **extra)
    t0 = time.perf_counter()
    agent.learn(n)
    dt = time.perf_counter() - t0
    eps = [rollout(ev, agent, s, target_loss=cfg.target_loss) for s in seeds]
    ts = [e.time_to_target_s or cfg.time_budget_s for e in eps]
    print(
        f"{cls.name}: {n} decisions in {dt:.0f} s; probe-free, seeds 1000-1007: "
        f"{np.mean(ts):.3f} s per seed {[round(t, 2) for t in ts]}",
        flush=True,
    )
