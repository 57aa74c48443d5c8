"""Pooled paired comparison with the contextual oracle over both link-lottery invocations.

python pooled_contextual.py  (from this folder)
Reads the per-seed lines `contextual.py` prints for each invocation's folder.
"""
import math, statistics, subprocess, sys
from scipy import stats

CTX = "../2026-12-05_181434_evaluate-link-lottery-mpc/contextual.py"
runs = [("../2026-12-05_182410_train-link-lottery-mpc-sim", "mpc_learned", "static_powersgd_2_25MB_H2"),
        (".", "policy_policy.zip", "static_powersgd_2_25MB_H2")]
agent, ctx = [], []
for d, a, slow in runs:
    out = subprocess.run([sys.executable, CTX, d, a, "static_none_25MB_H1", slow], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("seed"):
            c = float(line.split("contextual ")[1].split(" s")[0])
            x = float(line.rsplit(" ", 2)[1])
            ctx.append(c); agent.append(x)
diff = [a - c for a, c in zip(agent, ctx)]
n = len(diff); m = statistics.fmean(diff); half = stats.t.ppf(0.975, n - 1) * statistics.stdev(diff) / math.sqrt(n)
print(f"pooled n={n}: mpc {statistics.fmean(agent):.2f} s, contextual {statistics.fmean(ctx):.2f} s, ratio {statistics.fmean(agent) / statistics.fmean(ctx):.3f}; diff {m:+.2f} s [{m - half:+.2f}, {m + half:+.2f}], p = {stats.ttest_rel(agent, ctx).pvalue:.3g}")
