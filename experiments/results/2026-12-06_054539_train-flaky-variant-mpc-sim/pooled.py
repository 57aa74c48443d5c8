"""Paired comparison pooled over invocations (the same seeds run in each).

python pooled.py DIR1 AGENT1 BASE1 DIR2 AGENT2 BASE2 [...]
Each triple: a record folder, the agent's and the baseline's decision-CSV prefixes. Prints
each invocation's paired mean difference and the pooled one (every seed run a pair) with its
t interval, p-value and ratio.
"""
import csv, glob, math, os, statistics, sys
from scipy import stats

def times(d, prefix):
    out = {}
    for f in sorted(glob.glob(os.path.join(d, f"decisions-{prefix}-seed*.csv"))):
        rows = list(csv.DictReader(open(f)))
        seed = int(f.rsplit("seed", 1)[1].split(".")[0])
        out[seed] = float(rows[-1]["train_time_s"]) if rows[-1]["terminated"] == "True" else None
    return out

args = sys.argv[1:]
xs, ys = [], []
for i in range(0, len(args), 3):
    d, a, b = args[i:i + 3]
    ta, tb = times(d, a), times(d, b)
    pairs = [(ta[s], tb[s]) for s in sorted(ta) if ta[s] is not None and tb.get(s) is not None]
    x, y = [p[0] for p in pairs], [p[1] for p in pairs]
    print(f"{os.path.basename(os.path.normpath(d))}: {a} {statistics.fmean(x):.2f} s, {b} {statistics.fmean(y):.2f} s, diff {statistics.fmean(x) - statistics.fmean(y):+.2f} s, p = {stats.ttest_rel(x, y).pvalue:.3g} (n={len(x)})")
    xs += x; ys += y
diff = [a - b for a, b in zip(xs, ys)]
n = len(diff); m = statistics.fmean(diff); half = stats.t.ppf(0.975, n - 1) * statistics.stdev(diff) / math.sqrt(n)
print(f"pooled n={n}: agent {statistics.fmean(xs):.2f} s, baseline {statistics.fmean(ys):.2f} s; diff {m:+.2f} s [{m - half:+.2f}, {m + half:+.2f}] (t, 95 %), p = {stats.ttest_rel(xs, ys).pvalue:.3g}; ratio {statistics.fmean(xs) / statistics.fmean(ys):.3f}")
