"""Does the best entry depend on the remaining loss? The simulator's answer on mid-mlp.

Run from the repository root: ``python <this folder>/state_headroom.py``. It reads this
folder's calibration (``cal.json``, menu none/25MB/H1,H2,H4,H8, K = 8: what local SGD's
period does as the loss falls) and flaky-link's refitted calibration (record
2026-12-06_053744_calibrate-sim: none, fp16, top-k 1 %, PowerSGD-2 at H1/H2, K = 4) and, on
one link held for the whole episode at each rate, prints

* every entry's decisions from the reset down to each held-out loss level (the measured
  curves, two calibration seeds averaged);
* the cost of each loss segment per entry on the link (decisions x decision time) and the
  cheapest entry per segment;
* the best static entry's and the simulator's oracle-adaptive time to target (the dynamic
  programme, ``best_schedule``, with a switch allowed every 2, 1 or 0.5 s of training,
  ``every_s``; without one it is static by construction) on seeds 1000-1003, and h.

A link that never changes leaves a schedule only the training state to adapt to: h > 0 here
is headroom a link-indexed table cannot take.
"""

from pathlib import Path

import yaml

from commgym.env import EnvConfig
from commgym.env.sim.calibration import Calibration
from commgym.env.sim.model import SimModel
from commgym.env.sim.planner import best_schedule, headroom, static_ranking

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent
LEVELS = [2.3, 1.5, 1.0, 0.7, 0.5, 0.4, 0.3, 0.25, 0.2]
SEEDS = [1000, 1001, 1002, 1003]


def sweep(cal_path: Path, env: dict, rates: list[str]) -> None:
    cal = Calibration.load(cal_path)
    cfg = EnvConfig(**env)
    model = SimModel(cal, cfg.menu, cfg.steps_per_decision)
    pm = model.progress
    print(f"\n== {cal_path.parent.name}: menu {model.entries}, K = {cfg.steps_per_decision}")
    print("decisions from the reset to each held-out loss:", LEVELS[1:])
    for e in model.entries:
        print(f"  {e:20s}", [round(pm.position(e, lv), 1) for lv in LEVELS[1:]])
    for rate in rates:
        d = dict(env, network={"schedule": [[0, rate]]})
        c = EnvConfig(**d)
        rate_bit_s = c.network_plan.schedule.spec_at(0.0).rate_bit_s
        tim = model.timings(rate_bit_s)
        print(f"\n{rate}: decision s", [round(t.train_s, 3) for t in tim])
        for a, b in zip(LEVELS, LEVELS[1:]):
            costs = [
                (pm.position(e, b) - pm.position(e, a)) * tim[i].train_s
                for i, e in enumerate(model.entries)
            ]
            k = min(range(len(costs)), key=costs.__getitem__)
            print(f"  loss {a} -> {b}: s per entry {[round(x, 2) for x in costs]}, "
                  f"cheapest {model.entries[k]}")
        rk = static_ranking(model, c, SEEDS, 0)
        print(f"  static: {', '.join(f'{r.config} {r.mean_s:.2f} s' for r in rk)}")
        for every_s in (None, 2.0, 1.0, 0.5):
            runs = [best_schedule(model, c, s, 0, every_s=every_s) for s in SEEDS]
            t_ad, h = headroom(rk[0].mean_s, [r[0] for r in runs], c.time_budget_s)
            sched, last = [], None
            for t, k in runs[0][1]:
                if k != last:
                    sched.append((round(t, 2), model.entries[k]))
                last = k
            print(f"  oracle-adaptive, a switch possible every {every_s} s: {t_ad:.2f} s, "
                  f"h {h:.3f}; seed {SEEDS[0]}'s schedule {sched}")


late = yaml.safe_load((HERE / "late-sync.yaml").read_text())["env"]
sweep(HERE / "cal.json", late,
      ["100mbit", "200mbit", "500mbit", "1gbit", "2gbit", "5gbit", "10gbit"])  # fmt: skip
flaky = yaml.safe_load(Path("experiments/configs/flaky-link.yaml").read_text())["env"]
sweep(RESULTS / "2026-12-06_053744_calibrate-sim" / "cal.json", flaky,
      ["10mbit", "50mbit", "100mbit", "1gbit", "10gbit"])  # fmt: skip
