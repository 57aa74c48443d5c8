"""The link clock with the calibrated links' levels, cloned from mpc, in the simulator with
and without the real probe's spread.

Usage: python clock_noise_sim.py CAL OUT [PROBE_NOISE_TRAIN [TIMESTEPS [EXPERT_LINK_FROM]]]

Learns flaky-link-clock's recipe (the clone of mpc, reading the link as EXPERT_LINK_FROM says
(default probe), PPO's policy with a
link clock; `link_clock: true` now reads the simulator's probe levels) with the recipe's
randomisation plus `probe_noise: PROBE_NOISE_TRAIN` (default 0.5, the natural-log s.d. of the
real probe's readings on 10 Gbit/s, record 2026-12-06_085551_train-flaky-link-clock), then
plays seeds 1000-1015 in flaky-link's simulator as it is (`probe_noise` 0) and with the real
spread (0.5): the policy, mpc reading the probe and reading its timing, each static entry,
and the per-seed best static entry.
"""
import json, statistics, sys, time, warnings
from pathlib import Path
warnings.simplefilter("ignore")
from commgym.agents import make_agent, rollout
from commgym.env.sim import SimEnv
from commgym.experiments.config import load_run_config
from commgym.experiments.tracking import Tracker
from commgym.experiments.train import learn_agent

cal, out = sys.argv[1], Path(sys.argv[2])
noise_train = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5
timesteps = int(sys.argv[4]) if len(sys.argv) > 4 else 0
link_from = sys.argv[5] if len(sys.argv) > 5 else "probe"  # how the expert mpc reads the link
out.mkdir(parents=True, exist_ok=True)
ppo = {"history": 8, "normalize": True, "gamma": 0.999, "ent_coef": 0.003, "n_steps": 2048,
       "batch_size": 256, "n_epochs": 5, "probe": True, "link_clock": True}
randomize = {"length_jitter": 0.4, "rate_swap": 0.1, "compute_scale": [0.9, 1.7],
             "timing_noise": 0.15, "probe_noise": noise_train}
cfg = load_run_config("flaky-link", {
    "agent": "ppo", "agent_kwargs": {"ppo": ppo}, "env_kind": "sim", "calibration": cal,
    "timesteps": timesteps, "baselines": [], "output_dir": str(out), "sim_randomize": randomize,
    "sim_warm_start": {"episodes": 200, "epochs": 40, "expert": "mpc",
                       "expert_kwargs": {"link_from": link_from}},
})
t0 = time.perf_counter()
with Tracker(f"sqlite:///{out}/m.db", experiment="x").start_run("t") as run:
    agent, cost, sim = learn_agent(cfg, None, run, out)
print(f"learned in {time.perf_counter() - t0:.0f} s; clock {agent.link_clock}")
seeds = list(range(1000, 1016))
res = {}
for noise in (0.0, 0.5):
    env = SimEnv(cal, cfg.env_config)
    env.probe_noise = noise
    def play(a, name):
        times, acts = [], {}
        for s in seeds:
            ep = rollout(env, a, s, target_loss=cfg.env_config.target_loss)
            times.append(cfg.env_config.time_budget_s if ep.time_to_target_s is None
                         else ep.time_to_target_s)
            for st in ep.steps:
                acts.setdefault(st.network, {}).setdefault(st.config, 0)
                acts[st.network][st.config] += 1
        print(f"  {name:30s} {statistics.fmean(times):6.2f} s  {json.dumps(acts)}")
        return times
    print(f"simulator with probe_noise {noise}:")
    r = res[str(noise)] = {}
    r["policy"] = play(agent, f"clone ({link_from} expert, noise {noise_train})")
    for lf in ("probe", "timing"):
        m = make_agent("mpc", env, calibration=cal, link_from=lf)
        m.learn(300)
        r[f"mpc-{lf}"] = play(m, f"mpc link_from={lf}")
    per = [play(make_agent(f"static:{n}", env), f"static {n}") for n in env.menu.entry_names()]
    ctx = [min(c) for c in zip(*per)]
    best = min(per, key=statistics.fmean)
    print(f"  {'best static entry':30s} {statistics.fmean(best):6.2f} s; "
          f"per-seed best {statistics.fmean(ctx):.2f} s")
    r["static"], r["contextual"] = per, ctx
json.dump(res, open(out / "times.json", "w"))
