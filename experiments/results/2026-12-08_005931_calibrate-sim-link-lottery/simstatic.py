import sys, numpy as np, warnings
warnings.filterwarnings("ignore")
from commgym.experiments.config import load_run_config
from commgym.env.sim import SimEnv
from commgym.agents import StaticAgent, rollout
rc = load_run_config("/tmp/llb9/link-lottery-probe-board.yaml")
cfg = rc.env_config
env = SimEnv(sys.argv[1], cfg)
res = {}
for e in env.model.entries:
    for seed in range(1008, 1016):
        ep = rollout(env, StaticAgent(env, preset=e), seed, target_loss=cfg.target_loss)
        net = ep.steps[0].network
        t = ep.time_to_target_s if ep.time_to_target_s is not None else cfg.time_budget_s
        res.setdefault((net, e), []).append(t)
for net in ("10mbit", "10gbit"):
    rows = sorted((np.mean(v), e) for (n, e), v in res.items() if n == net)
    print(net, "  ".join(f"{e} {t:.2f}" for t, e in rows))
