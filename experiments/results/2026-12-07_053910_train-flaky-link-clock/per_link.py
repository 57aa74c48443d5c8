"""Per link, the entry each player played most in a record's evaluation.

python per_link.py CONFIG CAL RECORD [RECORD ...]

Each decision of each `decisions-<player>-seed<s>.csv` belongs to the link in force when it
started: the episode's schedule as the env resolves it for seed s (its per-seed shifts;
commgym/Sim-v1 on CONFIG resolves them exactly as the real env does, from the same
episode seed). Prints per player and link the modal entry, its share and the decisions.
"""

import csv
import glob
import os
import sys
import warnings
from collections import Counter, defaultdict

from commgym.env.sim import SimEnv
from commgym.experiments.config import load_run_config

warnings.simplefilter("ignore")
config, cal, *records = sys.argv[1:]
cfg = load_run_config(config, {"env_kind": "sim", "calibration": cal})
env = SimEnv(cal, cfg.env_config)
counts: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
for rec in records:
    for path in sorted(glob.glob(os.path.join(rec, "decisions-*-seed*.csv"))):
        name = os.path.basename(path)[len("decisions-"):].rsplit("-seed", 1)
        player, seed = name[0], int(name[1].split(".")[0])
        env.reset(seed=seed)
        schedule = env.unwrapped._schedule
        for r in csv.DictReader(open(path)):
            t0 = float(r["train_time_s"]) - float(r["decision_train_time_s"])
            counts[player][str(schedule.spec_at(t0))][r["config"]] += 1
for player, links in counts.items():
    cells = []
    for link, c in sorted(links.items()):
        entry, n = c.most_common(1)[0]
        cells.append(f"{link}: {entry} ({n / sum(c.values()):.0%} of {sum(c.values())})")
    print(f"{player:28s} " + "; ".join(cells))
