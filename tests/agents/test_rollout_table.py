"""rollout-table: timing the conditions, and anticipating a switch to a ruinous one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from commgym.agents import load_agent, make_agent, rollout
from commgym.agents.rollout_table import condition_runs
from commgym.env.spaces import OBSERVATION_FIELDS
from tests.agents.synthetic import PhasedTableEnv

MENU = {"compression": ["none", "fp16", "int8"], "bucket_mb": [1.0, 25.0], "sync_period": [1, 4]}
DENSE, SAFE = (0, 0, 0), (2, 1, 1)
TARGET = 0.05
_ELAPSED = [f.name for f in OBSERVATION_FIELDS].index("elapsed_frac")


class FlakyTableEnv(PhasedTableEnv):
    """Fast phases (1 s, best: dense) alternate with slow ones (0.5 s, best: int8/H4).

    A dense or fp16 decision costs 3 s instead of 0.1 s when it meets a slow phase (starts
    in one, or one starts before it ends), as a dense all-reduce does on a slow link, and
    trains no more for it; the
    condition labels repeat (``fast``/``slow``), so how long each lasts can be learned.
    """

    def __init__(self, cycles: int = 20, **kw):
        bounds, t = [], 0.0
        for _ in range(cycles):
            bounds += [t + 1.0, t + 1.5]
            t += 1.5
        bests = [DENSE if k % 2 == 0 else SAFE for k in range(len(bounds) + 1)]
        super().__init__(
            bests=bests,
            boundaries=bounds,
            menu=MENU,
            episode_len=400,
            sharpness=2.0,
            target_loss=TARGET,
            time_budget_s=30.0,
            **kw,
        )

    def decision_time_s(self, action) -> float:
        t = getattr(self, "_train_time_s", 0.0)
        meets_slow = self.phase(t) % 2 == 1 or self.phase(t + 0.1) % 2 == 1
        return 3.0 if int(np.asarray(action)[0]) < 2 and meets_slow else 0.1

    def rate(self, action) -> float:
        # a ruinous decision trains the same steps as a normal one, in 30x the time
        return super().rate(action) * 0.1 / self.decision_time_s(action)

    def condition(self) -> str:
        return "slow" if self.phase(self._train_time_s) % 2 else "fast"

    @property
    def episode_phases(self):
        labels = ["fast" if k % 2 == 0 else "slow" for k in range(len(self.boundaries) + 1)]
        return [(0.0, labels[0])] + [(t, labels[k + 1]) for k, t in enumerate(self.boundaries)]


def test_condition_runs_time_each_condition_from_short_decisions_only():
    fast_slow = []
    for k in range(100):  # fast 4.0 s, slow 2.4 s, decisions of 0.2 s
        t = 0.2 * k
        fast_slow.append((t, 0.2, "fast" if t % 6.4 < 4.0 - 1e-9 else "slow"))
    runs = condition_runs(fast_slow, resolution_s=1.0)
    # each end of a timed run is within one decision (0.2 s) of its switch
    assert runs["fast"] == pytest.approx(4.0, abs=0.2 + 1e-9)
    assert runs["slow"] == pytest.approx(2.4, abs=0.2 + 1e-9)
    # a long decision could hide a switch and a switch back: no run through or after it
    hidden = [(0.0, 0.2, "fast"), (0.2, 12.0, "fast"), (12.2, 0.2, "slow"), (12.4, 0.2, "fast")]
    assert condition_runs(hidden, resolution_s=1.0) == {}
    # a run still going when the timeline ends, or one opened by a fork, does not count
    fork = [(0.0, 0.2, "fast"), (0.2, 0.2, "slow"), (0.4, 0.2, "slow"), (0.2, 0.2, "slow")]
    assert condition_runs(fork, resolution_s=1.0) == {"fast": pytest.approx(0.2)}
    with pytest.raises(ValueError, match="resolution_s"):
        make_agent("rollout-table", FlakyTableEnv(), resolution_s=0)


class LotteryTableEnv(PhasedTableEnv):
    """Each episode draws its link once (slow where ``seed % 3 == 2``), as ``link-lottery``.

    Costs as :class:`FlakyTableEnv`: a dense or fp16 decision on the slow link takes 3 s
    instead of 0.1 s and trains no more for it.
    """

    def __init__(self):
        super().__init__(
            bests=[DENSE, SAFE],
            boundaries=[],
            menu=MENU,
            episode_len=400,
            sharpness=2.0,
            target_loss=TARGET,
            time_budget_s=30.0,
        )
        self.slow = False

    def phase(self, t: float) -> int:
        return int(self.slow)

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.slow = seed % 3 == 2
        return super().reset(seed=seed, options=options)

    def decision_time_s(self, action) -> float:
        return 3.0 if int(np.asarray(action)[0]) < 2 and self.slow else 0.1

    def rate(self, action) -> float:
        return super().rate(action) * 0.1 / self.decision_time_s(action)

    def condition(self) -> str:
        return "slow" if self.slow else "fast"

    @property
    def episode_phases(self):
        return [(0.0, self.condition())]


def test_a_blind_first_decision_plays_safe_where_episodes_draw_their_condition():
    """The reset shows no link: the first decision must not be a dense one on a slow job."""
    env = LotteryTableEnv()
    # training seeds 10000-10002 draw fast, slow, fast: the dense entry opened most of them
    agent = make_agent("rollout-table", env, seed=0, episodes=3).learn()
    dense, safe = (str(env.menu.decode(np.asarray(a))) for a in (DENSE, SAFE))
    assert agent.table == {"fast": dense, "slow": safe}
    assert agent.safe == safe and agent.first == safe
    reactive = make_agent("rollout-table", env, seed=0, episodes=3, anticipate=False).learn()
    assert reactive.first == dense

    slow_seed, fast_seed = 1001, 1000
    ahead = rollout(env, agent, slow_seed, target_loss=TARGET)
    late = rollout(env, reactive, slow_seed, target_loss=TARGET)
    assert all(s.measured.train_time_s < 3.0 for s in ahead.steps)
    assert late.steps[0].measured.train_time_s == pytest.approx(3.0)
    assert {s.config for s in ahead.steps} == {safe}
    assert ahead.time_to_target_s < late.time_to_target_s
    fast = rollout(env, agent, fast_seed, target_loss=TARGET)
    assert fast.steps[0].config == safe  # one cheap decision before the probe shows the link
    assert {s.config for s in fast.steps[1:]} == {dense}


def test_anticipates_the_switch_that_a_reactive_table_meets_with_its_dense_entry(tmp_path):
    env = FlakyTableEnv()
    agent = make_agent("rollout-table", env, seed=0, episodes=2).learn()
    dense, safe = (str(env.menu.decode(np.asarray(a))) for a in (DENSE, SAFE))
    assert agent.table == {"fast": dense, "slow": safe}
    assert agent.safe == safe
    # every training episode opened on the fast link: the first decision is its entry
    assert agent.first == dense
    # the fast phases last 1 s (0.9 s from the first decision's start to the last one's)
    assert 0.9 - 1e-9 <= agent.dwell_s["fast"] <= 1.1 and 0.3 <= agent.dwell_s["slow"] <= 0.6
    assert agent.decision_s[dense]["slow"] == pytest.approx(3.0)
    reactive = make_agent("rollout-table", env, seed=0, episodes=2, anticipate=False)
    reactive._set_state(agent._get_state())

    seed = 7
    ahead = rollout(env, agent, seed, target_loss=TARGET)
    late = rollout(env, reactive, seed, target_loss=TARGET)
    assert ahead.time_to_target_s is not None
    # the reactive table plays its dense entry into every slow phase (3 s each time) ...
    assert sum(s.measured.train_time_s >= 3.0 for s in late.steps) >= 1
    # ... the anticipating one switches to the safe entry before the fast phase can end
    assert not any(s.measured.train_time_s >= 3.0 for s in ahead.steps)
    assert late.time_to_target_s is None or ahead.time_to_target_s < late.time_to_target_s
    fast_steps = [s for s in ahead.steps[1:] if s.condition == "fast"]
    assert {s.config for s in fast_steps} == {dense, safe}  # dense early, safe near the end

    back = load_agent(agent.save(tmp_path / "table.zip"), env=env)
    assert back.dwell_s == agent.dwell_s and back.safe == agent.safe
    assert back.decision_s == agent.decision_s and back.anticipate
    again = rollout(env, back, seed, target_loss=TARGET)
    assert [s.config for s in again.steps] == [s.config for s in ahead.steps]


def test_nothing_is_anticipated_where_every_entry_costs_the_same():
    """Equal decision costs: switching early buys nothing, so the table plays as learned."""
    env = FlakyTableEnv()
    env.decision_time_s = lambda action: 0.1
    agent = make_agent("rollout-table", env, seed=0, episodes=2).learn()
    assert math.isfinite(agent.dwell_s["fast"])
    ep = rollout(env, agent, 7, target_loss=TARGET)
    for step in ep.steps[1:]:
        if step.condition == ep.steps[step.decision - 2].condition:
            assert step.config == agent.table[step.condition]
