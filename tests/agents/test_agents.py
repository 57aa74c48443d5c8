"""commgym.agents on a synthetic env with AllReduceEnv's spaces and a known reward table."""

from __future__ import annotations

import json
import math
import zipfile

import gymnasium as gym
import numpy as np
import pytest

from commgym.agents import (
    AGENTS,
    AccordionAgent,
    AdaCommAgent,
    Agent,
    BayesOptAgent,
    GridAgent,
    SB3Agent,
    StaticAgent,
    check_compatible,
    layout_of,
    load_agent,
    make_agent,
    read_policy_json,
)
from commgym.agents.base import POLICY_JSON
from commgym.agents.bayesopt import expected_improvement
from commgym.env import OBSERVATION_FIELDS, FlattenAction
from commgym.env.spaces import ObservationBuilder
from tests.agents.synthetic import TableEnv

FIELD = {f.name: i for i, f in enumerate(OBSERVATION_FIELDS)}
SMALL_MENU = {"compression": ["none", "fp16", "int8"], "bucket_mb": [4, 25], "sync_period": [1, 2]}

# name -> (kwargs, learn steps): small but enough for every learning path to run
CASES = {
    "static:ddp-default": ({}, 5),
    "static:fp16-dense": ({}, 5),
    "static:int8/4MB/H1": ({}, 5),
    "random": ({"seed": 1}, 5),
    "grid": ({}, 50),
    "bayesopt": ({"seed": 0, "budget": 6, "repeats": 1, "warmup": 0}, 12),
    "autotune": ({"seed": 0, "tuning_decisions": 3}, 0),  # tunes inside episodes only
    "bandit": ({"seed": 0, "window": 50}, 60),
    "accordion": ({}, 5),
    "adacomm": ({}, 5),
    "ppo": ({"seed": 0, "n_steps": 16, "batch_size": 16}, 32),
    "recurrent-ppo": ({"seed": 0, "n_steps": 16, "batch_size": 16}, 32),
    "a2c": ({"seed": 0}, 16),
    "dqn": ({"seed": 0, "learning_starts": 8}, 32),
}


def _observations(env: gym.Env, n: int = 12) -> list[np.ndarray]:
    """Reset obs, a few step obs and random in-bounds obs (float32, the layout's length)."""
    obs, _ = env.reset(seed=123)
    out = [obs]
    for a in ([0, 0, 0], [2, 1, 2], [4, 2, 1]):
        obs, *_ = env.step(np.array(a))
        out.append(obs)
    rng = np.random.default_rng(0)
    builder = ObservationBuilder(env.unwrapped.menu, 2, 1000)
    for _ in range(n - len(out)):
        x = rng.uniform(0, 1, size=builder.high.shape) * np.minimum(builder.high, 5.0)
        x[FIELD["grad_norm_rel_change"]] = rng.uniform(-2, 2)
        out.append(np.clip(x, builder.low, builder.high).astype(np.float32))
    return out


def test_registry_names_and_unknown_name():
    assert set(AGENTS) == {
        "static", "random", "grid", "bayesopt", "autotune", "oracle-static", "bandit",
        "accordion", "adacomm", "ppo", "recurrent-ppo", "a2c", "dqn", "oracle-adaptive",
        "rollout-table",
        "best-static", "mpc",
    }  # fmt: skip
    for name, cls in AGENTS.items():
        assert cls.name == name and issubclass(cls, Agent)
    env = TableEnv()
    with pytest.raises(ValueError, match=r"did you mean 'bandit'.*Known agents: .*bayesopt"):
        make_agent("bandti", env)
    with pytest.raises(ValueError, match="Known agents"):
        make_agent("zzzzzz", env)


@pytest.mark.parametrize("name", list(CASES))
def test_learn_predict_save_load_roundtrip(name, tmp_path):
    kwargs, steps = CASES[name]
    env = TableEnv()
    agent = make_agent(name, env, **kwargs)
    json.dumps(agent.hyperparams)  # plain values only
    calls = []
    agent.learn(steps, callback=lambda s: calls.append(s) or True)
    assert len(calls) == steps
    for step in calls:
        assert env.action_space.contains(np.asarray(step["action"], dtype=np.int64))
        assert set(step) == {
            "obs", "action", "reward", "terminated", "truncated", "info", "timestep",
        }  # fmt: skip
    observations = _observations(env)
    for obs in observations:
        for det in (True, False):
            action, _ = agent.predict(obs, deterministic=det)
            assert action.shape == (3,) and action.dtype == np.int64
            assert env.action_space.contains(action), (name, action)
    batch, _ = agent.predict(np.stack(observations[:4]))
    assert batch.shape == (4, 3)
    assert all(env.action_space.contains(a) for a in batch)

    path = agent.save(tmp_path / "policy")
    assert path.suffix == ".zip" and path.exists()
    meta = read_policy_json(path)
    assert meta["class"] == type(agent).__name__
    assert meta["layout"] == layout_of(env)
    assert meta["layout"]["env_id"] == "commgym/AllReduce-v1"
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
    if isinstance(agent, SB3Agent):
        assert "data" in names and POLICY_JSON in names  # SB3 archive + our member
    else:
        assert names == [POLICY_JSON]  # no pickle

    expected = [agent.predict(o, deterministic=True)[0] for o in observations]
    loaded = load_agent(path, env=TableEnv())
    assert type(loaded) is type(agent)
    assert loaded.hyperparams == agent.hyperparams
    got = [loaded.predict(o, deterministic=True)[0] for o in observations]
    np.testing.assert_array_equal(np.stack(got), np.stack(expected))
    # the class method and an env-less load give the same actions too
    again = type(agent).load(path)
    got = [again.predict(o, deterministic=True)[0] for o in observations]
    np.testing.assert_array_equal(np.stack(got), np.stack(expected))
    with pytest.raises(RuntimeError, match="without an env"):
        again.learn(1)


