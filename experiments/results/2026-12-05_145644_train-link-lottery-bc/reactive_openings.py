"""link-lottery in Sim-v1: the reactive bound per blind opening entry, and each entry's decision time per link.

``python reactive_openings.py CAL.json`` (the calibration this run used:
../2026-12-05_120952_train-flaky-link-bc/cal.json). Seeds 1000-1015, probe-free.
"""
import sys
import warnings

import numpy as np

from commgym.env.sim import Calibration, SimModel, adaptive_times, best_schedule, reactive_opening, static_ranking
from commgym.experiments.config import load_run_config

warnings.simplefilter("ignore")
cfg = load_run_config("link-lottery").env_config
m = SimModel(Calibration.load(sys.argv[1]), cfg.menu, cfg.steps_per_decision)
seeds = list(range(1000, 1016))
budget = cfg.time_budget_s
for rate in (10e9, 10e6):
    print(f"decision time on {rate / 1e9:g} Gbit/s: " + ", ".join(f"{e} {t.train_s:.3f} s" for e, t in zip(m.entries, m.timings(rate))))
rk = static_ranking(m, cfg, seeds)
print(f"best static entry {rk[0].config}: {rk[0].mean_s:.3f} s")
print(f"contextual oracle (the link known from the start): {np.mean([budget if t is None else t for t in adaptive_times(m, cfg, seeds, rk)]):.3f} s")
for k, e in enumerate(m.entries):
    ts = [best_schedule(m, cfg, s, reaction_lag=1, opening=k)[0] for s in seeds]
    print(f"reactive, opening {e:20s} {np.mean([budget if t is None else t for t in ts]):.3f} s")
k, t = reactive_opening(m, cfg, seeds)
print(f"best blind opening: {m.entries[k]} {t:.3f} s")
