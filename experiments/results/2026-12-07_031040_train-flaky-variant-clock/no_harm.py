"""Do-no-harm check, pooled over invocations, misses counted (issue 39).

python no_harm.py DIR1 DIR2 ... (record folders of the same command on other seeds)
Per seed: the learned policy's (`ppo_learned`) and the static entry's (`static_topk_0.01_25MB_H1`)
time to target, and `mpc`'s. A seed that missed the target counts with the training time
at which its episode ended (past the budget), not dropped: dropping it would hide exactly
the harm this check is for. Prints per-invocation and pooled means, the paired t test and
the ratio; then the same with misses dropped (pooled.py's convention).
"""
import csv, glob, math, os, statistics, sys
from scipy import stats

def times(d, prefix):
    out = {}
    for f in sorted(glob.glob(os.path.join(d, f"decisions-{prefix}-seed*.csv"))):
        rows = list(csv.DictReader(open(f)))
        seed = int(f.rsplit("seed", 1)[1].split(".")[0])
        out[seed] = (float(rows[-1]["train_time_s"]), rows[-1]["terminated"] == "True")
    return out

def report(label, xs, ys):
    diff = [a - b for a, b in zip(xs, ys)]
    n = len(diff); m = statistics.fmean(diff)
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(diff) / math.sqrt(n)
    print(f"{label}: n={n}: learned {statistics.fmean(xs):.2f} s, static {statistics.fmean(ys):.2f} s; "
          f"diff {m:+.2f} s [{m - half:+.2f}, {m + half:+.2f}] (t, 95 %), "
          f"p = {stats.ttest_rel(xs, ys).pvalue:.3g}; ratio {statistics.fmean(xs) / statistics.fmean(ys):.3f}")

allx, ally, keptx, kepty = [], [], [], []
for d in sys.argv[1:]:
    a, b, c = times(d, "ppo_learned"), times(d, "static_topk_0.01_25MB_H1"), times(d, "mpc")
    seeds = sorted(set(a) & set(b))
    name = os.path.basename(os.path.normpath(d))
    for s in seeds:
        print(f"{name} seed {s}: ppo {a[s][0]:.2f} s{'' if a[s][1] else ' (missed)'}, "
              f"static {b[s][0]:.2f} s{'' if b[s][1] else ' (missed)'}, "
              f"mpc {c[s][0]:.2f} s{'' if c[s][1] else ' (missed)'}" if s in c else "")
    x = [a[s][0] for s in seeds]; y = [b[s][0] for s in seeds]
    report(f"{name}, misses counted", x, y)
    mx = [c[s][0] for s in seeds if s in c]
    if len(mx) == len(y):
        report(f"{name}, mpc against static", mx, y)
    allx += x; ally += y
    keep = [s for s in seeds if a[s][1] and b[s][1]]
    keptx += [a[s][0] for s in keep]; kepty += [b[s][0] for s in keep]
report("pooled, misses counted", allx, ally)
report("pooled, misses dropped (pooled.py's convention)", keptx, kepty)