@pytest.mark.parametrize("name", ["grid", "ppo"])
def test_load_with_incompatible_menu_names_difference(name, tmp_path):
    kwargs, _ = CASES[name]
    path = make_agent(name, TableEnv(), **kwargs).save(tmp_path / "p.zip")
    other = TableEnv(menu={"compression": ["none", "fp16", "int4", "topk:0.01", "powersgd:2"]})
    with pytest.raises(ValueError, match=r"action menu 'compression'.*int8.*int4"):
        load_agent(path, env=other)
    with pytest.raises(ValueError, match="bucket_mb"):
        load_agent(path, env=TableEnv(menu={"bucket_mb": [1, 25]}))


def test_load_refuses_other_class_and_foreign_zip(tmp_path):
    path = make_agent("grid", TableEnv()).save(tmp_path / "g.zip")
    with pytest.raises(ValueError, match="GridAgent"):
        BayesOptAgent.load(path)
    foreign = tmp_path / "x.zip"
    with zipfile.ZipFile(foreign, "w") as zf:
        zf.writestr("data", "{}")
    with pytest.raises(ValueError, match=POLICY_JSON):
        load_agent(foreign)


def test_check_compatible_names_observation_fields():
    env = TableEnv()
    layout = layout_of(env)
    check_compatible(layout, env)
    layout["observation_fields"] = [*layout["observation_fields"][:9], "renamed", "extra"]
    with pytest.raises(ValueError, match=r"observation fields differ from index 9.*renamed"):
        check_compatible(layout, env)


def test_agents_refuse_flattened_env():
    with pytest.raises(TypeError, match="MultiDiscrete"):
        make_agent("grid", FlattenAction(TableEnv()))


# -- static ---------------------------------------------------------------------------
def test_static_presets_map_to_configs():
    env = TableEnv()
    obs, _ = env.reset(seed=0)
    cases = {
        "static:ddp-default": "none/25MB/H1",
        "static:fp16-dense": "fp16/25MB/H1",
        "static:int8/4MB/H1": "int8/4MB/H1",
        "static:topk:0.01/1MB/H4": "topk:0.01/1MB/H4",
    }
    for name, config in cases.items():
        agent = make_agent(name, env)
        assert isinstance(agent, StaticAgent)
        assert str(agent.config) == config
        action, _ = agent.predict(obs)
        assert str(env.menu.decode(action)) == config
    assert str(make_agent("static", env).config) == "none/25MB/H1"


def test_static_refuses_off_menu_presets():
    no25 = TableEnv(menu={"bucket_mb": [1, 4]})
    with pytest.raises(ValueError, match=r"ddp-default.*not on the env's action menu.*bucket_mb"):
        make_agent("static:ddp-default", no25)
    nofp16 = TableEnv(menu={"compression": ["none", "int8"]})
    with pytest.raises(ValueError, match="fp16-dense"):
        make_agent("static:fp16-dense", nofp16)
    with pytest.raises(ValueError, match=r"unknown static preset 'int8/8MB/H1'.*action menu"):
        make_agent("static:int8/8MB/H1", TableEnv())


# -- search / bandits -------------------------------------------------------------------
def test_grid_picks_best_arm():
    env = TableEnv(noise=0.01)
    agent = GridAgent(env, decisions_per_arm=2)
    agent.learn(env.menu.size * 2)
    assert agent.done and (agent.counts == 2).all()
    action, _ = agent.predict(env.reset()[0])
    np.testing.assert_array_equal(action, env.best_action())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bayesopt_finds_best_arm_within_budget(seed):
    env = TableEnv(noise=0.02)
    agent = make_agent("bayesopt", env, seed=seed, budget=15, repeats=1, warmup=1, n_initial=4)
    agent.learn(60)
    assert agent.frozen and len(agent.values) == 15
    assert len(set(agent.sampled)) < env.menu.size  # found it without a full sweep
    action, _ = agent.predict(env.reset()[0])
    np.testing.assert_array_equal(action, env.best_action())
    # frozen one-shot tuner: the exploring action is the best one too
    explore, _ = agent.predict(env.reset()[0], deterministic=False)
    np.testing.assert_array_equal(explore, env.best_action())


