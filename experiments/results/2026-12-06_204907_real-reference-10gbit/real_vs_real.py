"""How reproducible is the real 10 Gbit/s ranking the simulator's ranking gate is held to?

Runs the real oracle-static search on link-lottery's 10 Gbit/s link (held fixed) on seeds
1001 and 1003 again, as record 2026-12-05_033719_bench-sim's cached reference did (same
workload, menu, target, budget, seeds), and prints every entry's mean time to target in both
runs, Kendall's tau between the two real runs, and the simulator's tau against each (the
calibration of record 2026-12-06_140516, the gate's). Run from the repository root, as root.

python real_vs_real.py OUT.json
"""

import json
import sys
import warnings

import numpy as np

from commgym.agents.oracle import OracleStaticAgent
from commgym.env import EnvConfig
from commgym.env.sim import Calibration, SimModel, static_ranking
from commgym.experiments.bench.sim import episode_cell, fixed_env, kendall_tau
from commgym.experiments.config import load_run_config

warnings.simplefilter("ignore")
SEEDS = [1001, 1003]
SPEC = "10gbit"
env_cfg = load_run_config("link-lottery").env_config
budget = float(env_cfg.time_budget_s)
old = json.load(open("experiments/results/2026-12-05_033719_bench-sim/real.json"))["cells"]
entries = env_cfg.menu.entry_names()


def key(times):
    return (sum(t is None for t in times), float(np.mean([budget if t is None else t for t in times])))


env = fixed_env(env_cfg, SPEC)
try:
    oracle = OracleStaticAgent(env, seeds=SEEDS)
    oracle.learn()
    new = {
        f"{SPEC}|{s}|{row.config}": episode_cell(ep)
        for row in oracle.ranking
        for s, ep in zip(SEEDS, row.episodes, strict=True)
    }
finally:
    env.close()
json.dump(new, open(sys.argv[1], "w"), indent=1)

cal = Calibration.load("experiments/results/2026-12-06_140516_calibrate-sim-flaky-link/cal.json")
fixed = EnvConfig(**{**env_cfg.to_dict(), "network": SPEC})
model = SimModel(cal, env_cfg.menu, env_cfg.steps_per_decision)
sim = {r.config: r.rank_key()[:2] for r in static_ranking(model, fixed, SEEDS, 0)}
runs = {
    "real 2026-12-05": {e: key([old[f"{SPEC}|{s}|{e}"]["time"] for s in SEEDS]) for e in entries},
    "real now": {e: key([new[f"{SPEC}|{s}|{e}"]["time"] for s in SEEDS]) for e in entries},
    "simulator": sim,
}


def positions(d):
    order = sorted(d, key=d.get)
    return [order.index(e) for e in entries]


print(f"{'entry':22s}" + "".join(f"{n:>18s}" for n in runs))
for e in sorted(entries, key=runs["real now"].get):
    print(f"{e:22s}" + "".join(f"{runs[n][e][1]:18.2f}" for n in runs))
names = list(runs)
for i, a in enumerate(names):
    for b in names[i + 1 :]:
        tau = kendall_tau(positions(runs[a]), positions(runs[b]))
        best_a, best_b = min(runs[a], key=runs[a].get), min(runs[b], key=runs[b].get)
        print(f"tau({a}, {b}) = {tau:.2f}; best {best_a} / {best_b}")
