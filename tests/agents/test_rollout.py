"""The one rollout: its record, continuing from a state, stopping early, plain data."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from commgym.agents import Episode, make_agent, rollout
from tests.agents.synthetic import TimedTableEnv

TARGET, BUDGET_S, DECISIONS = 0.5, 100.0, 40


def _env():
    return TimedTableEnv(episode_len=DECISIONS, target_loss=TARGET, time_budget_s=BUDGET_S)


def test_record_matches_the_episode_step_by_step():
    env = _env()
    agent = make_agent("static:int8/4MB/H4", env)
    seen = []
    ep = rollout(env, agent, 1, target_loss=TARGET, on_step=seen.append)
    assert ep.reason == "target_reached" and ep.seed == 1
    assert ep.decisions == len(ep.steps) == len(seen) == env.steps_total
    assert [s["timestep"] for s in seen] == list(range(1, ep.decisions + 1))
    assert ep.train_time_s == pytest.approx(seen[-1]["info"]["train_time_s"])
    assert ep.time_to_target_s == pytest.approx(ep.train_time_s)  # ended at the target
    assert ep.episode_return == pytest.approx(sum(s["reward"] for s in seen))
    assert ep.final_eval_loss == pytest.approx(ep.steps[-1].measured.eval_loss)
    assert ep.final_eval_loss <= TARGET
    assert all(s.config == "int8/4MB/H4" and s.action == (2, 1, 2) for s in ep.steps)
    row = ep.rows[0]
    assert row["decision"] == 1 and math.isnan(row["link_rate_gbps"])  # unshaped
    assert row["bytes_total"] == ep.steps[0].measured.bytes_total


def test_stop_then_continue_from_the_state_without_reset():
    env = _env()
    slow, fast = make_agent("static:none/1MB/H1", env), make_agent("static:int8/4MB/H4", env)
    whole = rollout(_env(), slow, 0, target_loss=TARGET)
    first = rollout(env, slow, 0, target_loss=TARGET, max_train_time_s=0.5)
    assert first.reason is None and 0.5 <= first.train_time_s < whole.train_time_s
    assert first.time_to_target_s is None
    steps_before = env.steps_total
    rest = rollout(env, fast, start=(first.final_obs, first.final_info), target_loss=TARGET)
    assert rest.seed is None and rest.reason == "target_reached"
    assert env.steps_total == steps_before + rest.decisions  # no reset, no extra step
    assert rest.steps[0].train_time_s > first.train_time_s  # the episode's own clock goes on
    assert rest.time_to_target_s == pytest.approx(rest.train_time_s)
    assert rest.steps[-1].config == "int8/4MB/H4"


def test_stop_predicate_and_on_step_false_end_after_that_step():
    env = _env()
    agent = make_agent("static:none/1MB/H1", env)
    ep = rollout(env, agent, 0, stop=lambda step: step.decision == 3)
    assert ep.decisions == 3 and ep.reason is None
    ep = rollout(env, agent, 0, on_step=lambda step: step["timestep"] < 2)
    assert ep.decisions == 2 and ep.reason is None


def test_episode_is_plain_data():
    env = _env()
    ep = rollout(env, make_agent("static:fp16/4MB/H4", env), 2, target_loss=TARGET)
    again = pickle.loads(pickle.dumps(ep))
    assert again == ep and again.rows == ep.rows
    loaded = Episode.from_dict(ep.to_dict())
    assert loaded == ep and loaded.steps == ()  # steps are not persisted
    np.testing.assert_array_equal(again.final_obs, ep.final_obs)
