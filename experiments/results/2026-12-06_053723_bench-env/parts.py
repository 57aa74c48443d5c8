"""Where `commgym bench env`'s overhead goes, from the per-decision parts of its results.json.

python parts.py RESULTS.json [RESULTS.json ...]

Per run: the median and the mean of each part over the measured decisions (the medians need
not add up; the means do, to the mean overhead), and the commgym statistics part by entry
family (period 1 lossless, period 1 lossy, period > 1).
"""

import json
import statistics
import sys

PARTS = ("env_side_s", "messaging_s", "eval_s", "instrumentation_s", "handler_rest_s", "skew_s")
for path in sys.argv[1:]:
    r = json.load(open(path))
    rows = r["per_decision"][r["meta"]["warmup"]:]
    over = [x["env_step_s"] - x["train_time_s"] for x in rows]
    train = statistics.fmean(x["train_time_s"] for x in rows)
    print(f"{path}: {len(rows)} decisions, mean training time {train * 1e3:.2f} ms, mean "
          f"overhead {statistics.fmean(over) * 1e3:.2f} ms ({statistics.fmean(over) / train:+.1%} "
          f"of the mean), median {statistics.median(over) * 1e3:.2f} ms")
    for k in PARTS:
        v = [x["parts"][k] * 1e3 for x in rows]
        print(f"  {k:18s} median {statistics.median(v):6.3f} ms  mean {statistics.fmean(v):6.3f} ms")
    groups = {"H1 none": [], "H1 lossy": [], "H>1": []}
    for x in rows:
        c = x["config"]
        g = "H>1" if not c.endswith("/H1") else ("H1 none" if c.startswith("none") else "H1 lossy")
        groups[g].append(x["parts"]["instrumentation_s"] * 1e3)
    print("  statistics by entry: " + "; ".join(
        f"{g} {statistics.fmean(v):.2f} ms mean ({min(v):.2f}-{max(v):.2f}, n={len(v)})"
        for g, v in groups.items() if v))
