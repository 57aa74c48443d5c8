"""The simulator's own headroom on this board's scenario and seeds (the headroom gate's figure).

Runs oracle-static and oracle-adaptive inside commgym/Sim-v1 on the calibration the board's
learners used, on the board's evaluation seeds, as `commgym bench sim` does for its headroom
gate (probe-free), and prints sim h next to the real h of the board's headroom JSON.

python sim_headroom.py SCENARIO.yaml CAL.json HEADROOM.json
"""

import json
import sys

from commgym.env.sim import Calibration, SimModel, adaptive_times, headroom, static_ranking
from commgym.experiments.config import load_run_config

cfg = load_run_config(sys.argv[1])
env_cfg = cfg.env_config
cal = Calibration.load(sys.argv[2])
cal.check(env_cfg)
real = json.load(open(sys.argv[3]))
seeds = real["seeds"]
every_s = cfg.baseline_kwargs.get("oracle-adaptive", {}).get("search_every_s")
model = SimModel(cal, env_cfg.menu, env_cfg.steps_per_decision)
ranking = static_ranking(model, env_cfg, seeds, 0)
ad = adaptive_times(model, env_cfg, seeds, ranking, 0, every_s=every_s)
budget = float(env_cfg.time_budget_s)
t_ad, h_sim = headroom(ranking[0].mean_s, ad, budget)
print(f"seeds {seeds}")
print("simulator's static ranking (mean time to target, s):")
for r in ranking:
    print(f"  {r.config:22s} {r.mean_s:6.2f}")
print(f"sim: T_static {ranking[0].mean_s:.2f} s ({ranking[0].config}), T_adaptive {t_ad:.2f} s, h {h_sim:.3f}")
h = real["headroom"]
print(f"real (this board): h {h['value']:.3f} [{h['low']:.3f}, {h['high']:.3f}]")
print(f"|sim - real| = {abs(h_sim - h['value']):.3f} (gate: <= 0.05)")