def test_bayesopt_discards_warmup_and_takes_median():
    env = TableEnv(menu=SMALL_MENU, noise=0.0)
    agent = BayesOptAgent(env, seed=0, budget=3, repeats=3, warmup=2, n_initial=3)
    seen = []
    agent.learn(30, callback=lambda s: seen.append(agent._flat(s["action"])) or True)
    assert agent.frozen and len(agent.values) == 3
    # each sample: 2 warmup + 3 repeats on one entry (the entries differ: no reuse)
    assert len(set(agent.sampled)) == 3
    for i, v in zip(agent.sampled, agent.values, strict=True):
        assert math.isclose(v, env.table(agent._unflat(i)))
        assert seen.count(i) >= 5
    assert agent.sampled[0] == agent._flat(env.menu.default_action())


def test_bayesopt_retune_keeps_exploring():
    env = TableEnv(menu=SMALL_MENU, noise=0.01)
    agent = BayesOptAgent(env, seed=0, budget=4, repeats=1, warmup=0, retune_every=3)
    agent.learn(40)
    assert agent.frozen and len(agent.values) > 4


def test_expected_improvement_basics():
    ei = expected_improvement(np.array([0.0, 1.0, 2.0]), np.array([1.0, 0.0, 0.0]), 1.0)
    assert ei[0] > 0 and ei[1] == 0 and ei[2] == pytest.approx(1.0)


def test_bandit_prefers_best_arm():
    env = TableEnv(noise=0.02)
    agent = make_agent("bandit", env, seed=0, window=400, exploration=0.5)
    agent.learn(400)
    counts, _ = agent.window_stats()
    best = agent._flat(env.best_action())
    assert counts[best] == counts.max()
    action, _ = agent.predict(env.reset()[0])
    np.testing.assert_array_equal(action, env.best_action())


def test_bandit_window_forgets():
    env = TableEnv(menu=SMALL_MENU)
    agent = make_agent("bandit", env, seed=0, window=10)
    agent.learn(30)
    assert len(agent.history) == 10 and agent.t == 30


# -- heuristics ---------------------------------------------------------------------------
def _obs(**fields: float) -> np.ndarray:
    x = np.zeros(len(OBSERVATION_FIELDS), dtype=np.float32)
    for k, v in fields.items():
        x[FIELD[k]] = v
    return x


def test_accordion_switches_on_grad_norm_change():
    env = TableEnv()
    agent = AccordionAgent(env)  # light fp16, heavy powersgd:2, 25 MB, H1
    menu = env.menu

    def comp(obs):
        return menu.compression[agent.predict(obs)[0][0]]

    assert comp(_obs(elapsed_frac=0.5, grad_norm_rel_change=0.8)) == "fp16"
    assert comp(_obs(elapsed_frac=0.5, grad_norm_rel_change=-0.6)) == "fp16"
    assert comp(_obs(elapsed_frac=0.5, grad_norm_rel_change=0.1)) == "powersgd:2"
    assert comp(_obs(elapsed_frac=0.5, grad_norm_rel_change=0.49)) == "powersgd:2"
    assert comp(_obs(elapsed_frac=0.0)) == "fp16"  # episode start is critical
    action, _ = agent.predict(_obs(elapsed_frac=0.5, grad_norm_rel_change=0.1))
    assert menu.bucket_mb[action[1]] == 25.0 and menu.sync_period[action[2]] == 1
    custom = AccordionAgent(env, light=0, heavy=2, eta=0.2)
    assert (
        menu.compression[custom.predict(_obs(elapsed_frac=0.5, grad_norm_rel_change=0.3))[0][0]]
        == "none"
    )
    assert (
        menu.compression[custom.predict(_obs(elapsed_frac=0.5, grad_norm_rel_change=0.1))[0][0]]
        == "int8"
    )
    with pytest.raises(ValueError, match="heavy"):
        AccordionAgent(env, heavy=9)
    with pytest.raises(ValueError, match="eta"):
        AccordionAgent(env, eta=0)


