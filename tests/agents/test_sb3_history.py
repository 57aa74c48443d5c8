"""SB3 agents with an observation history (``history``): SB3's VecFrameStack while learning,
the same stack threaded through ``predict``'s state while acting."""

from __future__ import annotations

import numpy as np
import pytest

from commgym.agents import load_agent, make_agent, rollout
from commgym.agents.sb3 import _push
from commgym.env.sim import SimEnv
from commgym.env.sim.randomize import RandomizedConditions
from tests.env.test_sim import _calibration, _env_cfg

FLAKY = {"schedule": [[0, "10mbit"], [1.0, "100mbit"], [2.0, "10mbit"]], "shift_s": 0.2}


@pytest.fixture(scope="module")
def env():
    return SimEnv(_calibration(), _env_cfg(network=FLAKY, probe_bytes=65536))


def test_predict_stacks_as_vec_frame_stack_does(env):
    agent = make_agent("ppo", env, seed=0, history=3, n_steps=16, batch_size=16)
    twin = SimEnv(_calibration(), _env_cfg(network=FLAKY, probe_bytes=65536))
    venv = agent._learning_env(twin)  # DummyVecEnv + VecFrameStack, as learn() uses
    venv.seed(5)
    stacked = venv.reset()
    obs, _ = env.reset(seed=5)
    mine = _push(None, obs[None], 3, np.array([True]))
    for _ in range(6):
        np.testing.assert_array_equal(mine, stacked)
        action = np.array([env.action_space.sample()])
        stacked, _, done, _ = venv.step(action)
        obs, *_ = env.step(action[0])
        mine = _push(mine, obs[None], 3, done)
    assert stacked.shape == (1, 3 * env.observation_space.shape[0])


def test_learns_saves_and_acts_with_its_history(env, tmp_path):
    agent = make_agent("ppo", env, seed=0, history=4, n_steps=32, batch_size=32)
    agent.learn(64)
    first = rollout(env, agent, 11, target_loss=0.2)
    loaded = load_agent(agent.save(tmp_path / "ppo"), env=env)
    assert loaded.history == 4 and loaded.hyperparams["history"] == 4
    again = rollout(env, loaded, 11, target_loss=0.2)
    assert [s.config for s in again.steps] == [s.config for s in first.steps]
    # a batch of two rows keeps one stack per row
    obs, _ = env.reset(seed=11)
    actions, state = agent.predict(np.stack([obs, obs]), episode_start=np.array([True, True]))
    assert actions.shape == (2, 3) and state[0].shape == (2, 4 * obs.shape[0])
    with pytest.raises(ValueError, match="history must be an integer >= 1"):
        make_agent("ppo", env, history=0)


def test_randomized_conditions_vary_the_trace_and_keep_its_rates(env):
    wrapped = RandomizedConditions(
        SimEnv(_calibration(), _env_cfg(network=FLAKY, probe_bytes=65536)), rate_swap=0.0
    )
    traces = []
    for seed in (3, None, None):
        wrapped.reset(seed=seed)
        traces.append(wrapped.schedule)
    assert all([s for _, s in t] == ["10mbit", "100mbit", "10mbit"] for t in traces)
    lengths = [t[1][0] for t in traces]
    assert len(set(lengths)) == 3 and all(0.6 <= x <= 1.4 for x in lengths)
    wrapped.reset(seed=3)
    assert wrapped.schedule == traces[0]  # seeded: reproducible
    with pytest.raises(ValueError, match="neither compute_scale nor timing_noise"):
        RandomizedConditions(SimEnv(_calibration(), _env_cfg(network="10mbit")))
    # links drawn per episode: only the timing varies, the profiles stay the scenario's
    lottery = _env_cfg(network={"profiles": ["10mbit", "100mbit"]})
    timed = RandomizedConditions(SimEnv(_calibration(), lottery), compute_scale=[1.2, 1.2])
    timed.reset(seed=3)
    assert timed.unwrapped.config is lottery and timed.unwrapped.compute_scale == 1.2


