"""flaky-link-clock's recipe (PPO's policy with a link clock read by mpc's timing filter,
probe-free, cloned from mpc) in the simulator: its time beside mpc and the static entries.

Usage: python clock_mpc_sim.py CAL OUT [TIMESTEPS]

Learns `experiments/configs/flaky-link-clock.yaml` on CAL (TIMESTEPS PPO decisions after the
clone, default the recipe's 0), then plays seeds 1000-1015 in flaky-link's simulator as it
is and with the decisions' timing perturbed as on a loaded machine (compute_scale 1.3,
timing_noise 0.15): the policy, mpc reading its timing (the expert's kind, learned for 300
decisions), every static entry and the per-seed best static entry. A miss counts as the
budget.
"""

import json
import statistics
import sys
import time
import warnings
from pathlib import Path

from commgym.agents import make_agent, rollout
from commgym.env.sim import SimEnv
from commgym.experiments.config import load_run_config
from commgym.experiments.tracking import Tracker
from commgym.experiments.train import learn_agent

warnings.simplefilter("ignore")
cal, out = sys.argv[1], Path(sys.argv[2])
over = {"env_kind": "sim", "calibration": cal, "baselines": [], "output_dir": str(out)}
if len(sys.argv) > 3:
    over["timesteps"] = int(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
cfg = load_run_config("experiments/configs/flaky-link-clock.yaml", over)
t0 = time.perf_counter()
with Tracker(f"sqlite:///{out}/m.db", experiment="x").start_run("t") as run:
    agent, cost, sim = learn_agent(cfg, None, run, out)
print(f"learned in {time.perf_counter() - t0:.0f} s; clock {agent.link_clock}", flush=True)
budget = cfg.env_config.time_budget_s
seeds = list(range(1000, 1016))
for scale, noise in ((1.0, 0.0), (1.3, 0.15)):
    env = SimEnv(cal, cfg.env_config)
    env.compute_scale, env.timing_noise = scale, noise

    def play(a, name, env=env):
        times, acts = [], {}
        for s in seeds:
            ep = rollout(env, a, s, target_loss=cfg.env_config.target_loss)
            times.append(budget if ep.time_to_target_s is None else ep.time_to_target_s)
            for st in ep.steps:
                acts.setdefault(st.network, {}).setdefault(st.config, 0)
                acts[st.network][st.config] += 1
        print(f"  {name:32s} {statistics.fmean(times):6.2f} s  {json.dumps(acts)}", flush=True)
        return times

    print(f"simulator, compute_scale {scale}, timing_noise {noise}:")
    play(agent, "policy (clone, mpc-timing clock)")
    m = make_agent("mpc", env, calibration=cal, link_from="timing")
    m.learn(300)
    play(m, "mpc link_from=timing")
    per = [play(make_agent(f"static:{n}", env), f"static {n}") for n in env.menu.entry_names()]
    best = min(per, key=statistics.fmean)
    ctx = [min(c) for c in zip(*per, strict=True)]
    print(f"  {'best static entry':32s} {statistics.fmean(best):6.2f} s; per-seed best "
          f"{statistics.fmean(ctx):.2f} s", flush=True)
