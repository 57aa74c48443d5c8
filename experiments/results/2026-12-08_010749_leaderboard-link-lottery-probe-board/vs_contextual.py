"""Each learner of a link-lottery leaderboard against the contextual oracle, per link too.

python vs_contextual.py RECORD_DIR [RECORD_DIR ...]

RECORD_DIR is one `commgym leaderboard` record of link-lottery with issue 38's method (its
headroom JSON and the decision CSVs under its scenario folder). On link-lottery the link is
drawn once per seed, so oracle-adaptive is the contextual oracle: per seed, the re-run of the
entry it kept for that seed's link (the rerun's `condition`). T_static is the leaderboard's
own: oracle-static's kept re-run. Every learner in the JSON's `learned` block is compared with
both (a miss counts as the budget): issue 39's "within 5 % of the contextual oracle" is the
ratio of mean times. Seeds of several records are joined (each with its own oracles).
Estimators: commgym.experiments.headroom.
"""

import glob
import json
import os
import statistics
import sys

from commgym.experiments.headroom import captured_fraction, decision_times, paired_difference

BUDGET = 30.0


def rerun_slug(entry):
    return "oracle_re-run_" + entry.replace(":", "_").replace("/", "_")


def load(rec):
    (path,) = glob.glob(os.path.join(rec, "headroom-*.json"))
    report = json.load(open(path))
    times = dict(decision_times(os.path.join(rec, report["scenario"]), BUDGET))
    link, adaptive, static = {}, {}, {}
    for r in report["reruns"]:
        if not r["chosen"]:
            continue
        for s in r["seeds"]:
            if r["oracle"] == "oracle-adaptive":
                adaptive[s] = times[rerun_slug(r["entry"])][s]
                link[s] = r["condition"]
            elif r["oracle"] == "oracle-static":
                static[s] = times[rerun_slug(r["entry"])][s]
    # a NAME@RECIPE row's decision files are named NAME_RECIPE
    learners = {p: times[p.replace("@", "_")] for p in report["learned"]}
    if "best-static" in times:
        learners["best-static"] = times["best-static"]
    return link, adaptive, static, learners


rows = [load(r) for r in sys.argv[1:]]
link = {s: v for r in rows for s, v in r[0].items()}
adaptive = {s: v for r in rows for s, v in r[1].items()}
static = {s: v for r in rows for s, v in r[2].items()}
learners = {}
for r in rows:
    for p, t in r[3].items():
        learners.setdefault(p, {}).update(t)
seeds = sorted(adaptive)
print(f"seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}); links: "
      + ", ".join(f"{c} {sum(link[s] == c for s in seeds)}" for c in sorted(set(link.values()))))
ta = [adaptive[s] for s in seeds]
ts = [static[s] for s in seeds]
print(f"contextual oracle (oracle-adaptive) {statistics.fmean(ta):.2f} s; "
      f"T_static (oracle-static's re-run) {statistics.fmean(ts):.2f} s")
for p, t in learners.items():
    tg = [t[s] for s in seeds]
    da, pa = paired_difference(tg, ta)
    dt, pt = paired_difference(tg, ts)
    print(f"{p}: {statistics.fmean(tg):.2f} s, {statistics.fmean(tg) / statistics.fmean(ta):.3f}x "
          f"the contextual oracle (minus it {da} s a seed, p = {pa:.3g}); minus T_static {dt} s "
          f"(p = {pt:.3g}); C = {captured_fraction(ts, ta, tg)}")
    for c in sorted(set(link.values())):
        on = [s for s in seeds if link[s] == c]
        print(f"   {c}: {statistics.fmean(t[s] for s in on):.2f} s against the oracle's "
              f"{statistics.fmean(adaptive[s] for s in on):.2f} s, T_static's "
              f"{statistics.fmean(static[s] for s in on):.2f} s; per seed "
              + " ".join(f"{s}:{t[s]:.2f}/{adaptive[s]:.2f}" for s in on))