def test_adacomm_period_follows_loss():
    """AdaComm (Wang & Joshi 2019): H = ceil(sqrt(L/L0) H0) falls as the loss falls."""
    env = TableEnv(menu={"sync_period": [1, 2, 4, 8]})
    agent = AdaCommAgent(env)  # H0 = 8
    periods = []
    state = None
    for frac, loss in [(0.0, 2.0), (0.2, 1.5), (0.4, 0.5), (0.6, 0.125), (0.8, 0.02)]:
        action, state = agent.predict(_obs(elapsed_frac=frac, eval_loss=loss), state)
        periods.append(env.menu.sync_period[action[2]])
        assert state[0] == 2.0  # L0 threaded through the state
    # ceil(sqrt(L/2) * 8) = 8, 7, 4, 2, 1 -> nearest menu periods
    assert periods == [8, 8, 4, 2, 1]
    assert periods == sorted(periods, reverse=True)
    # a new episode (elapsed_frac == 0) re-reads L0
    action, state = agent.predict(_obs(elapsed_frac=0.0, eval_loss=0.5), state)
    assert env.menu.sync_period[action[2]] == 8 and state[0] == 0.5
    # without a state the agent tracks L0 itself
    agent2 = AdaCommAgent(env)
    agent2.predict(_obs(elapsed_frac=0.0, eval_loss=2.0))
    action, _ = agent2.predict(_obs(elapsed_frac=0.5, eval_loss=0.125))
    assert env.menu.sync_period[action[2]] == 2
    # learn drives it on the synthetic env: loss falls, the period never rises
    agent3 = AdaCommAgent(env, h0=8)
    chosen = []
    agent3.learn(30, callback=lambda s: chosen.append(int(s["action"][2])) or True)
    assert chosen == sorted(chosen, reverse=True)


# -- SB3 ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ppo", "recurrent-ppo", "a2c", "dqn"])
def test_sb3_agents_learn_a_few_hundred_steps(name):
    env = TableEnv()
    agent = make_agent(name, env, seed=0)
    seen = []
    agent.learn(256, callback=lambda s: seen.append(s) or True)
    assert len(seen) == 256
    assert all(env.action_space.contains(np.asarray(s["action"])) for s in seen)
    assert any(s["truncated"] for s in seen)  # 40-decision episodes
    action, _ = agent.predict(env.reset()[0])
    assert env.action_space.contains(action)
    assert agent.model.num_timesteps == 256
    agent.learn(32)  # continues
    assert agent.model.num_timesteps == 288


def test_sb3_defaults_overridable_and_callback_stops():
    env = TableEnv()
    agent = make_agent("ppo", env, n_steps=8, batch_size=8, seed=0)
    assert agent.model.n_steps == 8 and agent.hyperparams["n_epochs"] == 4
    stop = []
    agent.learn(64, callback=lambda s: stop.append(s) or len(stop) < 5)
    assert len(stop) == 5


def test_step_agent_callback_stops_and_resets_on_episode_end():
    env = TableEnv(episode_len=4)
    steps = []
    make_agent("random", env, seed=0).learn(10, callback=lambda s: steps.append(s) or True)
    assert [s["truncated"] for s in steps][:4] == [False, False, False, True]
    steps.clear()
    make_agent("random", env, seed=0).learn(
        10, callback=lambda s: steps.append(s) or len(steps) < 3
    )
    assert len(steps) == 3


def test_random_agent_is_seeded():
    env = TableEnv()
    obs = env.reset(seed=0)[0]
    a = [make_agent("random", env, seed=7).predict(obs)[0] for _ in range(2)]
    np.testing.assert_array_equal(a[0], a[1])


def test_predict_rejects_bad_shapes():
    env = TableEnv()
    for name in ("grid", "ppo"):
        agent = make_agent(name, env, **CASES[name][0])
        with pytest.raises(ValueError, match="observation must have shape"):
            agent.predict(np.zeros(5, dtype=np.float32))


def test_invalid_hyperparameters():
    env = TableEnv()
    with pytest.raises(ValueError, match="budget"):
        make_agent("bayesopt", env, budget=0)
    with pytest.raises(ValueError, match="window"):
        make_agent("bandit", env, window=0)
    with pytest.raises(ValueError, match="decisions_per_arm"):
        make_agent("grid", env, decisions_per_arm=0)
    with pytest.raises(TypeError):
        make_agent("ppo", env, not_a_param=1)


def test_progress_bar():
    env = TableEnv()
    make_agent("grid", env).learn(5, progress_bar=True)  # rich, always installed
    agent = make_agent("a2c", env, seed=0)
    try:
        import tqdm  # noqa: F401
    except ImportError:  # SB3's bar needs tqdm: the agent falls back to rich, with a warning
        with pytest.warns(UserWarning, match="tqdm"):
            agent.learn(16, progress_bar=True, callback=lambda s: True)
    else:
        agent.learn(16, progress_bar=True)
    assert agent.model.num_timesteps == 16


def test_agents_never_import_mlflow():
    import subprocess
    import sys

    code = "import sys, commgym.agents; assert 'mlflow' not in sys.modules, 'mlflow imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
