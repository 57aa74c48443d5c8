"""Where does reacting pay? flaky-link's workload and links, other phase lengths (Sim-v1).

``python phase_grid.py CAL.json``: for fast/slow phase lengths (s), the best static entry
(probe-free), the reactive bound probe-free and reading a 16 KiB probe, the anticipating bound;
mean time to target over seeds 1000-1007; h_r = 1 - reactive / static.
"""
import dataclasses, sys, warnings
import numpy as np
from commgym.env.sim import Calibration, SimModel, best_schedule, static_ranking
from commgym.experiments.config import load_run_config
warnings.simplefilter("ignore")
rc = load_run_config("flaky-link"); base = rc.env_config
cal = Calibration.load(sys.argv[1]); m = SimModel(cal, base.menu, base.steps_per_decision)
seeds = list(range(1000, 1008))
print(f"{'fast s':>6} {'slow s':>6} {'static':>22} {'react 0B':>9} {'h_r':>6} {'react 16K':>9} {'h_r':>6} {'anticip':>8} {'h':>6}")
for fast, slow in [(4, 2.4), (2, 2), (3, 3), (4, 4), (6, 3), (3, 6), (6, 6), (8, 4), (2, 6), (1.5, 1.5)]:
    sched, t = [], 0.0
    while t < base.time_budget_s:
        sched.append([round(t, 3), "10gbit"]); t += fast
        if t < base.time_budget_s:
            sched.append([round(t, 3), "10mbit"]); t += slow
    cfg = dataclasses.replace(base, network={"schedule": sched, "shift_s": 0.5})
    rk = static_ranking(m, cfg, seeds, 0)
    st = rk[0].mean_s
    def bound(pb, lag):
        return float(np.mean([best_schedule(m, cfg, s, pb, reaction_lag=lag)[0] or cfg.time_budget_s for s in seeds]))
    r0, r16, a0 = bound(0, 1), bound(16384, 1), bound(0, 0)
    print(f"{fast:6.1f} {slow:6.1f} {rk[0].config:>15} {st:6.2f} {r0:9.2f} {1 - r0 / st:6.3f} {r16:9.2f} {1 - r16 / st:6.3f} {a0:8.2f} {1 - a0 / st:6.3f}", flush=True)
