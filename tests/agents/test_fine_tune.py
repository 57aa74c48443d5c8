"""SB3 agents continue learning on another env for whole episodes (the sim-to-real recipe)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from commgym.agents import make_agent
from tests.agents.synthetic import TableEnv


def _params(agent) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in agent.model.policy.parameters()])


@pytest.mark.parametrize("name", ["ppo", "recurrent-ppo", "a2c"])
def test_fine_tune_runs_whole_episodes_and_updates_weights(name):
    learn_env, real_env = TableEnv(episode_len=10), TableEnv(episode_len=10, best=(0, 0, 0))
    agent = make_agent(name, learn_env, seed=0, n_steps=64)
    agent.learn(64)
    before = _params(agent)
    ends = []
    decisions = agent.fine_tune(
        real_env,
        3,
        rollout_steps=8,
        callback=lambda s: ends.append(s["terminated"] or s["truncated"]),
    )
    assert decisions == 30 == len(ends) and sum(ends) == 3  # 3 episodes of 10 decisions
    assert not torch.equal(before, _params(agent))  # 3 updates of 8 decisions happened
    assert agent.model.n_steps == 64  # its own rollout size is back
    assert agent.model.rollout_buffer.buffer_size == 64
    assert agent.model.get_env() is not None
    action, _ = agent.predict(real_env.reset(seed=0)[0])
    assert np.asarray(action).shape == (3,)


def test_fine_tune_zero_episodes_is_a_no_op_and_bad_counts_raise():
    agent = make_agent("ppo", TableEnv(episode_len=5), seed=0)
    before = _params(agent)
    assert agent.fine_tune(TableEnv(episode_len=5), 0) == 0
    assert torch.equal(before, _params(agent))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="episodes"):
            agent.fine_tune(TableEnv(), bad)
    with pytest.raises(ValueError, match="rollout_steps"):
        agent.fine_tune(TableEnv(), 1, rollout_steps=0)
