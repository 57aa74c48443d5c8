"""The link clock's rules replayed over real ranks' probe readings.

python replay_real.py CAL RECORD_DIR

Reads the policy's decision CSVs of RECORD_DIR (`decisions-ppo_learned-seed*.csv`, `probe_s`
of every decision; record 2026-12-06_085551_train-flaky-link-clock) and counts the link
changes each rule of commgym.agents.features.LinkClock sees over each episode, against the
changes the readings show (fast <-> slow by a 40 ms split: the two links' readings lie
21.3 ms apart at their closest). Rules: the levels from flaky-link's simulator (CAL, the
calibration's modelled probe on 10 Mbit/s and 10 Gbit/s, commgym.agents.features.
probe_levels), and the move rule at 0.5 decades from the phase's median reading.
"""
import csv, glob, math, os, sys, warnings
warnings.simplefilter("ignore")
import numpy as np
from commgym.agents.features import LinkClock, probe_levels
from commgym.env.sim import SimEnv
from commgym.env.spaces import OBSERVATION_FIELDS, probe_gbps
from commgym.experiments.config import load_run_config

cal, rec = sys.argv[1], sys.argv[2]
cfg = load_run_config("flaky-link", {"env_kind": "sim", "calibration": cal})
levels = probe_levels(SimEnv(cal, cfg.env_config))
ms = [1e3 * 65536 * 2 * 3 / 4 * 8 / (10**v * 1e9) for v in levels]
print("levels (log10 Gbit/s):", [round(v, 3) for v in levels],
      "= probe ms", [round(m, 1) for m in ms], "split at",
      f"{math.sqrt(ms[0] * ms[1]):.1f} ms")
NAMES = [f.name for f in OBSERVATION_FIELDS]
rules = {"levels": lambda: LinkClock(levels=levels), "move 0.5 (median)": LinkClock}
seen = {k: 0 for k in rules}
actual = 0
for path in sorted(glob.glob(os.path.join(rec, "decisions-ppo_learned-seed*.csv"))):
    clocks = {k: f() for k, f in rules.items()}
    side = None
    for r in csv.DictReader(open(path)):
        t = float(r["probe_s"] or 0)
        if t <= 0:
            continue
        now_side = t >= 0.040
        actual += side is not None and now_side != side
        side = now_side
        obs = np.zeros(len(NAMES), dtype=np.float32)
        obs[NAMES.index("log10_probe_gbps")] = math.log10(probe_gbps(65536, t, 4))
        obs[NAMES.index("elapsed_frac")] = float(r["train_time_s"]) / 30.0
        for c in clocks.values():
            c.update(obs)
    for k, c in clocks.items():
        seen[k] += c.changes
print(f"the readings show {actual} link changes over the 8 episodes")
for k, v in seen.items():
    print(f"  rule {k:20s} sees {v}")
