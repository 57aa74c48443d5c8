"""mpc in the simulator (docs/simulator.md, "The model-predictive agent").

python sim_figures.py CAL.json

For flaky-link and link-lottery, seeds 1000-1015, probe-free players: the best static
entry, the dynamic programme (knows the conditions), the reactive bound (the best player
that sees the previous decision's link), and mpc variants after `learn` (the evaluation's
tuning decisions: 40 on both scenarios), with the simulator's timing as
calibrated and on a machine 1.3x slower with 10 % noise per decision. Decision time:
median and max of `plan_s` over every decision of the evaluation (one core).
"""
import statistics
import sys
import warnings

import numpy as np

from commgym.agents import make_agent
from commgym.agents.rollout import rollout
from commgym.env.sim import SimEnv, adaptive_times, static_ranking
from commgym.experiments.config import load_run_config

warnings.simplefilter("ignore")
CAL = sys.argv[1]
SEEDS = list(range(1000, 1016))
VARIANTS = [
    ("mpc (default: timing, anticipate), learn 40", {}, 40),
    ("mpc (default), learn 300", {}, 300),
    ("mpc (default), learn 0", {}, 0),
    ("mpc, anticipate false, learn 40", {"anticipate": False}, 40),
    ("mpc, link_from probe, learn 40", {"link_from": "probe"}, 40),
]


class Static:
    reads_probe = False

    def __init__(self, env, entry):
        self.a = np.array(next(a for a in np.ndindex(*env.menu.nvec)
                               if str(env.menu.decode(np.array(a))) == entry))

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return self.a, state


def play(env, agent, budget, target):
    return statistics.fmean(
        rollout(env, agent, s, target_loss=target).time_to_target_s or budget for s in SEEDS
    )


for scenario in ("flaky-link", "link-lottery"):
    rc = load_run_config(scenario)
    cfg = rc.env_config
    base = SimEnv(CAL, cfg)
    best = static_ranking(base.model, cfg, SEEDS)[0].config
    dp = statistics.fmean(adaptive_times(base.model, cfg, SEEDS))
    lag = statistics.fmean(adaptive_times(base.model, cfg, SEEDS, reaction_lag=1))
    print(f"\n{scenario} (seeds {SEEDS[0]}-{SEEDS[-1]}), as calibrated: dynamic programme "
          f"{dp:.2f} s, reactive bound {lag:.2f} s")
    for scale, noise in ((1.0, 0.0), (1.3, 0.1)):
        env = SimEnv(CAL, cfg)
        env.compute_scale, env.timing_noise = scale, noise
        t_static = play(env, Static(env, best), cfg.time_budget_s, cfg.target_loss)
        print(f"  [time off the wire x{scale}, noise {noise}] best static {best}: {t_static:.2f} s")
        for label, kw, n in VARIANTS:
            agent = make_agent("mpc", env, calibration=CAL, seed=rc.seed, **kw).learn(n)
            plans = []
            predict = agent.predict

            def timed(*args, _predict=predict, _agent=agent, **kwargs):
                out = _predict(*args, **kwargs)
                plans.append(_agent.plan_s)  # this decision's plan, s
                return out

            agent.predict = timed
            ts = []
            for s in SEEDS:
                ep = rollout(env, agent, s, target_loss=cfg.target_loss)
                ts.append(ep.time_to_target_s or cfg.time_budget_s)
            mean = statistics.fmean(ts)
            print(f"    {label}: {mean:.2f} s ({(mean - t_static) / t_static:+.1%} against "
                  f"static; worst seed {max(ts):.2f} s), decision time "
                  f"{statistics.median(plans) * 1e3:.2f} ms median, {max(plans) * 1e3:.2f} ms max")
