"""Behaviour cloning of the simulator's oracle (commgym.agents.imitation, SB3Agent.warm_start).

On the simulator of tests/env/test_sim.py (a two-phase link schedule, a synthetic
calibration): the expert replays the dynamic programme's schedule in the env to its time,
a warm-started PPO plays the expert's actions, and what cannot be cloned is refused.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from commgym.agents import DQNAgent, PPOAgent
from commgym.agents.imitation import SimScheduleExpert, oracle_demonstrations
from commgym.agents.rollout import rollout
from commgym.env.sim import SimEnv, adaptive_times, best_schedule, simulate
from tests.env.test_sim import _calibration, _env_cfg

SCHEDULE = {"schedule": [[0, "10gbit"], [4, "10mbit"], [6.4, "10gbit"]], "shift_s": 0.5}


def _env() -> SimEnv:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 10 Gbit/s is interpolated in this calibration
        return SimEnv(_calibration(), _env_cfg(network=SCHEDULE))


def _play(env: SimEnv, expert: SimScheduleExpert, seed: int) -> tuple[float, list[int]]:
    env.reset(seed=seed, options={"probe": False})
    played = []
    while True:
        a = expert(env)
        assert a is not None
        played.append(int(np.ravel_multi_index(tuple(a), tuple(env.menu.nvec))))
        _, _, term, trunc, info = env.step(a)
        if term or trunc:
            return info["train_time_s"], played


@pytest.mark.parametrize("lag", [0, 1])
def test_the_expert_plays_the_best_schedule_to_its_time(lag):
    env = _env()
    for seed in (1000, 1001):
        t, played = _play(env, SimScheduleExpert(lag), seed)
        best, plan = best_schedule(env.model, env.config, seed, reaction_lag=lag)
        assert best is not None and t == pytest.approx(best, rel=1e-12)
        assert simulate(env.model, env.config, seed, plan, reaction_lag=lag)[0] == pytest.approx(
            best, rel=1e-12
        )
        assert played[0] == plan[0][1]


def test_the_reactive_schedule_is_never_faster_than_the_anticipating_one():
    env = _env()
    for seed in range(1000, 1006):
        t0, _ = best_schedule(env.model, env.config, seed)
        t1, plan1 = best_schedule(env.model, env.config, seed, reaction_lag=1)
        assert t0 is not None and t1 is not None and t1 >= t0 - 1e-12
        # each entry the reactive schedule picks is the one of the phase it starts in
        assert [s for s, _ in plan1] == sorted(s for s, _ in plan1)
    # the reactive bound bench sim prints beside the anticipating one
    seeds = [1000, 1001]
    assert adaptive_times(env.model, env.config, seeds, reaction_lag=1) == [
        best_schedule(env.model, env.config, s, reaction_lag=1)[0] for s in seeds
    ]


LOTTERY = {"profiles": ["10mbit", "1gbit"]}  # one link per episode, drawn from its seed


def test_where_each_episode_draws_its_link_the_reactive_player_opens_blind():
    """A player that reads the link from its decisions plays the first one without it: one
    opening entry on every seed (the best: reactive_opening), then each seed's best entry."""
    from commgym.env.sim import reactive_opening

    # on this fixture topk/H2 is best on 10 Mbit/s, topk/H1 on 1 Gbit/s
    cfg = _env_cfg(network=LOTTERY, time_budget_s=120.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 1 Gbit/s is interpolated in this calibration
        env = SimEnv(_calibration(), cfg)
    model, seeds = env.model, list(range(1000, 1008))
    drawn = {env.reset(seed=s)[1]["network"] for s in seeds}
    assert drawn == {"10mbit", "1gbit"}  # both links among these seeds
    k, mean_s = reactive_opening(model, cfg, seeds)
    per_opening = []
    for j in range(len(model.entries)):
        ts = [best_schedule(model, cfg, s, reaction_lag=1, opening=j)[0] for s in seeds]
        per_opening.append(float(np.mean([cfg.time_budget_s if t is None else t for t in ts])))
    assert mean_s == pytest.approx(min(per_opening)) and per_opening[k] == mean_s
    assert max(per_opening) > mean_s  # the opening matters on this menu
    # never faster than the contextual oracle, which knows the link from the start
    assert mean_s >= float(np.mean(adaptive_times(model, cfg, seeds))) - 1e-12
    assert adaptive_times(model, cfg, seeds, reaction_lag=1) == [
        best_schedule(model, cfg, s, reaction_lag=1, opening=k)[0] for s in seeds
    ]
    for opening, first in (("best", k), ("topk:0.01/25MB/H2", 3)):
        expert = SimScheduleExpert(opening=opening)
        for seed in seeds[:3]:
            t, played = _play(env, expert, seed)
            best, plan = best_schedule(model, cfg, seed, reaction_lag=1, opening=first)
            assert played[0] == first and t == pytest.approx(best, rel=1e-12)
            assert simulate(model, cfg, seed, plan, reaction_lag=1, opening=first)[
                0
            ] == pytest.approx(best, rel=1e-12)
    # a link schedule's first link is the scenario's: "best" adds no blind opening there
    sched = _env()
    t, _ = _play(sched, SimScheduleExpert(opening="best"), 1000)
    assert t == pytest.approx(best_schedule(sched.model, sched.config, 1000, reaction_lag=1)[0])
    with pytest.raises(ValueError, match=r"opening 'fp16/25MB/H1' is not an entry.*valid: none/"):
        _play(env, SimScheduleExpert(opening="fp16/25MB/H1"), 1000)
    with pytest.raises(ValueError, match=r"opening must be a flat entry index in \[0, 4\)"):
        best_schedule(model, cfg, 1000, opening=4)


def test_warm_start_clones_the_expert_into_ppo_and_its_critic():
    env = _env()
    agent = PPOAgent(
        env, seed=0, n_steps=64, batch_size=32, n_epochs=1, history=2, normalize=True,
        probe=False,
    )  # fmt: skip
    expert = SimScheduleExpert()
    fit = agent.warm_start(expert, 12, epochs=60, batch_size=64)
    assert fit["episodes"] == 12 and fit["skipped"] == 0 and expert.missed == 0
    assert fit["accuracy"] >= 0.9, fit
    # the clone, acting alone on a training episode, plays what the expert plays
    ep = rollout(env, agent, 1000, target_loss=env.config.target_loss)
    _, expert_played = _play(env, SimScheduleExpert(), 1000)
    cloned = [st.config for st in ep.steps]
    want = [env.model.entries[k] for k in expert_played]
    n = min(len(cloned), len(want))
    agree = np.mean([a == b for a, b in zip(cloned[:n], want[:n], strict=True)])
    assert agree >= 0.8, (cloned, want)
    # RL continues from the clone (learn resets the env it left mid-episode) in the clone's
    # input scale: the normaliser's statistics are frozen
    mean = agent._norm.obs_rms.mean.copy()
    agent.learn(64)
    assert agent.model.num_timesteps >= 64
    np.testing.assert_array_equal(agent._norm.obs_rms.mean, mean)


def test_demonstrations_carry_discounted_returns_per_episode():
    env = _env()
    agent = PPOAgent(env, seed=0, n_steps=64, batch_size=32, probe=False)
    demos = oracle_demonstrations(agent.model.get_env(), SimScheduleExpert(), 2, gamma=0.5)
    assert demos.episodes == 2 and len(demos.actions) == len(demos.returns)
    assert demos.observations.shape == (len(demos.actions), env.observation_space.shape[0])
    # time_to_target rewards are negative training times: every return is negative, and the
    # last decision of an episode returns its own reward only
    assert (demos.returns < 0).all()
    # noise injection: random entries played, the expert's actions still the labels
    expert, advice = SimScheduleExpert(), []

    def advising(env):
        a = expert(env)
        advice.append(tuple(a))
        return a

    venv = agent.model.get_env()
    noisy = oracle_demonstrations(venv, advising, 3, gamma=0.5, explore=0.5, seed=3)
    assert [tuple(a) for a in noisy.actions] == advice  # labels: the expert's, every one
    with pytest.raises(ValueError, match="explore"):
        oracle_demonstrations(agent.model.get_env(), SimScheduleExpert(), 1, gamma=0.5, explore=1.0)


def test_a_dagger_round_plays_the_learner_and_labels_with_the_expert():
    """DAgger (Ross et al. 2011): the learner plays, the expert (asked at every decision,
    whoever plays) labels; warm_start's rounds add those states to the clone's set."""
    env = _env()
    agent = PPOAgent(env, seed=0, n_steps=64, batch_size=32, probe=False)
    venv = agent.model.get_env()
    sim = venv.get_attr("unwrapped")[0]
    fixed = np.array([[0, 0, 0]])  # the learner: the menu's first entry everywhere
    expert, advice, played = SimScheduleExpert(), [], []

    def advising(env):
        if env.decisions > 0:
            played.append(env._prev_k)  # the entry the last decision ran
        a = expert(env)
        advice.append(tuple(a))
        return a

    def learner(obs):
        assert obs.shape == (1, env.observation_space.shape[0])
        return fixed

    demos = oracle_demonstrations(venv, advising, 2, gamma=0.5, learner=learner)
    assert demos.episodes == 2
    assert [tuple(a) for a in demos.actions] == advice  # labels: the expert's
    assert any(tuple(a) != (0, 0, 0) for a in demos.actions)  # ...not the learner's entry
    assert played and set(played) == {0}  # what ran: the learner's entry, every decision
    assert sim is venv.get_attr("unwrapped")[0]

    clone = PPOAgent(
        env, seed=0, n_steps=64, batch_size=32, n_epochs=1, history=2, normalize=True,
        probe=False,
    )  # fmt: skip
    fit = clone.warm_start(SimScheduleExpert(), 6, epochs=40, batch_size=64, dagger_rounds=2)
    assert fit["episodes"] == 18 and 0.0 <= fit["dagger_agreement"] <= 1.0
    assert fit["accuracy"] >= 0.85, fit
    with pytest.raises(ValueError, match="dagger_rounds"):
        clone.warm_start(SimScheduleExpert(), 1, dagger_rounds=-1)


def test_cost_weighted_cloning_follows_the_label_whose_miss_costs_most():
    """``regret_scale_s``: one observation, labelled half A, half B; missing A costs 10 s,
    missing B 10 ms. The 0/1 loss has no reason to prefer either; weighted by the regret of
    what the clone plays, it learns A (AggreVaTe's cost-to-go, the expert's model as cost)."""
    from commgym.agents.imitation import AgentExpert, Demonstrations

    env = _env()
    agent = PPOAgent(env, seed=0, n_steps=64, batch_size=32, probe=False)
    d = env.observation_space.shape[0]
    nvec = tuple(int(v) for v in env.menu.nvec)
    k_a, k_b = 0, int(np.prod(nvec)) - 1
    a, b = np.unravel_index(k_a, nvec), np.unravel_index(k_b, nvec)
    n = 256
    regret = np.zeros((n, int(np.prod(nvec))))
    regret[: n // 2, k_b] = 10.0  # labelled A: playing B there costs 10 s
    regret[n // 2 :, k_a] = 0.01  # labelled B: playing A there costs 10 ms
    demos = Demonstrations(
        observations=np.zeros((n, d), dtype=np.float32),
        actions=np.array([a] * (n // 2) + [b] * (n // 2), dtype=np.int64),
        returns=np.zeros(n, dtype=np.float32), episodes=1, skipped=0, regret_s=regret,
    )  # fmt: skip
    agent.behaviour_clone(demos, epochs=30, batch_size=64, regret_scale_s=0.1)
    assert agent._clone_actions(demos.observations[:1]).tolist() == [list(a)]
    # the opposite costs (missing B costs 10 s) teach the opposite label
    swapped = np.zeros_like(regret)
    swapped[: n // 2, k_b] = 0.01
    swapped[n // 2 :, k_a] = 10.0
    demos.regret_s = swapped
    other = PPOAgent(env, seed=0, n_steps=64, batch_size=32, probe=False)
    other.behaviour_clone(demos, epochs=30, batch_size=64, regret_scale_s=0.1)
    assert other._clone_actions(demos.observations[:1]).tolist() == [list(b)]
    with pytest.raises(ValueError, match="regret_scale_s must be > 0"):
        agent.behaviour_clone(demos, regret_scale_s=0.0)
    demos.regret_s = None
    with pytest.raises(ValueError, match="hold none"):
        agent.behaviour_clone(demos, regret_scale_s=0.1)

    class Priced:  # an agent that prices every entry, as mpc does
        plan_times = np.array([3.0, 1.0, 2.0])

        def predict(self, obs, state, episode_start, deterministic):
            return np.array([0, 0, 1]), state

    expert = AgentExpert(Priced())
    env.reset(seed=1, options={"probe": False})
    expert(env)
    np.testing.assert_array_equal(expert.last_regret_s, [2.0, 0.0, 1.0])


def test_what_cannot_be_cloned_is_refused():
    env = _env()
    with pytest.raises(ValueError, match="actor-critic"):
        DQNAgent(env, seed=0).warm_start(SimScheduleExpert(), 1)
    with pytest.raises(TypeError, match="simulator"):
        SimScheduleExpert()(object())
    with pytest.raises(ValueError, match="reaction_lag"):
        SimScheduleExpert(2)
    with pytest.raises(ValueError, match="episodes"):
        PPOAgent(env, seed=0, n_steps=64, batch_size=32).warm_start(SimScheduleExpert(), 0)
    with pytest.raises(ValueError, match="one of reset_seed and episode_seed"):
        best_schedule(env.model, env.config, 1000, episode_seed=5)
