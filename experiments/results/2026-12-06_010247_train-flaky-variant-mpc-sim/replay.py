"""Replay a recorded mpc episode's observations through a policy, decision by decision.

python replay.py SCENARIO CALIBRATION POLICY RECORD_DIR PLAYER SEED

SCENARIO: a scenario name or YAML without the mpc recipe (e.g. flaky-link, or this
record's flaky-variant-mpc-sim.yaml with `agent: mpc` and `env_kind: sim` taken out:
`grep -v -e '^agent:' -e '^env_kind:' flaky-variant-mpc-sim.yaml > variant.yaml`);
PLAYER: the decision CSVs' prefix (mpc_learned). Rebuilds every observation from the
decision CSV (commgym.env.spaces.ObservationBuilder, the env's own builder), feeds it to the
policy (deterministic) and prints per decision: the end of the decision in training time,
the held-out loss, the link read, the belief, the speed estimate, when the current link's
dwell started, the probability that it has ended, and the entry chosen next against the one
the ranks played (`<-- differs` where they differ). A policy at the commit that played
the episode reproduces every choice (the last line always differs: no decision followed).
"""
import csv
import sys
import warnings

import numpy as np

from commgym.agents import load_agent
from commgym.env.sim import SimEnv
from commgym.env.spaces import ObservationBuilder
from commgym.experiments.config import load_run_config

warnings.simplefilter("ignore")


def speed(state):
    """The episode's speed estimate as mpc takes it: the weighted median of its readings."""
    kept = sorted(state.get("scales") or [])
    total, acc = sum(w for _, w in kept), 0.0
    for value, w in kept:
        acc += w
        if acc >= 0.5 * total > 0:
            return value
    return 1.0


scenario, cal, policy, rec, player, seed = sys.argv[1:7]
seed = int(seed)
cfg = load_run_config(scenario).env_config
env = SimEnv(cal, cfg)
agent = load_agent(policy, env=env)
rows = list(csv.DictReader(open(f"{rec}/decisions-{player}-seed{seed}.csv")))
obs, _ = env.reset(seed=seed)
builder = ObservationBuilder(env.menu, cfg.world_size, env.calibration.num_params)
# the loss before the first decision only feeds fields mpc does not read
builder.prev_eval_loss = env.model.progress.initial_loss
action, state = agent.predict(obs, None, deterministic=True)
skip = {"config", "compression", "action", "reason", "bucket_bytes"}
for i, r in enumerate(rows):
    played = np.array([int(x) for x in r["action"].split()])
    m = {k: (float(v) if v not in ("", "True", "False") else (v == "True")) for k, v in r.items()
         if k not in skip}
    obs = builder.build(m, played, float(r["train_time_s"]) / cfg.time_budget_s)
    action, state = agent.predict(obs, state, deterministic=True)
    nxt = rows[i + 1]["config"] if i + 1 < len(rows) else "-"
    chosen = str(env.menu.decode(action))
    p = agent._switch_probability(state, float(r["train_time_s"]))[0]
    belief = [round(x, 2) for x in state.get("belief", [])]
    print(f"{float(r['train_time_s']):6.2f} loss {float(r['eval_loss']):.3f} read "
          f"{agent.rate_bit_s:.0e} belief {belief} speed {speed(state):.2f} since "
          f"{state['since_s']:.2f} p={p:.2f} -> {chosen} (played {nxt})"
          + ("  <-- differs" if chosen != nxt else ""))
