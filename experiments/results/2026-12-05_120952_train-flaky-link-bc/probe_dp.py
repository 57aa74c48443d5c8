"""Reactive and anticipating bounds on flaky-link against the probe's size (Sim-v1, seeds 1000-1007)."""
import sys, warnings
import numpy as np
from commgym.env.sim import Calibration, SimModel, best_schedule, static_ranking
from commgym.experiments.config import load_run_config
warnings.simplefilter("ignore")
rc = load_run_config("flaky-link-bc"); cfg = rc.env_config
cal = Calibration.load(sys.argv[1]); m = SimModel(cal, cfg.menu, cfg.steps_per_decision)
seeds = list(range(1000, 1008))
rk = static_ranking(m, cfg, seeds, 0)
print(f"best static entry, probe-free: {rk[0].config} {rk[0].mean_s:.3f} s")
for pb in (0, 1024, 4096, 16384, 65536):
    out = []
    for lag in (0, 1):
        ts = [best_schedule(m, cfg, s, pb, reaction_lag=lag)[0] or cfg.time_budget_s for s in seeds]
        out.append(np.mean(ts))
    print(f"probe {pb:6d} B: on 10 Mbit/s {m.probe_s(pb, 10e6)*1e3:6.2f} ms, on 10 Gbit/s {m.probe_s(pb, 10e9)*1e3:5.2f} ms;"
          f" anticipating {out[0]:.3f} s, reactive {out[1]:.3f} s")
