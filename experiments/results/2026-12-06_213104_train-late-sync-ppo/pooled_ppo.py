"""PPO and mpc against the best static entry (none/25MB/H4), paired per seed, pooled over the
two late-sync-ppo invocations (records 2026-12-06_212723 on seeds 1000-1003 and this one on
1004-1011; the same scenario file, calibration and code). Time to target per seed: the last
decision's training time where the held-out loss reached the target (all did), else the
budget. Run from the repository root: python <this folder>/pooled_ppo.py"""

import csv
import glob
from pathlib import Path

import numpy as np
from scipy import stats

HERE = Path(__file__).resolve().parent
RUNS = [HERE.parent / "2026-12-06_212723_train-late-sync-ppo", HERE]
TARGET, BUDGET = 0.2, 30.0
STATIC = "static_none_25MB_H4"


def times(run: Path) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for f in sorted(glob.glob(str(run / "decisions-*.csv"))):
        rows = list(csv.DictReader(open(f)))
        name, seed = Path(f).stem.removeprefix("decisions-").rsplit("-seed", 1)
        last = rows[-1]
        reached = float(last["eval_loss"]) <= TARGET
        out.setdefault(name, {})[int(seed)] = float(last["train_time_s"]) if reached else BUDGET
    return out


pooled: dict[str, list[float]] = {"ppo_learned": [], "mpc": []}
for run in RUNS:
    t = times(run)
    line = [f"{run.name}: {len(t[STATIC])} seeds, static {np.mean(list(t[STATIC].values())):.2f} s"]
    for agent in pooled:
        d = [t[agent][s] - t[STATIC][s] for s in sorted(t[STATIC])]
        pooled[agent].extend(d)
        line.append(f"{agent} {np.mean(list(t[agent].values())):.2f} s ({np.mean(d):+.2f} a seed)")
    print("; ".join(line))
for agent, d in pooled.items():
    a = np.array(d)
    half = stats.t.ppf(0.975, len(a) - 1) * a.std(ddof=1) / np.sqrt(len(a))
    p = stats.ttest_1samp(a, 0.0).pvalue
    print(f"pooled over {len(a)} seeds: {agent} - static {a.mean():+.2f} s a seed "
          f"[{a.mean() - half:+.2f}, {a.mean() + half:+.2f}], paired t p = {p:.3f}; "
          f"faster on {int((a < 0).sum())} of {len(a)}")
