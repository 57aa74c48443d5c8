"""Contextual oracle from per-link entries re-run in the same evaluation.

python contextual.py RECORD_DIR AGENT FAST_PREFIX SLOW_PREFIX
Each seed's link is read from its episode: a seed where FAST_PREFIX reached the target in
under the SLOW_PREFIX's time and its median decision ran under 0.5 s is the fast link.
Prints the contextual oracle's mean (FAST on fast seeds, SLOW on slow ones), the agent's,
the paired difference with its t interval, and the ratio.
"""
import csv, glob, math, os, statistics, sys
from scipy import stats

d, agent, fast, slow = sys.argv[1:5]

def episode(prefix, seed):
    rows = list(csv.DictReader(open(os.path.join(d, f"decisions-{prefix}-seed{seed}.csv"))))
    t = float(rows[-1]["train_time_s"]) if rows[-1]["terminated"] == "True" else None
    return t, statistics.median(float(r["decision_train_time_s"]) for r in rows)

seeds = sorted(int(f.rsplit("seed", 1)[1].split(".")[0]) for f in glob.glob(os.path.join(d, f"decisions-{agent}-seed*.csv")))
ctx, ag = [], []
for s in seeds:
    # powersgd's median decision tells the link: ~0.2 s on 10 Gbit/s, >= 0.25 s on 10 Mbit/s
    t_slow, med_slow = episode(slow, s)
    t_fast, med_fast = episode(fast, s)
    link = "10gbit" if med_fast < 0.5 else "10mbit"
    c = t_fast if link == "10gbit" else t_slow
    a, _ = episode(agent, s)
    ctx.append(c); ag.append(a)
    print(f"seed {s}: {link}, contextual {c:.2f} s, {agent} {a:.2f} s")
diff = [a - c for a, c in zip(ag, ctx)]
n = len(diff); m = statistics.fmean(diff); sd = statistics.stdev(diff)
half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
print(f"n={n}: {agent} {statistics.fmean(ag):.2f} s, contextual {statistics.fmean(ctx):.2f} s, ratio {statistics.fmean(ag)/statistics.fmean(ctx):.3f}; diff {m:+.2f} s [{m-half:+.2f}, {m+half:+.2f}], p = {stats.ttest_rel(ag, ctx).pvalue:.3g}")
