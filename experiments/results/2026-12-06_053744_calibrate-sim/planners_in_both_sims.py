"""mpc planning with the refit (two-decision) vs the old (pair) switch model, each played in
BOTH simulators (truth = the old pair form, truth = the refit form): robustness to which
form is right. 16 seeds per scenario; mpc learns 300 decisions in its own form's simulator.

python planners_in_both_sims.py OLD_CAL.json NEW_CAL.json [SCENARIO ...]
  (here: ../2026-12-05_120952_train-flaky-link-bc/cal.json cal.json)

SCENARIO: flaky-link, variant (the held-back variant of record 2026-12-06_025407), or
link-lottery (then also the contextual oracle in both simulators); default: the first two.
"""
import os
import statistics
import sys
import warnings

from commgym.agents import make_agent
from commgym.agents.rollout import rollout
from commgym.env.sim import SimEnv, adaptive_times, static_ranking
from commgym.experiments.config import load_run_config

warnings.simplefilter("ignore")
OLD, NEW = sys.argv[1], sys.argv[2]
HERE = os.path.dirname(os.path.abspath(__file__))
VARIANT = os.path.join(HERE, "..", "2026-12-06_025407_train-flaky-variant-mpc-sim",
                       "flaky-variant-mpc-sim.yaml")
SCENARIOS = {"flaky-link": ("flaky-link", range(1000, 1016)),
             "variant": (VARIANT, range(2000, 2016)),
             "link-lottery": ("link-lottery", range(1000, 1016))}
for name in sys.argv[3:] or ["flaky-link", "variant"]:
    scenario, seeds = SCENARIOS[name]
    rc = load_run_config(scenario, {"calibration": NEW})
    cfg, seeds = rc.env_config, list(seeds)
    for truth_name, truth in (("pair-form sim", OLD), ("refit sim", NEW)):
        best = static_ranking(SimEnv(truth, cfg).model, cfg, seeds)[0]
        line = f"{name:13s} {truth_name:13s} best static {best.config} {best.mean_s:.2f} s;"
        for label, cal in (("old planner", OLD), ("refit planner", NEW)):
            env = SimEnv(truth, cfg)
            agent = make_agent("mpc", SimEnv(cal, cfg), calibration=cal, seed=rc.seed).learn(300)
            ts, sw = [], []
            for s in seeds:
                ep = rollout(env, agent, s, target_loss=cfg.target_loss)
                ts.append(ep.time_to_target_s or cfg.time_budget_s)
                c = [st.config for st in ep.steps]
                sw.append(sum(a != b for a, b in zip(c, c[1:])))
            line += f" {label} {statistics.fmean(ts):.2f} s ({statistics.fmean(sw):.1f} switches)"
        if name == "link-lottery":
            ctx = adaptive_times(SimEnv(truth, cfg).model, cfg, seeds)
            line += f"; contextual oracle {statistics.fmean(t or cfg.time_budget_s for t in ctx):.2f} s"
        print(line, flush=True)
