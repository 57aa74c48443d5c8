"""How far the real 10 Gbit/s order reproduces itself: Kendall tau between real references.

Run from the repository root: ``python <this folder>/ranking_noise.py``. Reads this folder's
``real.json`` (6 seeds on 10 Gbit/s, measured beside the calibration of record
2026-12-06_233025), the reference of record 2026-12-05_033719_bench-sim (seeds 1001, 1003)
and its re-run of record 2026-12-06_204907_real-reference-10gbit, and prints the mean time to
target per entry for each, and tau between them: (a) today's seeds 1001/1003 against the
same seeds on the two earlier days, (b) today's six seeds split into two halves of three
(every split), the noise ceiling of a ranking gate on a reference of three seeds.
"""

import itertools
import json
from pathlib import Path

from scipy.stats import kendalltau

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent


def means(cells: dict, seeds: list[int]) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for key, cell in cells.items():
        link, seed, entry = key.split("|")
        if link == "10gbit" and int(seed) in seeds:
            out.setdefault(entry, []).append(cell["time"])
    return {e: sum(v) / len(v) for e, v in out.items() if len(v) == len(seeds)}


def tau(a: dict[str, float], b: dict[str, float]) -> float:
    keys = sorted(set(a) & set(b))
    return kendalltau([a[k] for k in keys], [b[k] for k in keys]).statistic


today = json.loads((HERE / "real.json").read_text())["cells"]
then = json.loads((RESULTS / "2026-12-05_033719_bench-sim" / "real.json").read_text())["cells"]
rerun = json.loads(
    (RESULTS / "2026-12-06_204907_real-reference-10gbit" / "real_10gbit_now.json").read_text()
)
rerun = {**then, **rerun}  # the re-run replaced the 10 Gbit/s cells of seeds 1001, 1003

pair = [1001, 1003]
t_pair, t_then, t_rerun = means(today, pair), means(then, pair), means(rerun, pair)
six = [1001, 1003, 1004, 1005, 1006, 1007]
t_six = means(today, six)
print("entry                 today(6)  today(1001,1003)  2026-12-05  2026-12-06 20:49")
for e in sorted(t_six, key=t_six.get):
    print(f"{e:20s} {t_six[e]:8.2f} {t_pair[e]:17.2f} {t_then[e]:11.2f} {t_rerun[e]:16.2f}")
print(f"\nseeds 1001/1003: tau(today, 2026-12-05) = {tau(t_pair, t_then):.2f}, "
      f"tau(today, 2026-12-06 20:49) = {tau(t_pair, t_rerun):.2f}, "
      f"tau(2026-12-05, 2026-12-06 20:49) = {tau(t_then, t_rerun):.2f}")
taus = []
for half in itertools.combinations(six, 3):
    other = [s for s in six if s not in half]
    if half < tuple(other):
        taus.append(tau(means(today, list(half)), means(today, other)))
taus.sort()
print(f"today's six seeds in two halves of three (all {len(taus)} splits): tau "
      f"{', '.join(f'{t:.2f}' for t in taus)}; median {taus[len(taus) // 2]:.2f}")
