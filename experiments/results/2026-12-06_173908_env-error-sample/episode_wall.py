"""One flaky-link episode per seed playing topk:0.01/25MB/H1 throughout: the env's wall time
against the ranks' training time (what compression_error's reference all-reduce adds).

python episode_wall.py SEEDS...   (root: the flaky-link links are shaped with tc)
"""
import sys
import time

from commgym.collectives import CommConfig
from commgym.env import AllReduceEnv
from commgym.experiments.config import load_run_config

cfg = load_run_config("flaky-link").env_config
env = AllReduceEnv(cfg)
action = env.menu.encode(CommConfig("topk:0.01", bucket_mb=25.0, sync_period=1))
try:
    for seed in [int(s) for s in sys.argv[1:]]:
        env.reset(seed=seed)
        t0, train, instr, n, done = time.perf_counter(), 0.0, 0.0, 0, False
        while not done:
            _, _, term, trunc, info = env.step(action)
            train = info["train_time_s"]  # the episode's training clock so far
            n += 1
            done = term or trunc
        wall = time.perf_counter() - t0
        print(f"seed {seed}: {n} decisions, env wall {wall:.2f} s, ranks' training {train:.2f} s, "
              f"wall/train {wall / train:.2f}", flush=True)
finally:
    env.close()
