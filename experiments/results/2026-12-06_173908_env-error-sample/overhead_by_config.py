"""Where a recorded flaky-link evaluation's wall time went: per menu entry, the env's wall
time beyond the ranks' training time and the probe (record 2026-12-06_151953, 32 episodes).

python overhead_by_config.py experiments/results/2026-12-06_151953_train-flaky-link-clock-regret
"""
import glob
import sys

import pandas as pd

df = pd.concat(pd.read_csv(f) for f in glob.glob(f"{sys.argv[1]}/decisions-*.csv"))
df["overhead_s"] = df.env_step_s - df.decision_train_time_s - df.probe_s.fillna(0)
print(df.groupby("config").overhead_s.agg(["size", "median", "max", "sum"]).sort_values("sum"))
print(f"env wall {df.env_step_s.sum():.1f} s, ranks' training {df.decision_train_time_s.sum():.1f} s,"
      f" overhead {df.overhead_s.sum():.1f} s")
lossy = df[df.compression_error.notna() & (df.sync_period == 1) & (df.compression != "none")]
print(f"of it on lossy period-1 decisions (those measuring compression_error): "
      f"{lossy.overhead_s.sum():.1f} s over {len(lossy)} decisions")
