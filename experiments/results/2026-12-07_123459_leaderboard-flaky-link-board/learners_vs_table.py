"""The learners against each other on leaderboard invocations: C differences, paired.

Reads the leaderboard CSV and headroom JSON of each output folder given (commgym's own reader,
`commgym.experiments.pooling.read_invocation`, which also picks T_static's player), and for
every pair of learned agents prints (over every (invocation, seed) pair when several
folders are given: each invocation's own T_static, as `commgym pool` pools) C_A - C_B = (T_B - T_A) / (T_static - T_adaptive) with its
jackknife t-interval (`commgym.experiments.headroom.jackknife`) and the paired t-test of their
times (`paired_difference`).

python learners_vs_table.py FOLDER [FOLDER ...]
"""

import itertools
import sys

import numpy as np

from commgym.experiments.headroom import captured_fraction, jackknife, paired_difference
from commgym.experiments.pooling import read_invocation

invs = [read_invocation(f) for f in sys.argv[1:]]
s = np.concatenate([inv.times[inv.t_static] for inv in invs])
a = np.concatenate([inv.times["oracle-adaptive"] for inv in invs])
learned = [n for n, r in invs[0].roles.items() if r == "learned"] + ["best-static"]
times = {n: np.concatenate([inv.times[n] for inv in invs]) for n in learned}
for inv in invs:
    print(f"{inv.scenario}: seeds {inv.seeds[0]}-{inv.seeds[-1]}, T_static = {inv.t_static} "
          f"{np.mean(inv.times[inv.t_static]):.2f} s, oracle-adaptive "
          f"{np.mean(inv.times['oracle-adaptive']):.2f} s")
print(f"{len(s)} paired units")
for n in learned:
    t = times[n]
    c = captured_fraction(s, a, t)
    d, p = paired_difference(t, s)
    print(f"  {n:15s} {t.mean():6.2f} s  C = {c.value:+.2f} [{c.low:+.2f}, {c.high:+.2f}]  "
          f"- T_static {d.value:+.2f} [{d.low:+.2f}, {d.high:+.2f}] s (p = {p:.2g})")


def c_diff(s_, a_, x, y):
    gap = s_.mean() - a_.mean()
    return float((y.mean() - x.mean()) / gap) if gap > 0 else float("nan")


for x, y in itertools.combinations(learned, 2):
    tx, ty = times[x], times[y]
    e = jackknife(c_diff, s, a, tx, ty)
    d, p = paired_difference(tx, ty)
    print(f"  C({x}) - C({y}) = {e.value:+.2f} [{e.low:+.2f}, {e.high:+.2f}]; "
          f"time {d.value:+.2f} [{d.low:+.2f}, {d.high:+.2f}] s a seed (paired t p = {p:.2g})")
