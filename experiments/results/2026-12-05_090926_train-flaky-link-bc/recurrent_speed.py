"""Decisions per second of PPO and RecurrentPPO learning in the simulator, side by side.

PPO with an 8-observation history, RecurrentPPO with its LSTM, on flaky-link's simulator, two
alternating rounds in one process (docs/simulator.md).

``python recurrent_speed.py CAL.json [DECISIONS]``
"""

import sys
import time
import warnings

from commgym.agents import PPOAgent, RecurrentPPOAgent
from commgym.env.sim import Calibration, SimEnv
from commgym.env.sim.randomize import RandomizedConditions
from commgym.experiments.config import load_run_config

warnings.simplefilter("ignore")
rc = load_run_config("flaky-link-ppo")
cal = Calibration.load(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
common = {
    "normalize": True,
    "gamma": 0.999,
    "ent_coef": 0.003,
    "n_steps": 2048,
    "batch_size": 256,
    "n_epochs": 5,
}
for rnd in range(2):  # two rounds, alternating, so drift lands on both
    for cls, extra in ((PPOAgent, {"history": 8}), (RecurrentPPOAgent, {})):
        env = RandomizedConditions(SimEnv(cal, rc.env_config), **rc.sim_randomize)
        agent = cls(env, seed=0, **common, **extra)
        t0 = time.perf_counter()
        agent.learn(n)
        dt = time.perf_counter() - t0
        print(
            f"round {rnd} {cls.name}: {n} decisions in {dt:.1f} s = {n / dt:.0f} decisions/s",
            flush=True,
        )
