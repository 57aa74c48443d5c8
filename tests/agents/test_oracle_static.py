"""oracle-static: every entry on the evaluation seeds, ranked by time to target."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

import commgym.env  # noqa: F401 - registers the env
from commgym.agents import OracleEntry, OracleStaticAgent, load_agent, make_agent
from tests.agents.synthetic import TimedTableEnv

# given out of order; the hand-computed ranking is below
ENTRIES = ["none/25MB/H1", "fp16/4MB/H4", "none/1MB/H1", "int8/4MB/H4", "fp16/1MB/H1"]
SEEDS = [0, 1]  # TimedTableEnv speeds 1.0 and 1.1
TARGET, BUDGET_S, DECISIONS, L0 = 0.5, 100.0, 40, 2.0


def _env(**kw):
    return TimedTableEnv(episode_len=DECISIONS, target_loss=TARGET, time_budget_s=BUDGET_S, **kw)


def _by_hand(env, entry):
    """(mean time to target with misses at the budget, seeds reached, times, final loss)."""
    a = next(
        np.array(np.unravel_index(i, tuple(env.menu.nvec)))
        for i in range(env.menu.size)
        if str(env.menu.decode(np.array(np.unravel_index(i, tuple(env.menu.nvec))))) == entry
    )
    dt = env.decision_time_s(a)
    times, finals = [], []
    for seed in SEEDS:
        x = env.rate(a) * (1.0 + 0.1 * (seed % 3)) * dt  # log-loss drop per decision
        k = math.ceil(math.log(L0 / TARGET) / x)  # decisions to reach the target
        times.append(k * dt if k <= DECISIONS else None)
        finals.append(L0 * math.exp(-min(k, DECISIONS) * x))
    mean = np.mean([BUDGET_S if t is None else t for t in times])
    return mean, sum(t is not None for t in times), times, float(np.mean(finals))


def test_ranks_every_entry_by_the_documented_rule(tmp_path):
    env = _env()
    agent = make_agent("oracle-static", env, seeds=SEEDS, entries=ENTRIES)
    assert isinstance(agent, OracleStaticAgent) and agent.oracle
    with pytest.raises(RuntimeError, match="learn"):
        agent.predict(env.reset(seed=0)[0])
    steps = []
    agent.learn(callback=lambda s: steps.append(s) or True)
    # all reach: by mean time; fp16/1MB/H1 reaches on one seed; the rest by final loss
    assert [e.config for e in agent.ranking] == [
        "int8/4MB/H4", "fp16/4MB/H4", "fp16/1MB/H1", "none/25MB/H1", "none/1MB/H1",
    ]  # fmt: skip
    for entry in agent.ranking:
        mean, reached, times, final = _by_hand(env, entry.config)
        assert entry.mean_time_to_target_s == pytest.approx(mean)
        assert entry.seeds_reached == reached
        assert entry.times_to_target_s == pytest.approx(times)
        assert entry.final_eval_loss == pytest.approx(final)
        assert [e.seed for e in entry.episodes] == SEEDS
    assert agent.ranking == sorted(agent.ranking, key=OracleEntry.rank_key)
    assert agent.search_decisions == len(steps) == env.steps_total
    assert agent.search_decisions == sum(e.decisions for r in agent.ranking for e in r.episodes)
    assert steps[-1]["timestep"] == agent.search_decisions
    assert agent.search_cost_s > 0
    assert agent.search_train_time_s == pytest.approx(
        sum(e.train_time_s for r in agent.ranking for e in r.episodes)
    )
    obs = env.reset(seed=0)[0]
    best = env.menu.encode(env.menu.decode(np.array([2, 1, 2])))  # int8/4MB/H4
    np.testing.assert_array_equal(agent.predict(obs)[0], best)
    assert "oracle" in agent.display_name and "int8/4MB/H4" in agent.display_name

    loaded = load_agent(agent.save(tmp_path / "oracle"))
    assert loaded.ranking == agent.ranking
    assert loaded.search_decisions == agent.search_decisions
    assert loaded.search_cost_s == agent.search_cost_s
    np.testing.assert_array_equal(loaded.predict(obs)[0], best)


def test_whole_menu_by_default_and_a_cap_stops_the_search():
    env = _env()
    agent = make_agent("oracle-static", env, seeds=[0])
    assert len(agent.entries) == env.menu.size
    entries = ["int8/4MB/H4", "ddp-default", "fp16/4MB/H4"]
    capped = make_agent("oracle-static", env, seeds=[0], entries=entries)
    assert capped.entries[1] == "none/25MB/H1"  # presets resolve to menu entries
    # int8/4MB/H4 takes 7 decisions and ddp-default 40: stop inside the second entry
    with pytest.warns(UserWarning, match="left out"):
        capped.learn(20)
    assert [e.config for e in capped.ranking] == ["int8/4MB/H4"]
    assert capped.search_decisions == 20
    with pytest.raises(RuntimeError, match="before any entry"):
        make_agent("oracle-static", env, seeds=[0], entries=entries[1:]).learn(5)


def test_invalid_arguments():
    env = _env()
    with pytest.raises(ValueError, match="seeds"):
        make_agent("oracle-static", env, seeds=[])
    with pytest.raises(ValueError, match="distinct"):
        make_agent("oracle-static", env, seeds=[1, 1])
    with pytest.raises(ValueError, match="unknown static preset"):
        make_agent("oracle-static", env, entries=["int8/3MB/H1"])
    with pytest.raises(ValueError, match="twice"):
        make_agent("oracle-static", env, entries=["ddp-default", "none/25MB/H1"])
    with pytest.raises(ValueError, match="total_timesteps"):
        make_agent("oracle-static", env, seeds=[0], entries=["ddp-default"]).learn(0)


def test_ranks_every_entry_on_real_ranks():
    entries = ["none/25MB/H1", "fp16/25MB/H2"]
    menu = {"compression": ["none", "fp16"], "bucket_mb": [4, 25], "sync_period": [1, 2]}
    env = gym.make(
        "commgym/AllReduce-v1", workload="mlp-digits", world_size=2, steps_per_decision=2,
        time_budget_s=60, max_decisions=3, target_loss=1.0, action_menu=menu,
    )  # fmt: skip
    try:
        steps = []
        agent = make_agent("oracle-static", env, seeds=[1000], entries=entries)
        agent.learn(callback=lambda s: steps.append(s) or True)
        assert sorted(e.config for e in agent.ranking) == sorted(entries)
        assert agent.search_decisions == len(steps)
        assert agent.search_decisions == sum(e.decisions for r in agent.ranking for e in r.episodes)
        assert all(len(r.episodes) == 1 and r.episodes[0].decisions >= 1 for r in agent.ranking)
        assert agent.ranking == sorted(agent.ranking, key=OracleEntry.rank_key)
        action, _ = agent.predict(env.reset(seed=1000)[0])
        assert str(env.unwrapped.menu.decode(action)) == agent.ranking[0].config
    finally:
        env.close()
