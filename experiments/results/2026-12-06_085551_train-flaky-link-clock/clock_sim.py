"""PPO with a link clock, cloned from mpc in the simulator, on flaky-link: in-simulator times.

Usage: python clock_sim.py CAL OUT TIMESTEPS [EPISODES [PPO_JSON [SCENARIO [RANDOMIZE_JSON]]]]

clock_sim-flaky-t0.out: TIMESTEPS 0 (the clone); -t50k: 50000 PPO decisions; -t50k-lr: 50000 with
PPO_JSON {"learning_rate": 3e-5, "ent_coef": 0.0}; -lottery-t0.out: link-lottery, the clone,
RANDOMIZE_JSON {"compute_scale": [0.9, 1.7], "timing_noise": 0.15} (no schedule to jitter).
CAL: experiments/results/2026-12-06_053744_calibrate-sim/cal.json. Run at 3a2ef64 (the
clock and the mpc expert as in this record's commit). The flaky-link outputs were printed by
this script's earlier form, which played only `topk:0.01/25MB/H1` among the static entries
and took no SCENARIO or RANDOMIZE_JSON (flaky-link's recipe randomisation); the link-lottery
one by this form.
"""
import statistics, sys, time, warnings, json
from pathlib import Path
warnings.simplefilter("ignore")
import numpy as np
from commgym.agents import make_agent, rollout
from commgym.env.sim import SimEnv
from commgym.experiments.config import load_run_config
from commgym.experiments.tracking import Tracker
from commgym.experiments.train import learn_agent

cal, out, timesteps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
episodes = int(sys.argv[4]) if len(sys.argv) > 4 else 200
out.mkdir(parents=True, exist_ok=True)
ppo = {"history": 8, "normalize": True, "gamma": 0.999, "ent_coef": 0.003, "n_steps": 2048,
       "batch_size": 256, "n_epochs": 5, "link_clock": True, **json.loads(sys.argv[5] if len(sys.argv) > 5 else "{}")}
scenario = sys.argv[6] if len(sys.argv) > 6 else "flaky-link"
randomize = json.loads(sys.argv[7]) if len(sys.argv) > 7 else {"length_jitter": 0.4, "rate_swap": 0.1, "compute_scale": [0.9, 1.7], "timing_noise": 0.15}
cfg = load_run_config(scenario, {
    "agent": "ppo", "agent_kwargs": {"ppo": ppo}, "env_kind": "sim", "calibration": cal,
    "timesteps": timesteps, "baselines": [], "output_dir": str(out),
    "sim_randomize": randomize,
    "sim_warm_start": {"episodes": episodes, "epochs": 40, "expert": "mpc",
                       "expert_kwargs": {"link_from": "probe"}},
})
t0 = time.perf_counter()
with Tracker(f"sqlite:///{out}/m.db", experiment="x").start_run("t") as run:
    agent, cost, sim = learn_agent(cfg, None, run, out)
learn_s = time.perf_counter() - t0
env = SimEnv(cal, cfg.env_config)
seeds = list(range(1000, 1016))
def play(a, name):
    times, acts = [], {}
    for s in seeds:
        ep = rollout(env, a, s, target_loss=cfg.env_config.target_loss)
        times.append(cfg.env_config.time_budget_s if ep.time_to_target_s is None else ep.time_to_target_s)
        for st in ep.steps:
            acts.setdefault(st.network, {}).setdefault(st.config, 0)
            acts[st.network][st.config] += 1
    print(f"{name:28s} {statistics.fmean(times):6.2f} s  per condition {json.dumps(acts)}")
    return times
res = {}
res["policy"] = play(agent, f"ppo+clock (t={timesteps})")
for lf in ("probe", "timing"):
    m = make_agent("mpc", env, calibration=cal, link_from=lf); m.learn(300)
    res[f"mpc-{lf}"] = play(m, f"mpc link_from={lf}")
per = []
for name in env.menu.entry_names():
    per.append(play(make_agent(f"static:{name}", env), f"static {name}"))
ctx = [min(col) for col in zip(*per)]
print(f"{'per-seed best static':28s} {statistics.fmean(ctx):6.2f} s")
res["static"] = per; res["contextual"] = ctx
print(f"learn {learn_s:.0f} s")
json.dump(res, open(out / "times.json", "w"))
