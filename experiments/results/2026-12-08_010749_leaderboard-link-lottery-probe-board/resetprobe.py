"""Reset-probe readings on link-lottery's links: info["probe_s"] of each reset (seeds 1008-1015 twice)."""
import sys, time, warnings
warnings.filterwarnings("ignore")
from commgym.experiments.config import load_run_config
from commgym.env import AllReduceEnv
rc = load_run_config("/tmp/llb9/link-lottery-probe-board.yaml")
env = AllReduceEnv(rc.env_config)
try:
    for rnd in range(2):
        for seed in range(1008, 1016):
            obs, info = env.reset(seed=seed)
            print(rnd, seed, info["network"], "probe_s %.4f" % info["probe_s"], "charge %.4f" % info["train_time_s"], flush=True)
            env.step(env.menu.default_action() if "10gbit" in info["network"] else env.menu.encode(__import__("commgym.agents.baselines", fromlist=["x"]).resolve_preset(env.menu, "powersgd:2/25MB/H2")))
finally:
    env.close()
