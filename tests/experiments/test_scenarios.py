"""Every shipped leaderboard scenario loads and runs 2 real decisions; seeded schedule shifts."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest

import commgym.env  # noqa: F401 - registers the env
from commgym.agents import make_agent
from commgym.env.net import NetworkSchedule, NetworkSpec, netem_available
from commgym.experiments.config import load_run_config
from commgym.experiments.leaderboard import DEFAULT_SCENARIOS

ok, why = netem_available()


@pytest.mark.parametrize("scenario", DEFAULT_SCENARIOS)
def test_scenario_runs_two_decisions(scenario):
    # one iteration a decision: the scenario's links, menu and target are what is checked,
    # not its decision length (8 iterations of the dense all-reduce on a shaped link)
    cfg = load_run_config(scenario, {"env.max_decisions": 2, "env.steps_per_decision": 1})
    env_cfg = cfg.env_config
    assert env_cfg.target_loss is not None and env_cfg.reward == "time_to_target"
    if env_cfg.network is not None and not ok:
        pytest.skip(f"network emulation unavailable here: {why}")
    # rate-only specs: these scenarios run on a kernel without sch_netem
    specs = list(env_cfg.network_plan.specs)
    assert all(not s.has_impairments for s in specs), specs
    env = gym.make("commgym/AllReduce-v1", config=env_cfg)
    try:
        agent = make_agent("static:ddp-default", env)
        obs, info = env.reset(seed=cfg.eval_seed)
        steps = 0
        done = False
        while not done:
            action, _ = agent.predict(obs)
            obs, reward, terminated, truncated, info = env.step(action)
            done = terminated or truncated
            steps += 1
            assert math.isfinite(reward) and reward < 0  # -dt / budget
            assert info["measured"]["bytes_per_step"] > 0
            if specs:
                assert NetworkSpec.parse(info["network"]) in specs
        assert steps == 2 and info["reason"] in ("max_decisions", "target_reached")
    finally:
        env.close()


def test_schedule_shift_is_seeded_bounded_and_ordered():
    sched = NetworkSchedule.parse([(0, "1gbit"), (4, "100mbit"), (10, "1gbit")], shift_s=1.5)
    a, b = sched.for_episode(7), sched.for_episode(7)
    assert a == b and a.shift_s == 0  # same seed, same times
    times = {tuple(t for t, _ in sched.for_episode(s)) for s in range(50)}
    assert len(times) > 40  # the switch times really move between episodes
    for ts in times:
        assert ts[0] == 0 and abs(ts[1] - 4) <= 1.5 and abs(ts[2] - 10) <= 1.5
        assert ts[0] < ts[1] < ts[2]
    assert [str(s) for _, s in a] == ["1gbit", "100mbit", "1gbit"]
    assert NetworkSchedule.parse([(0, "1gbit"), (4, "100mbit")]).for_episode(3).entries[1][0] == 4


@pytest.mark.parametrize("shift", [-1.0, 3.0, "1"])
def test_schedule_shift_rejects_bad_values(shift):
    with pytest.raises(ValueError, match="shift_s"):
        NetworkSchedule.parse([(0, "1gbit"), (4, "100mbit"), (10, "1gbit")], shift_s=shift)


def test_env_config_takes_schedule_with_shift_and_names_the_valid_forms():
    from commgym.env import EnvConfig

    cfg = EnvConfig(network={"schedule": [[0, "1gbit"], [4, "100mbit"]], "shift_s": 1.0})
    plan = cfg.network_plan
    assert plan.kind == "schedule" and plan.schedule.shift_s == 1.0
    with pytest.raises(ValueError, match="shift_s"):
        EnvConfig(network={"profiles": ["1gbit"], "shift_s": 1.0})


def test_link_lottery_seeds_draw_the_links_its_file_states():
    """The scenario's comment says which link each training and evaluation seed draws."""
    from gymnasium.utils import seeding

    from commgym.agents.rollout_table import training_seeds
    from commgym.env.schedule import episode_seed

    cfg = load_run_config("link-lottery", {})
    plan = cfg.env_config.network_plan

    def link(seed: int) -> str:
        # the envs' reset: reset(seed=s) seeds np_random, then one episode seed is drawn
        return str(plan.for_episode(episode_seed(seeding.np_random(seed)[0])).spec_at(0.0))

    train = training_seeds(cfg.seed, cfg.agent_kwargs["rollout-table"]["episodes"])
    assert [link(s) for s in train] == ["10gbit", "10gbit", "10mbit"]
    evaluation = [cfg.eval_seed + i for i in range(6)]
    assert [link(s) for s in evaluation] == ["10mbit", "10gbit", "10mbit"] + ["10gbit"] * 3
