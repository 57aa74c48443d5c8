"""The clock policy's real episodes replayed with the mpc-priced regret of each choice.

python replay_shield.py CONFIG CAL POLICY RECORD      (from the repository's root: a policy
file names its calibration by the path it was trained with)
SIGMA=0.25 python replay_shield.py ...                (the clock's filter reads with that
timing_sigma instead of the saved one; the policy's network unchanged)

Rebuilds each decision's observation from RECORD's `decisions-ppo_learned-seed*.csv` (as
replay_mpc.py of record 2026-12-06_141928 does), steps the saved POLICY over them (it
should choose what it played: a check of the reconstruction) and reads the priced regret of
its choice, `plan_times[choice] - min(plan_times)` of its clock's filter: what
`shield_regret_s` compares. Prints, per seed, the regret of every decision that took more
than 2 s on the ranks (a dense entry on the slow link) and the regret distribution of the
others, and per threshold how many decisions a shield would have replaced up to each
seed's first replacement (the replay is exact only up to there).
"""

import csv
import glob
import os
import sys
import warnings

import numpy as np

from commgym.agents import load_agent
from commgym.env.sim import SimEnv
from commgym.env.spaces import ObservationBuilder
from commgym.experiments.config import load_run_config

warnings.simplefilter("ignore")
config, cal, policy_path, rec = sys.argv[1:5]
cfg = load_run_config(config, {"env_kind": "sim", "calibration": cal})
env = SimEnv(cal, cfg.env_config)
names = env.menu.entry_names()
nvec = tuple(int(n) for n in env.menu.nvec)
budget = cfg.env_config.time_budget_s
THRESHOLDS = (0.25, 0.5, 1.0, 2.0, 4.0)
agree = total = 0
slow_regrets, other_regrets = [], []
first_override = {t: [] for t in THRESHOLDS}
for path in sorted(glob.glob(os.path.join(rec, "decisions-ppo_learned-seed*.csv"))):
    policy = load_agent(policy_path)
    if os.environ.get("SIGMA"):  # the filter's reading width replaced (the policy unchanged)
        policy._clock_filter.timing_sigma = float(os.environ["SIGMA"])
    if seed_once := not globals().get("_shown"):
        _shown = True
        f = policy._clock_filter
        print("learned dwells:", {k: [round(x, 2) for x in v] for k, v in f.prior_dwells.items()})
        print("by place:", {k: {p: [round(x, 2) for x in v] for p, v in d.items()} for k, d in f.prior_dwells_by_index.items()})
    rows = list(csv.DictReader(open(path)))
    seed = int(path.rsplit("seed", 1)[1].split(".")[0])
    obs, _ = env.reset(seed=seed, options={"probe": False})
    builder = ObservationBuilder(env.menu, cfg.env_config.world_size, env.calibration.num_params)
    builder.reset(env.model.progress.initial_loss, env.menu.default_action())
    ps = None
    start = np.array([True])
    regrets = []
    lines = []
    for i, r in enumerate(rows):
        a, ps = policy.predict(obs, ps, episode_start=start, deterministic=True)
        start = np.array([False])
        k = int(np.ravel_multi_index(tuple(a), nvec))
        played = r["config"]
        total += 1
        agree += names[k] == played
        clock = ps[0][0]
        times = clock.plan_times
        g = float("nan") if times is None else float(times[k] - times.min())
        best = None if times is None else names[int(np.argmin(times))]
        regrets.append(g)
        slow = float(r["decision_train_time_s"]) > 2.0
        (slow_regrets if slow else other_regrets).append(g)
        if slow or g > 0.25:
            t0 = float(r["train_time_s"]) - float(r["decision_train_time_s"])
            lines.append(
                f"    {'SLOW' if slow else '    '} #{i + 1:3d} t={t0:6.2f} played {played:22s} "
                f"replayed {names[k]:22s} regret {g:7.3f} s  filter's best {best}"
                f"  ({float(r['decision_train_time_s']):.2f} s on the ranks)"
            )
            if slow and clock.state and "since_s" in clock.state:
                rate, belief, change = clock.agent.link_outlook(clock.state, t0)
                lines.append(f"         filter: {rate and rate / 1e9:g} Gbit/s p={belief:.2f} change={change:.2f} "
                             f"since {clock.state['since_s']:.2f} dwells {clock.state['dwells']}")
        action = np.array([int(x) for x in r["action"].split()], dtype=np.int64)
        m = {kk: float(v) if v not in ("", "True", "False") else (None if v == "" else v == "True")
             for kk, v in r.items() if kk not in ("config", "compression", "action", "reason", "bucket_bytes")}
        m["compression_error"] = m.get("compression_error")
        obs = builder.build(m, action, float(r["train_time_s"]) / budget)
    for t in THRESHOLDS:
        hit = [i for i, g in enumerate(regrets) if g > t]
        first_override[t].append(hit[0] + 1 if hit else None)
    print(f"seed {seed}: {len(rows)} decisions, max regret {np.nanmax(regrets):.3f} s")
    print("\n".join(lines))
print(f"\nthe replayed policy chose what it played on {agree}/{total} decisions")
o = np.array([g for g in other_regrets if np.isfinite(g)])
print(f"regret of the decisions under 2 s on the ranks ({len(o)}): median {np.median(o):.3f} s, "
      f"p90 {np.percentile(o, 90):.3f}, p99 {np.percentile(o, 99):.3f}, max {o.max():.3f}")
print(f"regret of the decisions over 2 s ({len(slow_regrets)}): "
      + ", ".join(f"{g:.3f}" for g in slow_regrets))
for t in THRESHOLDS:
    print(f"shield_regret_s {t}: first replacement per seed (decision #) {first_override[t]}")
