"""An SB3 agent on the real commgym/AllReduce-v1 (2 gloo ranks on CPU)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

import commgym.env  # noqa: F401 - registers the env
from commgym.agents import load_agent, make_agent


def test_ppo_learns_and_predicts_on_real_env(tmp_path):
    env = gym.make(
        "commgym/AllReduce-v1",
        workload="mlp-digits",
        world_size=2,
        steps_per_decision=2,
        time_budget_s=2,
    )
    try:
        agent = make_agent("ppo", env, n_steps=8, batch_size=8, seed=0)
        rewards = []
        agent.learn(16, callback=lambda s: rewards.append(s["reward"]) or True)
        assert len(rewards) == 16 and all(np.isfinite(rewards))
        obs, _ = env.reset(seed=1)
        action, _ = agent.predict(obs)
        assert env.action_space.contains(action)
        obs, reward, *_ = env.step(action)
        assert np.isfinite(reward)
        path = agent.save(tmp_path / "ppo.zip")
        loaded = load_agent(path, env=env)
        np.testing.assert_array_equal(loaded.predict(obs)[0], agent.predict(obs)[0])
    finally:
        env.close()
