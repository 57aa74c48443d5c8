"""Why the link clock failed on the ranks: the probe's spread on the fast link.

python probe_spread.py RECORD_DIR

Reads the policy's decision CSVs (`decisions-ppo_learned-seed*.csv`: `probe_s`, the 64 KiB
probe all-reduce's time at each decision's end; the static players and mpc ran probe-free)
and prints the readings' spread per link (a reading >= 40 ms is taken as the 10 Mbit/s link:
the two groups are far apart), then replays the clock's change rule (commgym.agents.features.
LinkClock: a move of more than 0.5 decades from the reading that opened the phase) over each
seed's readings and counts the changes it detects against the changes of link the readings
show (fast <-> slow by the 40 ms split).
"""

import csv
import glob
import math
import os
import statistics
import sys

import numpy as np

from commgym.agents.features import LinkClock
from commgym.env.spaces import OBSERVATION_FIELDS, probe_gbps

NAMES = [f.name for f in OBSERVATION_FIELDS]
SPLIT_S = 0.040
fast, slow = [], []
detected = actual = 0
for path in sorted(glob.glob(os.path.join(sys.argv[1], "decisions-ppo_learned-seed*.csv"))):
    clock = LinkClock()
    side, rows = None, list(csv.DictReader(open(path)))
    for r in rows:
        t = float(r["probe_s"] or 0)
        if t <= 0:
            continue
        (slow if t >= SPLIT_S else fast).append(t)
        now_side = t >= SPLIT_S
        actual += side is not None and now_side != side
        side = now_side
        obs = np.zeros(len(NAMES), dtype=np.float32)
        obs[NAMES.index("log10_probe_gbps")] = math.log10(probe_gbps(65536, t, 4))
        obs[NAMES.index("elapsed_frac")] = float(r["train_time_s"]) / 30.0
        clock.update(obs)
    detected += clock.changes
for name, v in (("10 Gbit/s", fast), ("10 Mbit/s", slow)):
    v = sorted(v)
    print(f"{name}: {len(v)} readings, median {statistics.median(v) * 1e3:.1f} ms, "
          f"p5 {v[len(v) // 20] * 1e3:.1f}, p95 {v[len(v) * 19 // 20] * 1e3:.1f}, "
          f"min {v[0] * 1e3:.1f}, max {v[-1] * 1e3:.1f} ms "
          f"({math.log10(v[-1] / v[0]):.2f} decades)")
print(f"the clock's rule detected {detected} link changes over the 8 episodes; the readings "
      f"show {actual} (fast <-> slow)")
