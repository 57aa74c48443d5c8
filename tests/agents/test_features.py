"""The link clock (commgym.agents.features): what it reads, the same features while an SB3
policy learns (the wrapper) and while it acts (``predict``'s state), saved and refused."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest

from commgym.agents import load_agent, make_agent, rollout
from commgym.agents.features import LINK_CLOCK_FIELDS, LinkClock, LinkClockWrapper, probe_levels
from commgym.agents.sb3 import _push
from commgym.env.sim import SimEnv
from commgym.env.spaces import OBSERVATION_FIELDS, probe_gbps
from tests.env.test_sim import _calibration, _env_cfg

FIELD = {f.name: i for i, f in enumerate(OBSERVATION_FIELDS)}
#: the probe reads 10 Gbit/s and 10 Mbit/s 2.4 decades apart on the fixture's calibration
FLAKY = {"schedule": [[0, "10gbit"], [2, "10mbit"], [4, "10gbit"]], "shift_s": 0.2}


def _obs(probe: float, elapsed: float) -> np.ndarray:
    o = np.zeros(len(OBSERVATION_FIELDS), dtype=np.float32)
    o[FIELD["log10_probe_gbps"]], o[FIELD["elapsed_frac"]] = probe, elapsed
    return o


def test_the_clock_times_each_link_and_remembers_how_long_it_held():
    clock = LinkClock()
    trace = [  # (probe reading, elapsed): fast, slow, fast again, slow again
        (0.0, 0.0), (1.0, 0.05), (1.1, 0.10), (-0.9, 0.20), (-1.0, 0.25),
        (0.95, 0.40), (1.0, 0.45), (-1.0, 0.50),
    ]  # fmt: skip
    got = [clock.update(_obs(p, t)) for p, t in trace]
    # no reading yet, then the first link's age counts from the episode's start
    np.testing.assert_allclose(got[0], [0.0, 0.0, 0.0])
    np.testing.assert_allclose(got[2], [0.10, 0.0, 0.0], atol=1e-7)  # 0.1 decades: same link
    np.testing.assert_allclose(got[3], [0.0, 0.0, 1 / 8], atol=1e-7)  # the slow link begins
    np.testing.assert_allclose(got[4], [0.05, 0.0, 1 / 8], atol=1e-7)
    # the fast link again: it held 0.20 of the budget last time
    np.testing.assert_allclose(got[5], [0.0, 0.20, 2 / 8], atol=1e-7)
    np.testing.assert_allclose(got[6], [0.05, 0.20, 2 / 8], atol=1e-7)
    np.testing.assert_allclose(got[7], [0.0, 0.20, 3 / 8], atol=1e-7)  # slow held 0.20 too
    assert [f.name for f in LINK_CLOCK_FIELDS] == [
        "link_age_frac", "link_last_dwell_frac", "link_changes",
    ]  # fmt: skip
    for bad in (0, -0.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="change_decades must be a finite number > 0"):
            LinkClock(bad)


def _reading(probe_ms: float) -> float:
    """The observation's log10_probe_gbps for a 64 KiB probe on 4 ranks taking ``probe_ms``."""
    return float(np.log10(probe_gbps(65536, probe_ms / 1e3, 4)))


#: probe times (ms) the real ranks read (record 2026-12-06_085551_train-flaky-link-clock):
#: on 10 Gbit/s 1.6-21.3 ms around a median of 6.8, on 10 Mbit/s 74.6-84.4 ms
REAL_FAST = [1.6, 6.8, 21.3, 2.7, 13.9, 6.0]
REAL_SLOW = [74.6, 84.4, 80.7]


def test_with_levels_a_reading_s_spread_on_one_link_is_no_change():
    """The real probe's spread on the fast link (1.1 decades) is no link change when each
    reading belongs to its nearest level; the move rule from one reading cannot tell."""
    levels = [_reading(80.0), _reading(7.7)]  # the calibration's modelled probe, both links
    clock = LinkClock(levels=levels)
    trace = [(ms, 0.01 * i) for i, ms in enumerate(REAL_FAST + REAL_SLOW + REAL_FAST)]
    for ms, t in trace:
        got = clock.update(_obs(_reading(ms), t))
    assert clock.changes == 2  # fast -> slow -> fast, and nothing else
    np.testing.assert_allclose(got, [0.05, 0.06, 2 / 8], atol=1e-6)  # fast held 0.06 last time
    # the move rule: a phase opened by 1.6 ms takes 6.8 ms (0.63 decades) for a new link
    moves = LinkClock()
    for ms, t in trace:
        moves.update(_obs(_reading(ms), t))
    assert moves.changes > 2
    for bad in ([], [1.0, float("inf")], "1.0", [True]):
        with pytest.raises(ValueError, match="levels must be a non-empty list of finite"):
            LinkClock(levels=bad)


