"""link-lottery's headroom and each learner's capture, per invocation and pooled.

python pooled_lottery.py RECORD_DIR [RECORD_DIR ...]

Each RECORD_DIR is one `commgym leaderboard` invocation of link-lottery with issue 38's
method (records 2026-12-06_072218_leaderboard-link-lottery-method, seeds 1000-1007, and
2026-12-06_102801_leaderboard-link-lottery-method-2, seeds 1008-1015): the decision CSVs
under its scenario folder and its headroom JSON. Per invocation:
- oracle-adaptive per seed is the re-run of the entry it kept for that seed's link (the
  contextual oracle);
- T_static is the conservative choice: the best mean over every static run on those seeds
  (oracle-static's re-runs of its near-tied entries, and best-static, itself a static entry
  re-run on the same seeds), which can only lower h and C.
The invocations' seeds differ, so the pooled figures join their per-seed times (each seed
with its own invocation's T_static entry); rollout-table is reported per invocation only
(the first one's was the probe-free-search bug). A miss counts as the budget. commgym's own
estimators (commgym.experiments.headroom).
"""

import glob
import json
import os
import statistics
import sys

from commgym.experiments.headroom import (
    captured_fraction,
    decision_times,
    has_headroom,
    headroom,
    paired_difference,
    seeds_needed,
)

BUDGET = 30.0
LEARNERS = ("mpc", "rollout-table")


def invocation(rec):
    """Per-seed times of oracle-adaptive, T_static's entry and the learners in one record."""
    (report_path,) = glob.glob(os.path.join(rec, "headroom-*.json"))
    report = json.load(open(report_path))
    times = dict(decision_times(os.path.join(rec, report["scenario"]), BUDGET))
    adaptive = {}
    for r in report["reruns"]:
        if r["oracle"] == "oracle-adaptive" and r["chosen"]:
            slug = "oracle_re-run_" + r["entry"].replace(":", "_").replace("/", "_")
            for s in r["seeds"]:
                adaptive[s] = times[slug][s]
    seeds = sorted(adaptive)
    statics = [p for p in times if p.startswith("oracle_re-run_") or p == "best-static"]
    statics = [p for p in statics if all(s in times[p] for s in seeds)]
    mean = lambda p: statistics.fmean(times[p][s] for s in seeds)  # noqa: E731
    best = min(statics, key=mean)
    print(f"{os.path.basename(rec.rstrip('/'))}: seeds {seeds[0]}-{seeds[-1]}")
    for p in sorted(statics, key=mean)[:4]:
        print(f"  static run {p:38s} {mean(p):6.2f} s")
    print(f"  T_static = {best} {mean(best):.2f} s; oracle-adaptive "
          f"{statistics.fmean(adaptive.values()):.2f} s")
    out = {"static": [times[best][s] for s in seeds], "adaptive": [adaptive[s] for s in seeds]}
    for p in LEARNERS:
        if p in times:
            out[p] = [times[p][s] for s in seeds]
    return out


def report(label, d):
    ts, ta = d["static"], d["adaptive"]
    h = headroom(ts, ta)
    print(f"{label}: n = {len(ts)}, T_static {statistics.fmean(ts):.2f} s, oracle-adaptive "
          f"{statistics.fmean(ta):.2f} s")
    print(f"  h = {h} (z {h.z:.1f}); established by the 3x rule: {has_headroom(h)}; "
          f"seeds needed: {seeds_needed(h)}")
    for p in LEARNERS:
        if p not in d:
            continue
        tg = d[p]
        dt, pv = paired_difference(tg, ts)
        da, pa = paired_difference(tg, ta)
        print(f"  {p} {statistics.fmean(tg):.2f} s: C = {captured_fraction(ts, ta, tg)}; minus "
              f"T_static {dt} s a seed (paired t p = {pv:.3g}); / oracle-adaptive "
              f"{statistics.fmean(tg) / statistics.fmean(ta):.3f}, minus it {da} s a seed "
              f"(p = {pa:.3g})")


runs = [invocation(r) for r in sys.argv[1:]]
for r, d in zip(sys.argv[1:], runs, strict=True):
    report(os.path.basename(r.rstrip("/")), d)
pooled = {k: [x for d in runs for x in d.get(k, [])] for k in ("static", "adaptive")}
# rollout-table is not pooled: in the first invocation it learned from probe-free searches
# while it reads the probe (the bug fixed in e64e3bd), so that run is not the same player
for p in ("mpc",):
    if all(p in d for d in runs):
        pooled[p] = [x for d in runs for x in d[p]]
report(f"pooled over {len(runs)} invocations", pooled)
