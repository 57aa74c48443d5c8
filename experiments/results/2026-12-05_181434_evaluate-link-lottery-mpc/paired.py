"""Paired per-seed comparison from a record's decision CSVs.

python paired.py RECORD_DIR AGENT_PREFIX BASELINE_PREFIX
Prints each seed's time to target (the last decision's train_time_s where the episode
reached the target), the mean paired difference with its t interval and p-value, and the
agent's entries (counts).
"""
import collections, csv, glob, math, os, sys
from scipy import stats

def times(d, prefix):
    out = {}
    for f in sorted(glob.glob(os.path.join(d, f"decisions-{prefix}-seed*.csv"))):
        rows = list(csv.DictReader(open(f)))
        seed = int(f.rsplit("seed", 1)[1].split(".")[0])
        last = rows[-1]
        out[seed] = float(last["train_time_s"]) if last["terminated"] == "True" else None
    return out

d, a, b = sys.argv[1:4]
ta, tb = times(d, a), times(d, b)
pairs = [(s, ta[s], tb[s]) for s in sorted(ta) if ta[s] is not None and tb.get(s) is not None]
for s, x, y in pairs:
    print(f"seed {s}: {a} {x:.2f} s, {b} {y:.2f} s, diff {x - y:+.2f}")
diff = [x - y for _, x, y in pairs]
n = len(diff); m = sum(diff) / n
sd = math.sqrt(sum((v - m) ** 2 for v in diff) / (n - 1))
half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
p = stats.ttest_rel([x for _, x, _ in pairs], [y for _, _, y in pairs]).pvalue
mb = sum(y for *_, y in pairs) / n
print(f"n={n}: {a} {sum(x for _, x, _ in pairs)/n:.2f} s, {b} {mb:.2f} s; diff {m:+.2f} s [{m-half:+.2f}, {m+half:+.2f}] (t, 95 %), p = {p:.3g}; ratio {1 + m/mb:.3f}")
cnt = collections.Counter()
for f in glob.glob(os.path.join(d, f"decisions-{a}-seed*.csv")):
    for r in csv.DictReader(open(f)):
        cnt[r["config"]] += 1
print("entries:", dict(cnt.most_common()))