def test_probe_levels_are_the_calibrated_probe_on_each_link(env):
    levels = probe_levels(env)
    model, cfg = env.model, env.config
    want = sorted(
        float(np.log10(probe_gbps(65536, model.probe_s(65536, r), 4))) for r in (10**7, 10**10)
    )
    np.testing.assert_allclose(levels, want, atol=1e-6)
    assert levels[1] - levels[0] > 1.0  # the fixture's two links, far apart
    assert len(probe_levels(env, merge_decades=10.0)) == 1  # closer than merge_decades: one
    assert cfg.probe_bytes == 65536
    with pytest.raises(ValueError, match="is not commgym/Sim-v1"):
        probe_levels(gym.Env())


def _sim() -> SimEnv:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 10 Gbit/s is interpolated in this calibration
        return SimEnv(_calibration(), _env_cfg(network=FLAKY, probe_bytes=65536))


@pytest.fixture(scope="module")
def env():
    return _sim()


def test_predict_appends_the_features_the_wrapper_learned_on(env):
    agent = make_agent("ppo", env, seed=0, history=2, link_clock=True, n_steps=16, batch_size=16)
    twin = _sim()
    venv = agent._learning_env(twin)  # DummyVecEnv(LinkClockWrapper) + VecFrameStack
    venv.seed(5)
    learned = venv.reset()
    obs, _ = env.reset(seed=5)
    clocks, row = agent._clocked(None, obs[None], np.array([True]))
    mine = _push(None, row, 2, np.array([True]))
    changes = 0.0
    topk_h2 = np.unravel_index(env.menu.entry_names().index("topk:0.01/25MB/H2"), env.menu.nvec)
    done = np.array([False])
    while not done[0]:  # one episode (the vec env's auto-reset would start another)
        np.testing.assert_array_equal(mine, learned)
        changes = max(changes, float(mine[0, -1]))
        action = np.array([topk_h2])  # fast enough to see both links
        learned, _, done, _ = venv.step(action)
        obs, *_ = env.step(action[0])
        clocks, row = agent._clocked(clocks, obs[None], np.array([False]))
        mine = _push(mine, row, 2, np.array([False]))
    assert learned.shape == (1, 2 * (len(OBSERVATION_FIELDS) + len(LINK_CLOCK_FIELDS)))
    assert changes == 2 / 8  # to 10 Mbit/s and back
    assert agent.link_clock == {"change_decades": 0.5, "levels": probe_levels(env)}


def test_a_policy_with_a_clock_saves_loads_and_acts_alike(env, tmp_path):
    agent = make_agent(
        "ppo", env, seed=0, history=2, normalize=True, link_clock={"change_decades": 0.4},
        n_steps=32, batch_size=32,
    )  # fmt: skip
    agent.learn(64)
    first = rollout(env, agent, 11, target_loss=0.2)
    path = agent.save(tmp_path / "ppo")
    for loaded in (load_agent(path, env=env), load_agent(path)):  # predict-only without env
        assert loaded.link_clock == {"change_decades": 0.4}
        assert loaded.hyperparams["link_clock"] == {"change_decades": 0.4}
        again = rollout(env, loaded, 11, target_loss=0.2)
        assert [s.config for s in again.steps] == [s.config for s in first.steps]
    # two rows keep a clock each; the clocks ride outermost in the state
    obs, _ = env.reset(seed=11)
    actions, state = agent.predict(np.stack([obs, obs]), episode_start=np.array([True, True]))
    assert actions.shape == (2, 3) and len(state[0]) == 2 and state[0][0] is not state[0][1]


def test_a_clock_that_would_read_nothing_is_refused(env):
    with pytest.raises(ValueError, match="link_clock reads the probe's bandwidth"):
        make_agent("ppo", env, link_clock=True, probe=False)
    # the clock reads the whole observation: a policy may leave the probe's fields unread
    masked = make_agent("ppo", env, link_clock=True, obs_fields=["eval_loss"])
    assert masked._padded_mask()[-3:].tolist() == [1.0, 1.0, 1.0]
    for bad in ({"decades": 1}, {}, 0.5):
        with pytest.raises(ValueError, match=r"link_clock must be true, false, \{'levels'"):
            make_agent("ppo", env, link_clock=bad)
    with pytest.raises(ValueError, match="levels must be a non-empty list"):
        make_agent("ppo", env, link_clock={"levels": []})
    with pytest.raises(ValueError, match="change_decades must be a finite number > 0"):
        make_agent("ppo", env, link_clock={"change_decades": 0})
    with pytest.raises(ValueError, match="commgym's observation layout"):
        LinkClockWrapper(LinkClockWrapper(env))


