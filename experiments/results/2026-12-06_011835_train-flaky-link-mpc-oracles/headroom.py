"""Headroom h and captured fraction C of a recorded `commgym train` run with both oracles.

python headroom_from_csvs.py RECORD_DIR

Reads the decision CSVs the evaluation wrote (one per player and seed): `oracle re-run
<entry>` players (oracle-static's near-tied entries, re-run on the evaluation seeds),
`oracle-adaptive`, the learned agent and the baselines. T_static per seed is the re-run
entry with the best mean (the conservative choice of commgym.experiments.reruns); h, C and
the paired differences use commgym's own estimators (commgym.experiments.headroom: paired
jackknife t-intervals, paired t-test). A miss counts as the budget.
"""
import csv
import glob
import os
import re
import statistics
import sys
from collections import defaultdict

from commgym.experiments.headroom import (
    captured_fraction, has_headroom, headroom, paired_difference, seeds_needed,
)

rec = sys.argv[1]
budget = 30.0
times = defaultdict(dict)
for path in sorted(glob.glob(os.path.join(rec, "decisions-*-seed*.csv"))):
    m = re.match(r"decisions-(.+)-seed(\d+)\.csv", os.path.basename(path))
    player, seed = m.group(1), int(m.group(2))
    rows = list(csv.DictReader(open(path)))
    last = rows[-1]
    reached = last["reason"] == "target_reached"
    times[player][seed] = float(last["train_time_s"]) if reached else budget
seeds = sorted(set.intersection(*(set(v) for v in times.values())))
print(f"seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}), players:")
for p, v in sorted(times.items(), key=lambda kv: statistics.fmean(kv[1][s] for s in seeds)):
    ts = [v[s] for s in seeds]
    print(f"  {p:45s} {statistics.fmean(ts):6.2f} s  " + " ".join(f"{t:5.2f}" for t in ts))
reruns = {p: v for p, v in times.items() if p.startswith("oracle_re-run") or p.startswith("oracle re-run")}
best = min(reruns, key=lambda p: statistics.fmean(reruns[p][s] for s in seeds))
ts = [reruns[best][s] for s in seeds]
adaptive_key = next(p for p in times if p.startswith("oracle-adaptive") or p.startswith("oracle_adaptive"))
ta = [times[adaptive_key][s] for s in seeds]
h = headroom(ts, ta)
print(f"T_static: {best} {statistics.fmean(ts):.2f} s; T_adaptive ({adaptive_key}) {statistics.fmean(ta):.2f} s")
need = seeds_needed(h)
print(f"h = {h} (z {h.z:.1f}); established by the 3x rule: {has_headroom(h)}; seeds needed: {need}")
for p, v in sorted(times.items()):
    if p in reruns or p == adaptive_key:
        continue
    tg = [v[s] for s in seeds]
    c = captured_fraction(ts, ta, tg)
    d, pv = paired_difference(tg, ts)
    print(f"  {p}: C = {c}; minus T_static {d} s per seed (paired t p = {pv:.3g})")
