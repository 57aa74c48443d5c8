"""The clock policy's real episodes replayed through the policy and through its expert.

python replay_mpc.py CAL POLICY RECORD [SEEDS]

Rebuilds each decision's observation from RECORD's `decisions-ppo_learned-seed*.csv` (the
env's own ObservationBuilder over the measured columns; the episode's first observation is
the simulator's reset observation on CAL, whose initial loss stands in for the real one),
then steps, over the same observations:
- the saved policy POLICY (`commgym.agents.load_agent`, predict-only as a replay in a
  user's job loads it): it should choose what it played on the ranks, which checks the
  reconstruction;
- `mpc` reading its timing, learned for 300 simulated decisions on CAL (the recipe's expert).
Prints, per seed, the decisions where the two differ and marks the real decisions that took
more than 2 s (a dense entry on the 10 Mbit/s link), with the filter's view there.
"""

import csv
import glob
import os
import sys
import warnings

import numpy as np

from commgym.agents import load_agent, make_agent
from commgym.env.sim import SimEnv
from commgym.env.spaces import ObservationBuilder
from commgym.experiments.config import load_run_config

warnings.simplefilter("ignore")
cal, policy_path, rec = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = load_run_config("flaky-link", {"env_kind": "sim", "calibration": cal})
env = SimEnv(cal, cfg.env_config)
names = env.menu.entry_names()
nvec = tuple(int(n) for n in env.menu.nvec)
policy = load_agent(policy_path)
mpc = make_agent("mpc", env, calibration=cal, link_from="timing")
mpc.learn(300)
budget = cfg.env_config.time_budget_s
paths = sorted(glob.glob(os.path.join(rec, "decisions-ppo_learned-seed*.csv")))
if len(sys.argv) > 4:
    keep = {f"seed{s}." for s in sys.argv[4].split(",")}
    paths = [p for p in paths if any(k in p for k in keep)]
agree_policy = agree_mpc = total = 0
for path in paths:
    rows = list(csv.DictReader(open(path)))
    seed = int(path.rsplit("seed", 1)[1].split(".")[0])
    obs, _ = env.reset(seed=seed, options={"probe": False})
    builder = ObservationBuilder(env.menu, cfg.env_config.world_size, env.calibration.num_params)
    builder.reset(env.model.progress.initial_loss, env.menu.default_action())
    ps = ms = None
    start = np.array([True])
    lines = []
    for i, r in enumerate(rows):
        a_pol, ps = policy.predict(obs, ps, episode_start=start, deterministic=True)
        a_mpc, ms = mpc.predict(obs, ms, episode_start=start, deterministic=True)
        start = np.array([False])
        k_pol = names[int(np.ravel_multi_index(tuple(a_pol), nvec))]
        k_mpc = names[int(np.ravel_multi_index(tuple(a_mpc), nvec))]
        played = r["config"]
        total += 1
        agree_policy += k_pol == played
        agree_mpc += k_mpc == played
        slow = float(r["decision_train_time_s"]) > 2.0
        if slow or k_mpc != played:
            view = ""
            if ms and "since_s" in ms:
                now = (float(r["train_time_s"]) - float(r["decision_train_time_s"]))
                rate, belief, change = mpc.link_outlook(ms, now)
                view = f" mpc's filter: {rate and rate / 1e9:g} Gbit/s p={belief:.2f} change={change:.2f}"
            # the policy's own clock (the clocks ride first in its predict state)
            clock = ps[0][0] if isinstance(ps[0], list) else ps[0]
            if getattr(clock, "state", None) and "since_s" in clock.state:
                now = float(r["train_time_s"]) - float(r["decision_train_time_s"])
                rate, belief, change = clock.agent.link_outlook(clock.state, now)
                view += f"; policy's clock: {rate and rate / 1e9:g} Gbit/s p={belief:.2f} change={change:.2f}"
            lines.append(f"    {'SLOW ' if slow else '     '}t={float(r['train_time_s']) - float(r['decision_train_time_s']):6.2f} "
                         f"played {played:20s} replayed policy {k_pol:20s} mpc {k_mpc:20s}{view}")
        action = np.array([int(x) for x in r["action"].split()], dtype=np.int64)
        m = {k: float(v) if v not in ("", "True", "False") else (None if v == "" else v == "True")
             for k, v in r.items() if k not in ("config", "compression", "action", "reason", "bucket_bytes")}
        m["compression_error"] = m.get("compression_error")
        obs = builder.build(m, action, float(r["train_time_s"]) / budget)
    print(f"seed {seed}: {len(rows)} decisions")
    print("\n".join(lines))
print(f"over {total} decisions: the replayed policy chooses what it played on {agree_policy / total:.1%}, "
      f"mpc on the same observations on {agree_mpc / total:.1%}")
