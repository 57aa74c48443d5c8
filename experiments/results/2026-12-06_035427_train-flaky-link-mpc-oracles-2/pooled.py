"""Pooled headroom h and captured fraction C over invocations of the same scenario.

python pooled.py RECORD_DIR [RECORD_DIR ...]

Each record is one `commgym train` invocation with both oracles (decision CSVs per player
and seed, as `../2026-12-06_011835_train-flaky-link-mpc-oracles/headroom.py` reads them).
Per invocation, T_static is its own best re-run entry (the conservative choice); the
per-seed times of every invocation are then pooled (their seeds differ) and h, C and the
paired differences computed with commgym's estimators (commgym.experiments.headroom).
A miss counts as the budget. Players are matched by name across invocations.
"""

import csv
import glob
import os
import re
import statistics
import sys
from collections import defaultdict

from commgym.experiments.headroom import (
    captured_fraction,
    has_headroom,
    headroom,
    paired_difference,
    seeds_needed,
)

BUDGET = 30.0


def read(rec):
    times = defaultdict(dict)
    for path in sorted(glob.glob(os.path.join(rec, "decisions-*-seed*.csv"))):
        m = re.match(r"decisions-(.+)-seed(\d+)\.csv", os.path.basename(path))
        rows = list(csv.DictReader(open(path)))
        last = rows[-1]
        reached = last["reason"] == "target_reached"
        times[m.group(1)][int(m.group(2))] = float(last["train_time_s"]) if reached else BUDGET
    return times


pooled = defaultdict(list)
for rec in sys.argv[1:]:
    times = read(rec)
    seeds = sorted(set.intersection(*(set(v) for v in times.values())))
    reruns = {p: v for p, v in times.items() if p.startswith("oracle_re-run")}
    best = min(reruns, key=lambda p: statistics.fmean(reruns[p][s] for s in seeds))
    print(f"{os.path.basename(os.path.normpath(rec))}: seeds {seeds[0]}-{seeds[-1]}, "
          f"T_static = {best} {statistics.fmean(reruns[best][s] for s in seeds):.2f} s")
    pooled["T_static"] += [reruns[best][s] for s in seeds]
    for p, v in times.items():
        if p not in reruns:
            pooled[p] += [v[s] for s in seeds]
n = len(pooled["T_static"])
ts, ta = pooled["T_static"], pooled["oracle-adaptive"]
h = headroom(ts, ta)
print(f"pooled over {n} seeds: T_static {statistics.fmean(ts):.2f} s, oracle-adaptive "
      f"{statistics.fmean(ta):.2f} s")
print(f"h = {h} (z {h.z:.1f}); established by the 3x rule: {has_headroom(h)}; "
      f"seeds needed: {seeds_needed(h)}")
for p, tg in sorted(pooled.items()):
    if p in ("T_static", "oracle-adaptive") or len(tg) != n:
        continue
    c = captured_fraction(ts, ta, tg)
    d, pv = paired_difference(tg, ts)
    print(f"  {p} {statistics.fmean(tg):.2f} s: C = {c}; minus T_static {d} s per seed "
          f"(paired t p = {pv:.3g})")
