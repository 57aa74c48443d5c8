"""flaky-link-clock's recipe with DAgger rounds after the clone, in the simulator: the policy's
time (mean, and its misses and worst seeds: what went wrong on the ranks) beside mpc and the
static entries.

Usage: python dagger_sim.py CAL OUT DAGGER_ROUNDS BELIEF [REGRET_SCALE_S]

Learns `experiments/configs/flaky-link-clock.yaml` on CAL with `sim_warm_start.dagger_rounds`
DAGGER_ROUNDS (0: the recipe as it was) and the clock's `belief` BELIEF (1: the filter's link,
its probability and the change probability appended; 0: the recipe as it was) and, given,
`sim_warm_start.regret_scale_s` REGRET_SCALE_S (cost-weighted cloning), then plays
seeds 1000-1015 in flaky-link's simulator as it is and with the decisions' timing perturbed
as on a loaded machine (compute_scale 1.3 and 1.6, timing_noise 0.15): the policy, mpc reading its timing (the expert's kind, learned for 300
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
rounds, belief = int(sys.argv[3]), bool(int(sys.argv[4]))
regret = f", regret_scale_s: {float(sys.argv[5])}" if len(sys.argv) > 5 else ""
out.mkdir(parents=True, exist_ok=True)
# a variant file (agent_kwargs merge per agent under `extends`; the recipe's other settings kept)
recipe = out / "recipe.yaml"
recipe.write_text(
    f"extends: {Path('experiments/configs/flaky-link-clock.yaml').resolve()}\n"
    "sim_warm_start: {episodes: 200, epochs: 40, expert: mpc, "
    f"expert_kwargs: {{link_from: timing}}, dagger_rounds: {rounds}{regret}}}\n"
    f"agent_kwargs: {{ppo: {{link_clock: {{reader: mpc, belief: {str(belief).lower()}}}}}}}\n"
)
cfg = load_run_config(recipe, over)
t0 = time.perf_counter()
with Tracker(f"sqlite:///{out}/m.db", experiment="x").start_run("t") as run:
    agent, cost, sim = learn_agent(cfg, None, run, out)
print(f"learned in {time.perf_counter() - t0:.0f} s; clock {agent.link_clock}", flush=True)
budget = cfg.env_config.time_budget_s
seeds = list(range(1000, 1016))
for scale, noise in ((1.0, 0.0), (1.3, 0.15), (1.6, 0.15)):
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
        worst = sorted(times)[-3:]
        misses = sum(t >= budget for t in times)
        print(f"  {name:32s} {statistics.fmean(times):6.2f} s  misses {misses}, worst "
              f"{', '.join(f'{t:.2f}' for t in worst)}  {json.dumps(acts)}", flush=True)
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
