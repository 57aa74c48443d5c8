"""mpc against the best static entry's re-run, pooled over this record's 8 seeds and record
2026-12-06_195018_leaderboard-late-sync-1g's 4 (both 1 Gbit/s, the same calibration, menu and
mpc; the oracles' grids differ, 2 s there and 1 s here, so h is reported per invocation and
not pooled). Run from the repository root: python <this folder>/pooled_mpc.py
(``commgym pool`` refuses runs whose scenario names differ.)"""

import glob
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

HERE = Path(__file__).resolve().parent
runs = [HERE.parent / "2026-12-06_195018_leaderboard-late-sync-1g", HERE]
diffs, rows = [], []
for run in runs:
    df = pd.read_csv(glob.glob(str(run / "leaderboard-*.csv"))[0])
    t = df.pivot_table(index="seed", columns="agent", values="time_to_target_s")
    # T_static: oracle-static's row is its kept re-run (the leaderboard's headroom method)
    d = (t["mpc"] - t["oracle-static"]).dropna()
    diffs.extend(d.tolist())
    ad = t["oracle-adaptive"]
    rows.append((run.name, len(d), t["mpc"].mean(), t["oracle-static"].mean(), ad.mean()))
for name, n, m, s, a in rows:
    print(f"{name}: {n} seeds, mpc {m:.2f} s, T_static {s:.2f} s, oracle-adaptive {a:.2f} s, "
          f"C {(s - m) / (s - a):.2f}")
d = np.array(diffs)
res = stats.ttest_1samp(d, 0.0)
half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
print(f"pooled over {len(d)} seeds: mpc - T_static {d.mean():+.2f} s a seed "
      f"[{d.mean() - half:+.2f}, {d.mean() + half:+.2f}], paired t p = {res.pvalue:.3f}; "
      f"faster on {int((d < 0).sum())} of {len(d)}")
