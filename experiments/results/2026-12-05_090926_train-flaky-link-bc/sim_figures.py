"""In-simulator figures of the behaviour-cloning warm start on flaky-link (docs/simulator.md).

``python sim_figures.py CAL.json`` prints each player's mean time to target on the scenario's
own schedule, seeds 1000-1007 (the real evaluation's first seeds), probe-free unless noted.
"""

import sys
import time
import warnings

import numpy as np

from commgym.agents import PPOAgent
from commgym.agents.imitation import SimScheduleExpert
from commgym.agents.rollout import rollout
from commgym.env.sim import Calibration, SimEnv, SimModel, best_schedule, static_ranking
from commgym.env.sim.randomize import RandomizedConditions
from commgym.experiments.config import load_run_config

warnings.simplefilter("ignore")
rc = load_run_config("flaky-link-bc")
cfg = rc.env_config
cal = Calibration.load(sys.argv[1])
seeds = list(range(1000, 1008))
m = SimModel(cal, cfg.menu, cfg.steps_per_decision)
budget = cfg.time_budget_s
for probe, label in ((0, "probe-free"), (cfg.probe_bytes, "reading the probe")):
    rk = static_ranking(m, cfg, seeds, probe)
    print(f"best static entry, {label}: {rk[0].config} {rk[0].mean_s:.3f} s")
    for lag, what in ((0, "anticipating (knows the phases)"), (1, "reactive (one decision late)")):
        ts = [best_schedule(m, cfg, s, probe, reaction_lag=lag)[0] or budget for s in seeds]
        print(f"dynamic programme, {what}, {label}: {np.mean(ts):.3f} s")
ev = SimEnv(cal, cfg)


def evaluate(agent, tag):
    """Print the agent's mean time to target in the simulator on the seeds."""
    eps = [rollout(ev, agent, s, target_loss=cfg.target_loss) for s in seeds]
    ts = [e.time_to_target_s or budget for e in eps]
    print(f"{tag}: {np.mean(ts):.3f} s  per seed {[round(t, 2) for t in ts]}", flush=True)


w = rc.sim_warm_start
for explore in (0.0, 0.3):
    learn = RandomizedConditions(SimEnv(cal, cfg), **rc.sim_randomize)
    agent = PPOAgent(learn, seed=rc.seed, **rc.agent_hyperparams)
    t0 = time.perf_counter()
    fit = agent.warm_start(SimScheduleExpert(), w["episodes"], epochs=w["epochs"], explore=explore)
    dt = time.perf_counter() - t0
    print(f"clone (explore {explore}): accuracy {fit['accuracy']:.3f} in {dt:.1f} s")
    evaluate(agent, f"clone (explore {explore})")
    if explore == 0.0:
        t0 = time.perf_counter()
        agent.learn(rc.timesteps)
        dt = time.perf_counter() - t0
        print(f"PPO {rc.timesteps} decisions after the clone in {dt:.0f} s")
        evaluate(agent, f"clone + PPO {rc.timesteps} (normaliser frozen)")
