"""Launch time of an env's ranks: agents forked by commgym's launcher against agents under Popen.

Same process, same machine, interleaved rounds: each round launches a 2-rank mlp-digits env on
this machine and a 4-rank one on an emulated 1 Gbit/s network once with each path (order
alternating by round) and times reset() (the launch: agents, ranks, rendezvous, the first
reset) and close(). The Popen path is the fallback start_agent takes where the launcher cannot
start: the same command under subprocess.Popen(start_new_session=True).

Usage: python launch_times.py ROUNDS [--record DIR]
"""

import statistics
import subprocess
import sys
import time

import commgym.env.cluster as cluster_mod
from commgym.env import AllReduceEnv
from commgym.env.launcher import start_agent
from commgym.experiments.records import Recording


def popen_agent(cmd, env, log_path):
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc, "popen"


def launch(path, world_size, network):
    cluster_mod.start_agent = start_agent if path == "forked" else popen_agent
    env = AllReduceEnv(workload="mlp-digits", world_size=world_size, network=network)
    t0 = time.perf_counter()
    env.reset(seed=0)
    t1 = time.perf_counter()
    how = env.cluster.launched_by
    env.close()
    t2 = time.perf_counter()
    assert how == path, (how, path)
    return t1 - t0, t2 - t1


def main(rounds):
    cases = [("2 ranks, local", 2, None), ("4 ranks, emulated 1gbit", 4, "1gbit")]
    launch("forked", 2, None)  # the launcher's own start (once per process), not timed
    times = {(c, p): [] for c, _, _ in cases for p in ("forked", "popen")}
    for r in range(rounds):
        order = ("forked", "popen") if r % 2 == 0 else ("popen", "forked")
        for name, w, net in cases:
            for path in order:
                reset_s, close_s = launch(path, w, net)
                times[(name, path)].append(reset_s)
                print(f"round {r} {name:24s} {path:6s} reset {reset_s:6.2f} s close {close_s:5.2f} s", flush=True)
    print()
    print("| launch | agents | median reset s | min-max s | forked/popen (medians) |")
    print("|---|---|---:|---:|---:|")
    for name, _, _ in cases:
        med = {p: statistics.median(times[(name, p)]) for p in ("forked", "popen")}
        for p in ("popen", "forked"):
            ts = times[(name, p)]
            ratio = f"{med['forked'] / med['popen']:.2f}" if p == "forked" else ""
            print(f"| {name} | {p} | {med[p]:.2f} | {min(ts):.2f}-{max(ts):.2f} | {ratio} |")


if __name__ == "__main__":
    rounds = int(sys.argv[1])
    if "--record" in sys.argv:
        root = sys.argv[sys.argv.index("--record") + 1]
        with Recording(root, ["python", "launch_times.py", *sys.argv[1:]]):
            main(rounds)
    else:
        main(rounds)
