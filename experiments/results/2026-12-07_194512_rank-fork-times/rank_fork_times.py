"""Launch time of an env's ranks: forked by their torchrun agent against fresh interpreters.

Same process, same machine, interleaved rounds: each round launches a 2-rank and a 4-rank
mlp-digits env on this machine and a 4-rank one on an emulated 1 Gbit/s network (one agent per
namespace; root) once with each path (order alternating by round) and times reset() (the
launch: agents, ranks, rendezvous, the first reset) and close().
Both paths fork the torchrun agents from commgym's launcher; "fresh" is Cluster(fork_ranks=False):
torchrun starts each rank as `python -u -m commgym.env.worker`. The launcher's own start (the
process's first launch) is not timed. Each launch's ranks say in their hello how they started.

Usage: python rank_fork_times.py ROUNDS [--record DIR]
"""

import statistics
import sys
import time

import commgym.env.cluster as cluster_mod
from commgym.env import AllReduceEnv
from commgym.env.launcher import start_agent
from commgym.experiments.records import Recording


def launch(path, world_size, network=None):
    fork = path == "forked"
    cluster_mod.start_agent = lambda cmd, env, log, fork_ranks=True: start_agent(
        cmd, env, log, fork_ranks=fork
    )
    env = AllReduceEnv(workload="mlp-digits", world_size=world_size, network=network)
    t0 = time.perf_counter()
    env.reset(seed=0)
    t1 = time.perf_counter()
    forked = {h["forked"] for h in env.cluster.hello}
    env.close()
    t2 = time.perf_counter()
    assert forked == {fork}, (forked, path)
    return t1 - t0, t2 - t1


def main(rounds):
    cases = [("2 ranks, local", 2, None), ("4 ranks, local", 4, None), ("4 ranks, emulated 1gbit", 4, "1gbit")]
    launch("forked", 2)  # the launcher's own start (once per process), not timed
    times = {(c, p): [] for c, _, _ in cases for p in ("forked", "fresh")}
    for r in range(rounds):
        order = ("forked", "fresh") if r % 2 == 0 else ("fresh", "forked")
        for name, w, net in cases:
            for path in order:
                reset_s, close_s = launch(path, w, net)
                times[(name, path)].append(reset_s)
                print(f"round {r} {name:24s} {path:6s} reset {reset_s:6.2f} s close {close_s:5.2f} s", flush=True)
    print()
    print("| launch | ranks | median reset s | min-max s | forked/fresh (medians) |")
    print("|---|---|---:|---:|---:|")
    for name, _, _ in cases:
        med = {p: statistics.median(times[(name, p)]) for p in ("forked", "fresh")}
        for p in ("fresh", "forked"):
            ts = times[(name, p)]
            ratio = f"{med['forked'] / med['fresh']:.2f}" if p == "forked" else ""
            print(f"| {name} | {p} | {med[p]:.2f} | {min(ts):.2f}-{max(ts):.2f} | {ratio} |")


if __name__ == "__main__":
    rounds = int(sys.argv[1])
    if "--record" in sys.argv:
        root = sys.argv[sys.argv.index("--record") + 1]
        with Recording(root, ["python", "rank_fork_times.py", *sys.argv[1:]]):
            main(rounds)
    else:
        main(rounds)
