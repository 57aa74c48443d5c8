"""In-simulator figures of the warm start on link-lottery (docs/simulator.md).

``python sim_lottery.py CAL.json link-lottery-bc`` clones the reactive oracle (opening with the
recipe's entry) on the simulator with the decisions' timing randomised, fine-tunes with PPO as
the recipe does, and prints each player's mean time to target on the scenario's own link draws
(seeds 1000-1015, probe-free),
with the simulator's timing as calibrated and as randomised (a loaded machine: scale 1.4,
noise 0.15), and the entries the policy plays per link.
"""

import collections
import sys
import time
import warnings

import numpy as np

from commgym.agents import PPOAgent
from commgym.agents.imitation import SimScheduleExpert
from commgym.agents.rollout import rollout
from commgym.env.sim import Calibration, SimEnv
from commgym.env.sim.randomize import RandomizedConditions
from commgym.experiments.config import load_run_config

warnings.simplefilter("ignore")
rc = load_run_config(sys.argv[2])
cfg = rc.env_config
cal = Calibration.load(sys.argv[1])
seeds = list(range(1000, 1016))
budget = cfg.time_budget_s


class Static:
    reads_probe = False  # a static player runs no probe
    def __init__(self, env, entry):
        self.a = np.array(next(a for a in np.ndindex(*env.menu.nvec) if str(env.menu.decode(np.array(a))) == entry))

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return self.a, state


def evaluate(agent, tag, scale=1.0, noise=0.0):
    ev = SimEnv(cal, cfg)
    ev.compute_scale, ev.timing_noise = scale, noise
    eps = [rollout(ev, agent, s, target_loss=cfg.target_loss) for s in seeds]
    ts = [e.time_to_target_s or budget for e in eps]
    print(f"{tag} [scale {scale}, noise {noise}]: {np.mean(ts):.3f} s  per seed {[round(t, 2) for t in ts]}", flush=True)
    return eps


w = rc.sim_warm_start
learn = RandomizedConditions(SimEnv(cal, cfg), **rc.sim_randomize)
agent = PPOAgent(learn, seed=rc.seed, **rc.agent_hyperparams)
t0 = time.perf_counter()
fit = agent.warm_start(SimScheduleExpert(opening=w.get("opening", "best")), w["episodes"], epochs=w["epochs"])
print(f"clone: accuracy {fit['accuracy']:.3f} in {time.perf_counter() - t0:.1f} s")
for sc, nz in ((1.0, 0.0), (1.4, 0.15)):
    eps = evaluate(agent, "clone", sc, nz)
    by = collections.Counter((d.network, d.config) for e in eps for d in e.steps)
    print("  entries per link:", dict(by.most_common(8)))
agent.learn(rc.timesteps)
for sc, nz in ((1.0, 0.0), (1.4, 0.15)):
    eps = evaluate(agent, f"clone + PPO {rc.timesteps}", sc, nz)
    for entry in ("powersgd:2/25MB/H2", "none/25MB/H1", "topk:0.01/25MB/H1"):
        evaluate(Static(SimEnv(cal, cfg), entry), f"static {entry}", sc, nz)
    by = collections.Counter()
    for e in eps:
        for d in e.steps:
            by[(d.network, d.config)] += 1
    print("  entries per link:", dict(by.most_common(8)))