@pytest.mark.parametrize("belief", [False, True])
def test_a_clock_read_by_mpc_s_timing_filter_runs_without_the_probe(tmp_path, belief):
    """``link_clock: {reader: mpc}``: the features come from the link history of mpc reading
    its own timing; the policy runs no probe, the filter learns the dwells in the simulator,
    is saved with the policy and comes back with it (given the env). ``belief: true`` adds
    the filter's link rate, its probability and the change probability mpc plans on."""
    from commgym.agents.features import FilterClock
    from commgym.env.sim.wire import LinkFit

    fixture = _calibration()  # both links recorded: the timing filter tells them apart
    fixture.wire.links[10**10] = {k: LinkFit(3e-4, 1.0) for k in ("allreduce", "allgather")}
    cal = tmp_path / "cal.json"
    fixture.save(cal)
    env = SimEnv(fixture, _env_cfg(network=FLAKY, probe_bytes=65536))
    clock = {"reader": "mpc", "calibration": str(cal), "learn_decisions": 40}
    if belief:
        clock["belief"] = True
    agent = make_agent(
        "ppo", env, seed=0, history=2, probe=False, link_clock=clock, n_steps=16, batch_size=16,
        obs_fields=["eval_loss", "elapsed_frac", "step_time_s"],
    )  # fmt: skip
    mpc = agent._clock_filter
    assert mpc.link_from == "timing" and mpc.prior_decisions > 0  # learned in the simulator
    assert agent.hyperparams["link_clock"] == clock
    # one episode through the clock: it counts the changes mpc's history holds
    filt = FilterClock(mpc, env.config.time_budget_s, belief=belief)
    assert len(filt.fields) == (6 if belief else 3)
    obs, _ = env.reset(seed=5, options={"probe": False})
    topk_h2 = np.unravel_index(env.menu.entry_names().index("topk:0.01/25MB/H2"), env.menu.nvec)
    done, feats = False, []
    while not done:
        feats.append(filt.update(obs))
        obs, _, term, trunc, info = env.step(np.array(topk_h2))
        assert info["measured"]["probe_s"] == 0.0
        done = term or trunc
    feats.append(filt.update(obs))
    assert feats[0].tolist() == [0.0] * len(filt.fields)  # no reading before the first decision
    assert feats[-1][2] == min(filt.state["changes"] / 8, 1.0) and filt.state["changes"] >= 1
    if belief:  # the filter's view: its link (log10 Gbit/s), that link's probability, p(change)
        now = float(obs[[f.name for f in OBSERVATION_FIELDS].index("elapsed_frac")])
        rate, p_link, p_change = mpc.link_outlook(filt.state, now * env.config.time_budget_s)
        assert feats[-1][3] == pytest.approx(np.log10(rate / 1e9), abs=1e-6)
        assert {round(10 ** float(f[3]) * 1e9) for f in feats[1:]} == {10**7, 10**10}
        assert feats[-1][4] == pytest.approx(p_link) and 0.0 <= p_link <= 1.0
        assert feats[-1][5] == pytest.approx(p_change) and 0.0 <= p_change <= 1.0
        assert len({round(float(f[5]), 6) for f in feats[1:]}) > 1  # it moves with the dwell
    assert agent.model.observation_space.shape == (
        2 * (len(OBSERVATION_FIELDS) + len(filt.fields)),
    )
    agent.learn(32)
    first = rollout(env, agent, 11, target_loss=0.2)
    path = agent.save(tmp_path / "ppo")
    loaded = load_agent(path, env=env)
    assert loaded._clock_filter.get_state() == mpc.get_state()
    again = rollout(env, loaded, 11, target_loss=0.2)
    assert [s.config for s in again.steps] == [s.config for s in first.steps]
    # predict-only, as a replay in a user's job loads it: the filter from the saved config
    alone = load_agent(path)
    assert alone._clock_filter.get_state() == mpc.get_state()
    obs, _ = env.reset(seed=11, options={"probe": False})
    state, start = None, np.array([True])
    for _ in range(6):
        a1, state = alone.predict(obs, state, episode_start=start)
        start = np.array([False])
        obs, *_ = env.step(a1)
    replay = [s.config for s in rollout(env, alone, 11, target_loss=0.2).steps]
    assert replay == [s.config for s in first.steps]
    with pytest.raises(ValueError, match="link_clock with a reader is"):
        make_agent("ppo", env, probe=False, link_clock={"reader": "probe"})
    with pytest.raises(ValueError, match="needs calibration"):
        make_agent("ppo", env, probe=False, link_clock={"reader": "mpc"})


