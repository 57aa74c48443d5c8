"""Replay a real episode's observations through a saved policy; show off-distribution fields.

``python replay_real_observations.py POLICY.zip DECISIONS.csv [CALIBRATION.json]`` (the
calibration defaults to the one this run used, kept in ../2026-12-05_120952_train-flaky-link-bc/).
"""
import sys, warnings, numpy as np, pandas as pd
warnings.simplefilter("ignore")
from commgym.agents.registry import load_agent
from commgym.env.sim import Calibration, SimEnv
from commgym.env.spaces import ObservationBuilder, OBSERVATION_FIELDS
from commgym.experiments.config import load_run_config
rc = load_run_config("link-lottery-bc"); cfg = rc.env_config
cal = Calibration.load(sys.argv[3] if len(sys.argv) > 3 else "../2026-12-05_120952_train-flaky-link-bc/cal.json")
env = SimEnv(cal, cfg)
agent = load_agent(sys.argv[1], env)
d = pd.read_csv(sys.argv[2])
ob = ObservationBuilder(env.menu, cfg.world_size, cal.num_params)
names = [f.name for f in OBSERVATION_FIELDS]
norm = agent._norm
a0 = env.menu.default_action()
obs = ob.reset(2.3026, a0)  # ln(10): the untrained model's held-out loss
state = None; start = np.array([True])
act, state = agent.predict(obs, state, start, True)
print("first:", env.menu.decode(act))
for i, row in d.iterrows():
    cfgs = env.model.entries
    k = cfgs.index(row.config); a = np.array(np.unravel_index(k, tuple(env.menu.nvec)))
    o = ob.build(row.to_dict(), a, min(1, row.train_time_s / cfg.time_budget_s))
    act, state = agent.predict(o, state, np.array([False]), True)
    z = (o - norm.obs_rms.mean[-len(o):]) / np.sqrt(norm.obs_rms.var[-len(o):] + 1e-8)
    big = {names[j]: round(float(z[j]), 1) for j in np.argsort(-np.abs(z))[:4]}
    print(i, row.config, "->", env.menu.decode(act), big)