def test_normalize_learns_on_scaled_observations_and_keeps_the_scale_in_the_file(env, tmp_path):
    agent = make_agent("ppo", env, seed=0, history=2, normalize=True, n_steps=32, batch_size=32)
    agent.learn(64)
    norm = agent._norm
    assert norm is not None and norm.obs_rms.count > 64  # updated while learning
    # predict scales the stacked observation by the learned statistics, as VecNormalize does
    obs, _ = env.reset(seed=3)
    stack = _push(None, obs[None], 2, np.array([True]))
    expected = np.clip(
        (stack - norm.obs_rms.mean) / np.sqrt(norm.obs_rms.var + norm.epsilon),
        -norm.clip_obs, norm.clip_obs,
    )  # fmt: skip
    np.testing.assert_allclose(agent._normalized(stack), expected, rtol=1e-6)
    first = rollout(env, agent, 11, target_loss=0.2)
    # saved as JSON (no pickle) and applied by the loaded policy, with or without an env
    path = agent.save(tmp_path / "ppo")
    for loaded in (load_agent(path, env=env), load_agent(path)):
        np.testing.assert_allclose(loaded._norm.obs_rms.mean, norm.obs_rms.mean)
        np.testing.assert_allclose(loaded._norm.obs_rms.var, norm.obs_rms.var)
    again = rollout(env, load_agent(path, env=env), 11, target_loss=0.2)
    assert [s.config for s in again.steps] == [s.config for s in first.steps]
    # fine-tuning on another env keeps the statistics the policy learned against
    before = norm.obs_rms.mean.copy()
    agent.fine_tune(SimEnv(_calibration(), _env_cfg(network=FLAKY, probe_bytes=65536)), 1,
                    rollout_steps=8)  # fmt: skip
    np.testing.assert_array_equal(agent._norm.obs_rms.mean, before)
    with pytest.raises(ValueError, match="normalize has unknown keys"):
        make_agent("ppo", env, normalize={"scale": 2})
    with pytest.raises(ValueError, match="normalize must be true, false or a dict"):
        make_agent("ppo", env, normalize="yes")


def test_a_policy_that_does_not_read_the_probe_learns_and_acts_without_it(env, tmp_path):
    learn_on = SimEnv(_calibration(), _env_cfg(network=FLAKY, probe_bytes=65536))
    agent = make_agent("ppo", learn_on, seed=0, probe=False, n_steps=16, batch_size=16)
    assert not agent.reads_probe and agent.hyperparams["probe"] is False
    seen = []
    agent.learn(40, callback=lambda s: seen.append(s["info"]["measured"]["probe_s"]))
    assert len(seen) >= 40 and set(seen) == {0.0}  # auto-resets included
    ep = rollout(env, agent, 11, target_loss=0.2)  # the rollout resets probe-free too
    assert all(s.measured.probe_bytes == 0 for s in ep.steps)
    loaded = load_agent(agent.save(tmp_path / "ppo"), env=env)
    assert not loaded.reads_probe
    with pytest.raises(ValueError, match="probe must be true or false"):
        make_agent("ppo", env, probe="no")


def test_obs_fields_zero_what_the_policy_does_not_read(env, tmp_path):
    """``obs_fields``: the unread fields are 0 while learning (the algorithm's env) and while
    acting (``predict``), so the policy cannot depend on them; the file keeps the choice."""
    from commgym.env.spaces import OBSERVATION_FIELDS

    names = [f.name for f in OBSERVATION_FIELDS]
    read = ["step_time_s", "eval_loss", "compression_index"]
    agent = make_agent(
        "ppo", env, seed=0, history=2, normalize=True, obs_fields=read, n_steps=32,
        batch_size=32,
    )  # fmt: skip
    venv = agent._learning_env(SimEnv(_calibration(), _env_cfg(network=FLAKY)))
    venv.seed(3)
    venv.reset()
    for _ in range(5):
        venv.step(np.array([env.action_space.sample()]))
        seen = venv.get_original_obs()[0].reshape(2, -1)
        off = [j for j, n in enumerate(names) if n not in read]
        assert not seen[:, off].any() and seen[1, names.index("step_time_s")] > 0
    agent.learn(64)
    obs, _ = env.reset(seed=11)
    noisy = obs.copy()
    noisy[names.index("log10_grad_norm")] += 50.0  # a field it does not read
    a1, _ = agent.predict(obs, episode_start=np.array([True]))
    a2, _ = agent.predict(noisy, episode_start=np.array([True]))
    np.testing.assert_array_equal(a1, a2)
    loaded = load_agent(agent.save(tmp_path / "masked"), env=env)
    assert loaded.hyperparams["obs_fields"] == read
    a3, _ = loaded.predict(noisy, episode_start=np.array([True]))
    np.testing.assert_array_equal(a1, a3)
    with pytest.raises(ValueError, match="unknown fields \\['grad_norm'\\]; valid: step_time_s"):
        make_agent("ppo", env, obs_fields=["grad_norm"])
    with pytest.raises(ValueError, match="non-empty list"):
        make_agent("ppo", env, obs_fields="eval_loss")
