"""The simulator's own headroom on flaky-link's seeds (probe-free oracles), per calibration.

python simh.py CAL.json [CAL.json ...]: seeds 1000-1007, 1008-1015 and both (the real
invocations' seeds).
"""
import statistics, sys, warnings
from commgym.env.sim import SimEnv, adaptive_times, static_ranking
from commgym.experiments.config import load_run_config
warnings.simplefilter("ignore")
rc = load_run_config("flaky-link"); cfg = rc.env_config
for cal, seeds in [(c, list(r)) for c in sys.argv[1:]
                   for r in (range(1000, 1008), range(1008, 1016), range(1000, 1016))]:
    env = SimEnv(cal, cfg)
    rank = static_ranking(env.model, cfg, seeds)
    ad = adaptive_times(env.model, cfg, seeds, rank)
    ts = rank[0].mean_s
    ta = statistics.fmean(t if t is not None else cfg.time_budget_s for t in ad)
    print(f"{cal} seeds {seeds[0]}-{seeds[-1]}: oracle-static {rank[0].config} {ts:.2f} s, "
          f"oracle-adaptive {ta:.2f} s, h = {(ts - ta) / ts:.3f}; ranking "
          + ", ".join(f"{r.config} {r.mean_s:.2f}" for r in rank[:4]))
