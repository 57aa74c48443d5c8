"""link-lottery: the policy against the contextual oracle and the best static entry, per seed.

``python contextual.py DIR [DIR ...]``: each DIR holds one invocation's decision CSVs
(``decisions-<agent>-seed<N>.csv``, as ``commgym train``/``evaluate`` write them). The link each
seed drew is the env's own draw from its reset seed. Per invocation and pooled over them:

- T_static: the static entry with the least mean over all seeds (oracle-static's rule, among
  the re-run entries: the conservative T_static of the headroom method);
- the contextual oracle: per link, the re-run entry with the least mean over that link's
  seeds (the best entry per drawn condition), each seed timed by that entry's re-run;
- h, C (jackknife t-intervals), the policy's mean over the contextual oracle's, and paired
  t-tests of the policy against both. Misses count at the 30 s budget.
"""
import glob
import re
import sys
from collections import defaultdict

import numpy as np
import pandas as pd

from commgym.env.sim import episode_conditions, episode_seed_of
from commgym.experiments.config import load_run_config
from commgym.experiments.headroom import captured_fraction, headroom, paired_difference

cfg = load_run_config("link-lottery").env_config
BUDGET = cfg.time_budget_s


def link(seed: int) -> str:
    sched, _, _ = episode_conditions(cfg, episode_seed_of(seed))
    return str(sched.spec_at(0.0))


def read(folder: str, inv: int) -> dict[str, dict[tuple[int, int], float]]:
    """Per agent, per (invocation, seed): time to target (the budget where missed)."""
    times: dict[str, dict[tuple[int, int], float]] = defaultdict(dict)
    for f in glob.glob(f"{folder}/decisions-*-seed*.csv"):
        agent, seed = re.match(r".*/decisions-(.+)-seed(\d+)\.csv", f).groups()
        # train names the learned agent ppo_learned, evaluate policy_<file>: one name
        agent = agent if agent.startswith("static_") else "policy"
        d = pd.read_csv(f)
        reached = d.reason.iloc[-1] == "target_reached"
        times[agent][(inv, int(seed))] = float(d.train_time_s.iloc[-1]) if reached else BUDGET
    return times


def report(tag: str, times: dict[str, dict[tuple[int, int], float]]) -> None:
    learned = next(a for a in times if not a.startswith("static_"))
    statics = sorted(a for a in times if a.startswith("static_"))
    keys = sorted(set.intersection(*(set(by) for by in times.values())))
    col = lambda a: np.array([times[a][k] for k in keys])  # noqa: E731
    links = [link(s) for _, s in keys]
    names = sorted(set(links))
    at = {ln: [i for i, x in enumerate(links) if x == ln] for ln in names}
    best_static = min(statics, key=lambda a: col(a).mean())
    ctx = np.zeros(len(keys))
    per_link = {}
    for ln in names:
        per_link[ln] = min(statics, key=lambda a: col(a)[at[ln]].mean())
        ctx[at[ln]] = col(per_link[ln])[at[ln]]
    ts, tp = col(best_static), col(learned)
    h, c = headroom(ts, ctx), captured_fraction(ts, ctx, tp)
    d_ctx, p_ctx = paired_difference(tp, ctx)
    d_st, p_st = paired_difference(tp, ts)
    print(f"== {tag}: {len(keys)} seed runs ({', '.join(f'{len(at[x])} on {x}' for x in names)})")
    for a in [learned, *statics]:
        by = "  ".join(f"{ln} {col(a)[at[ln]].mean():6.2f} s" for ln in names)
        print(f"  {a:32s} {col(a).mean():6.2f} s   {by}")
    print(
        f"  contextual oracle {ctx.mean():.2f} s ({', '.join(f'{k}: {v}' for k, v in per_link.items())}); "
        f"T_static {ts.mean():.2f} s ({best_static})"
    )
    print(f"  h = {h.value:.3f} [{h.low:.3f}, {h.high:.3f}]; C = {c.value:.2f} [{c.low:.2f}, {c.high:.2f}]")
    print(
        f"  policy / contextual oracle = {tp.mean() / ctx.mean():.3f}; policy - contextual "
        f"{d_ctx.value:+.2f} s [{d_ctx.low:+.2f}, {d_ctx.high:+.2f}] p = {p_ctx:.3g}; policy - "
        f"T_static {d_st.value:+.2f} s [{d_st.low:+.2f}, {d_st.high:+.2f}] p = {p_st:.3g}"
    )


runs = [read(f, i) for i, f in enumerate(sys.argv[1:])]
for f, t in zip(sys.argv[1:], runs):
    report(f, t)
if len(runs) > 1:
    pooled: dict[str, dict[tuple[int, int], float]] = defaultdict(dict)
    for t in runs:
        for a, by in t.items():
            pooled[a].update(by)
    report("pooled", pooled)
