"""The clock policy's invocations against flaky-link's oracles measured on the same seeds.

python against_oracles.py NEW_RECORD ORACLE_RECORD [NEW_RECORD ORACLE_RECORD ...]

NEW_RECORD: a `commgym train --config flaky-link-clock` invocation (the policy
`ppo_learned`, `static:topk:0.01/25MB/H1`, `mpc`); ORACLE_RECORD: the earlier invocation on
the same seeds with both oracles (records 2026-12-06_011835 / 035427). Per seed, pooled over
the pairs given:
- paired against the static entry re-run in the same invocation (`topk:0.01/H1`, oracle-static's
  re-run entry in both oracle invocations): the comparison this invocation settles;
- C = (T_static - T) / (T_static - T_adaptive) with T_static the static entry of the same
  invocation and T_adaptive oracle-adaptive's re-run from the oracle invocation (another
  invocation: labelled as such, drift between them lands on C);
- the oracle invocation's own figures for reference (T_static its best re-run).
Which entry each player chose on each link is in the record's output.txt (the table's
per-condition modal action). A miss counts as the budget. commgym's own estimators (commgym.experiments.headroom).
"""

import os
import statistics
import sys
from collections import defaultdict

from commgym.experiments.headroom import captured_fraction, decision_times, paired_difference

BUDGET = 30.0


def read(rec):
    return decision_times(rec, BUDGET)


pool = defaultdict(list)
for new, old in zip(sys.argv[1::2], sys.argv[2::2]):
    t = read(new)
    o = read(old)
    seeds = sorted(t["ppo_learned"])
    reruns = {p: v for p, v in o.items() if p.startswith("oracle_re-run")}
    best = min(reruns, key=lambda p: statistics.fmean(reruns[p][s] for s in seeds))
    print(f"{os.path.basename(os.path.normpath(new))} (seeds {seeds[0]}-{seeds[-1]}) with "
          f"{os.path.basename(os.path.normpath(old))}")
    for name, v in (("policy (ppo_learned)", t["ppo_learned"]), ("mpc", t["mpc"]),
                    ("topk:0.01/H1 here", t["static_topk_0.01_25MB_H1"]),
                    (f"T_static there ({best})", reruns[best]),
                    ("oracle-adaptive there", o["oracle-adaptive"])):
        print(f"  {name:34s} {statistics.fmean(v[s] for s in seeds):6.2f} s  "
              + " ".join(f"{v[s]:.2f}" for s in seeds))
    pool["policy"] += [t["ppo_learned"][s] for s in seeds]
    pool["mpc"] += [t["mpc"][s] for s in seeds]
    pool["static_here"] += [t["static_topk_0.01_25MB_H1"][s] for s in seeds]
    pool["static_there"] += [reruns[best][s] for s in seeds]
    pool["adaptive_there"] += [o["oracle-adaptive"][s] for s in seeds]
n = len(pool["policy"])
print(f"pooled over {n} seeds:")
for name in ("policy", "mpc"):
    d, p = paired_difference(pool[name], pool["static_here"])
    print(f"  {name} {statistics.fmean(pool[name]):.2f} s against topk:0.01/H1 re-run in the same "
          f"invocation {statistics.fmean(pool['static_here']):.2f} s: {d} s a seed (paired t "
          f"p = {p:.3g})")
    c = captured_fraction(pool["static_here"], pool["adaptive_there"], pool[name])
    print(f"    C against T_static here and oracle-adaptive of the oracle invocation: {c}")
    c2 = captured_fraction(pool["static_there"], pool["adaptive_there"], pool[name])
    print(f"    C against both oracles of the oracle invocation: {c2}")
