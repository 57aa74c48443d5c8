"""autotune: a one-shot GP autotuner inside each episode (synthetic env, one real run)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import commgym.env  # noqa: F401 - registers the env
from commgym.agents import AutotuneAgent, load_agent, make_agent
from tests.agents.synthetic import TimedTableEnv

N = 8


def _episode(env, agent, seed, decisions=None):
    """Actions and (used, frozen) after each predict of one episode from reset(seed)."""
    obs, _ = env.reset(seed=seed)
    start = np.array([True])
    actions, flags = [], []
    done = False
    while not done and (decisions is None or len(actions) < decisions):
        action, _ = agent.predict(obs, episode_start=start)
        start = np.array([False])
        actions.append(tuple(int(x) for x in action))
        flags.append((agent.tuning_decisions_used, agent.frozen))
        obs, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
    return actions, flags


def test_searches_n_decisions_then_freezes_and_retunes():
    env = TimedTableEnv(noise=0.02, episode_len=20, fastest=(4, 0, 2))
    agent = make_agent("autotune", env, seed=3, tuning_decisions=N)
    assert isinstance(agent, AutotuneAgent) and not agent.frozen
    for episode in range(2):
        actions, flags = _episode(env, agent, seed=episode)
        assert len(actions) == 20
        # the first sample is the DDP default; the search then tries new entries
        assert actions[0] == tuple(env.menu.default_action())
        assert len(set(actions[:N])) == N  # EI draws among unsampled entries
        assert [f[0] for f in flags[:N]] == list(range(1, N + 1))
        assert not any(f[1] for f in flags[:N])
        assert all(f == (N, True) for f in flags[N:])
        assert len(set(actions[N:])) == 1  # frozen on one entry
        assert actions[N] in set(actions[:N])  # the best *sampled* entry
        assert agent.tuned_config == env.menu.decode(np.array(actions[N]))
        assert len(agent.samples) == N
        assert [c for c, _ in agent.samples] == [
            str(env.menu.decode(np.array(a))) for a in actions[:N]
        ]


def test_scores_progress_per_second_from_the_observation():
    env = TimedTableEnv(noise=0.0, episode_len=10, fastest=(4, 0, 2), time_budget_s=50.0)
    agent = make_agent("autotune", env, seed=0, tuning_decisions=4)
    _episode(env, agent, seed=0)
    for config, score in agent.samples:
        a = next(
            np.array(np.unravel_index(i, tuple(env.menu.nvec)))
            for i in range(env.menu.size)
            if str(env.menu.decode(np.array(np.unravel_index(i, tuple(env.menu.nvec))))) == config
        )
        # log-loss progress per second of training is rate * speed (speed 1 for seed 0)
        assert score == pytest.approx(env.rate(a), rel=1e-4), config
    thr = make_agent("autotune", env, seed=0, tuning_decisions=4, objective="throughput")
    actions, _ = _episode(env, thr, seed=0)
    for (_, score), a in zip(thr.samples, actions, strict=False):
        steps = env.config.steps_per_decision
        assert score == pytest.approx(steps / env.decision_time_s(np.array(a)), rel=1e-5)


def test_warmup_discards_decisions_after_a_change():
    env = TimedTableEnv(noise=0.0, episode_len=12, fastest=(4, 0, 2))
    agent = make_agent("autotune", env, seed=1, tuning_decisions=7, warmup=1)
    actions, _ = _episode(env, agent, seed=0)
    # default kept at once (no change after reset); each new entry holds 2 decisions
    assert actions[1] == actions[2] and actions[3] == actions[4] and actions[5] == actions[6]
    assert len(agent.samples) == 4
    assert len(set(actions[7:])) == 1 and agent.frozen


def test_finds_the_known_optimum_more_often_than_random_search():
    env = TimedTableEnv(noise=0.02, episode_len=N + 1, fastest=(4, 0, 2), sharpness=4.0)
    best = env.menu.decode(env.best_action())
    default = int(np.ravel_multi_index(tuple(env.menu.default_action()), tuple(env.menu.nvec)))
    best_flat = int(np.ravel_multi_index(tuple(env.best_action()), tuple(env.menu.nvec)))
    tuned_hits = random_hits = 0
    for seed in range(40):
        agent = make_agent("autotune", env, seed=seed, tuning_decisions=N)
        _episode(env, agent, seed=seed, decisions=N + 1)
        tuned_hits += agent.tuned_config == best
        # random search with the same budget: the default, then N - 1 distinct draws
        others = np.delete(np.arange(env.menu.size), default)
        drawn = np.random.default_rng(seed).choice(others, size=N - 1, replace=False)
        random_hits += best_flat in drawn
    assert tuned_hits > random_hits, (tuned_hits, random_hits)


def test_reproducible_for_a_seed_and_roundtrips(tmp_path):
    env = TimedTableEnv(noise=0.02, episode_len=15)
    runs = [_episode(env, make_agent("autotune", env, seed=5), seed=2)[0] for _ in range(2)]
    assert runs[0] == runs[1]
    # a new episode of the same agent repeats the search: state and draws restart
    agent = make_agent("autotune", env, seed=5)
    first, _ = _episode(env, agent, seed=2)
    again, _ = _episode(env, agent, seed=2)
    assert first == again
    # save mid-search: the loaded agent continues identically
    obs, _ = env.reset(seed=4)
    agent.predict(obs, episode_start=np.array([True]))
    obs, *_ = env.step(agent.predict(obs)[0])
    path = agent.save(tmp_path / "autotune")
    loaded = load_agent(path)
    assert loaded.time_budget_s == agent.time_budget_s == env.config.time_budget_s
    np.testing.assert_array_equal(loaded.predict(obs)[0], agent.predict(obs)[0])
    assert agent.learn(10) is agent  # nothing to learn: no decisions are run
    assert env.steps_total == 2 * 15 + 2 * 15 + 1


def test_batch_keeps_one_search_per_row():
    env = TimedTableEnv()
    agent = make_agent("autotune", env, seed=0, tuning_decisions=2)
    obs, _ = env.reset(seed=0)
    actions, state = agent.predict(np.stack([obs, obs]))
    assert actions.shape == (2, 3) and len(state) == 2
    np.testing.assert_array_equal(actions[0], env.menu.default_action())
    np.testing.assert_array_equal(actions[0], actions[1])


def test_invalid_hyperparameters():
    env = TimedTableEnv()
    with pytest.raises(ValueError, match="tuning_decisions"):
        make_agent("autotune", env, tuning_decisions=-1)
    with pytest.raises(ValueError, match=r"objective.*valid"):
        make_agent("autotune", env, objective="speed")
    with pytest.raises(ValueError, match="warmup"):
        make_agent("autotune", env, warmup=1.5)


def test_freezes_after_n_real_decisions():
    n = 3
    menu = {"compression": ["none", "fp16"], "bucket_mb": [4, 25], "sync_period": [1, 2]}
    env = gym.make(
        "commgym/AllReduce-v1", workload="mlp-digits", world_size=2, steps_per_decision=2,
        time_budget_s=60, max_decisions=6, action_menu=menu,
    )  # fmt: skip
    try:
        agent = make_agent("autotune", env, seed=0, tuning_decisions=n)
        actions, flags = _episode(env, agent, seed=0)
        assert len(actions) == 6
        assert actions[0] == tuple(env.unwrapped.menu.default_action())
        assert [f[0] for f in flags] == [1, 2, 3, 3, 3, 3]
        assert [f[1] for f in flags] == [False] * n + [True] * (6 - n)
        assert len(set(actions[n:])) == 1 and actions[n] in set(actions[:n])
        assert len(agent.samples) == n
    finally:
        env.close()


def test_objective_variants_by_name():
    """``autotune:<objective>`` picks the objective (two variants in one leaderboard)."""
    env = TimedTableEnv(target_loss=0.5)
    assert make_agent("autotune:progress", env).objective == "progress"
    fast = make_agent("autotune:throughput", env, objective="progress", tuning_decisions=2)
    assert fast.objective == "throughput" and fast.tuning_decisions == 2
    with pytest.raises(ValueError, match="objective"):
        make_agent("autotune:speed", env)