def _filter_env(tmp_path):
    """A simulator with both links recorded (the timing filter tells them apart) and its file."""
    from commgym.env.sim.wire import LinkFit

    fixture = _calibration()
    fixture.wire.links[10**10] = {k: LinkFit(3e-4, 1.0) for k in ("allreduce", "allgather")}
    cal = tmp_path / "cal.json"
    fixture.save(cal)
    return SimEnv(fixture, _env_cfg(network=FLAKY, probe_bytes=65536)), str(cal)


def _shielded_episode(env, agent, seed):
    """One episode of ``agent``: per decision, the entry played and its clock's plan (s)."""
    names = env.menu.entry_names()
    nvec = tuple(int(n) for n in env.menu.nvec)
    obs, _ = env.reset(seed=seed, options={"probe": False})
    state, start, done, rows = None, np.array([True]), False, []
    while not done:
        action, state = agent.predict(obs, state, episode_start=start)
        start = np.array([False])
        times = state[0][0].plan_times  # the clocks ride first in the state
        rows.append((int(np.ravel_multi_index(tuple(action), nvec)), times))
        obs, _, term, trunc, _ = env.step(action)
        done = term or trunc
    return rows, names


def test_a_shield_plays_the_filters_entry_where_it_prices_the_policys_far_worse(tmp_path):
    """``shield_regret_s``: the entry the policy chose is replaced by the clock's filter's
    best wherever the filter's plan prices it more than the threshold above that best; at
    0 every decision with a plan plays an entry priced at the best, at a huge threshold
    none is replaced. The threshold and the filter's ``timing_sigma`` are saved with the
    policy."""
    env, cal = _filter_env(tmp_path)
    clock = {"reader": "mpc", "calibration": cal, "learn_decisions": 40, "timing_sigma": 0.25}
    agent = make_agent(
        "ppo", env, seed=0, probe=False, link_clock=clock, shield_regret_s=0.0, n_steps=16,
        batch_size=16,
    )  # fmt: skip
    assert agent._clock_filter.timing_sigma == 0.25
    assert agent.hyperparams["link_clock"] == clock
    assert agent.hyperparams["shield_regret_s"] == 0.0
    rows, _ = _shielded_episode(env, agent, 3)
    planned = [(k, t) for k, t in rows if t is not None]
    assert len(planned) >= len(rows) - 1  # only the opening decision is played without a plan
    assert all(t[k] == t.min() for k, t in planned)
    assert agent.shield_counts["decisions"] == len(planned)
    assert 0 < agent.shield_counts["overrides"] <= len(planned)  # an untrained policy errs
    # saved and loaded: the same threshold, the same filter, the same decisions
    path = agent.save(tmp_path / "ppo")
    loaded = load_agent(path, env=env)
    assert loaded.shield_regret_s == 0.0 and loaded._clock_filter.timing_sigma == 0.25
    again, _ = _shielded_episode(env, loaded, 3)
    assert [k for k, _ in again] == [k for k, _ in rows]
    # a threshold no plan reaches: the policy's own entries throughout
    loaded.shield_regret_s = 1e9
    loaded.shield_counts = {"decisions": 0, "overrides": 0}
    _shielded_episode(env, loaded, 3)
    assert loaded.shield_counts["overrides"] == 0 and loaded.shield_counts["decisions"] > 0


def test_a_shield_without_mpc_s_filter_or_with_a_bad_threshold_is_refused(env, tmp_path):
    with pytest.raises(ValueError, match=r"it needs link_clock: \{reader: mpc\}"):
        make_agent("ppo", env, shield_regret_s=1.0)
    with pytest.raises(ValueError, match=r"it needs link_clock: \{reader: mpc\}"):
        make_agent("ppo", env, link_clock=True, shield_regret_s=1.0)
    sim, cal = _filter_env(tmp_path)
    clock = {"reader": "mpc", "calibration": cal, "learn_decisions": 0}
    for bad in (-1.0, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="shield_regret_s must be a finite number >= 0"):
            make_agent("ppo", sim, probe=False, link_clock=clock, shield_regret_s=bad)
    for bad in (0, -0.1, float("inf"), False):
        with pytest.raises(
            ValueError, match=r"link_clock\.timing_sigma must be a finite number > 0"
        ):
            make_agent("ppo", sim, probe=False, link_clock={**clock, "timing_sigma": bad})
