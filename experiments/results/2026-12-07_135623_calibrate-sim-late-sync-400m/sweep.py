import yaml, sys
from commgym.env import EnvConfig
from commgym.env.sim.calibration import Calibration
from commgym.env.sim.model import SimModel
from commgym.env.sim.planner import best_schedule, headroom, static_ranking
D = "experiments/results/2026-12-07_135623_calibrate-sim-late-sync-400m/"
env = yaml.safe_load(open(D + "late-sync-400m.yaml"))["env"]
cal = Calibration.load(D + "cal.json")
SEEDS = list(range(1000, 1008))
for rate in ["300mbit", "400mbit", "500mbit", "1gbit"]:
    c = EnvConfig(**dict(env, network={"schedule": [[0, rate]]}))
    model = SimModel(cal, c.menu, c.steps_per_decision)
    rk = static_ranking(model, c, SEEDS, 0)
    out = [f"{rate}: static {rk[0].config} {rk[0].mean_s:.2f}"]
    for every_s in (2.0, 1.0):
        runs = [best_schedule(model, c, s, 0, every_s=every_s) for s in SEEDS]
        t_ad, h = headroom(rk[0].mean_s, [r[0] for r in runs], c.time_budget_s)
        out.append(f"every {every_s}: {t_ad:.2f} h {h:.3f}")
    print("; ".join(out), flush=True)
