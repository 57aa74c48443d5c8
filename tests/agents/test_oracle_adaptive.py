"""oracle-adaptive: the best schedule in hindsight over phases, or per condition."""

from __future__ import annotations

import math

import numpy as np
import pytest

import commgym.env
from commgym.agents import (
    OracleAdaptiveAgent,
    OracleStaticAgent,
    ScheduleAgent,
    load_agent,
    make_agent,
    rollout,
)
from tests.agents.synthetic import PhasedTableEnv

MENU = {"compression": ["none", "fp16", "int8"], "bucket_mb": [1.0, 25.0], "sync_period": [1, 4]}
BESTS = [(0, 0, 0), (2, 1, 1)]  # phase 0 favours none/1MB/H1, phase 1 int8/25MB/H4
SEEDS = [0, 1]
L0, TARGET, DT = 2.0, 0.05, 0.1


def _env(bests=BESTS, boundaries=(1.05,), **kw):
    return PhasedTableEnv(
        bests=bests,
        boundaries=list(boundaries),
        menu=MENU,
        episode_len=200,
        sharpness=2.0,
        target_loss=TARGET,
        time_budget_s=50.0,
        **kw,
    )


def _entry(env, a) -> str:
    return str(env.menu.decode(np.asarray(a)))


def _time_to_target(env, per_phase_action, seed) -> float:
    """By hand: decisions of DT seconds until log(L0 / TARGET) of progress is made."""
    speed = 1.0 + 0.1 * (seed % 3)
    need, t, done = math.log(L0 / TARGET), 0.0, 0.0
    while done < need:
        k = env.phase(t)
        env.best = env.bests[k]
        done += math.exp(env.sharpness * (env.table(per_phase_action[k]) - 1.0)) * speed * DT
        t += DT
    return t


def test_finds_each_phase_best_and_beats_the_best_static_entry():
    env = _env()
    static = OracleStaticAgent(env, seeds=SEEDS).learn()
    oracle = make_agent("oracle-adaptive", env, seeds=SEEDS, static=static)
    assert isinstance(oracle, OracleAdaptiveAgent) and oracle.oracle
    steps = []
    oracle.learn(callback=lambda s: steps.append(s) or True)
    assert steps and oracle.search_decisions == len(steps)
    assert oracle.search_cost_s >= 0 and oracle.search_train_time_s > 0
    best_static = static.ranking[0]
    for s in SEEDS:
        sched = oracle.schedules[s]
        assert sched.mode == "phases"
        assert sched.schedule == [(0.0, _entry(env, BESTS[0])), (1.05, _entry(env, BESTS[1]))]
        # the base entry was tried first in every phase
        assert all(p.tried[0][0] == best_static.config for p in sched.phases)
        # re-running the schedule reproduces the hand computation (noise-free env)
        ep = rollout(env, oracle.for_seed(s), s, target_loss=TARGET)
        expected = _time_to_target(env, BESTS, s)
        assert ep.time_to_target_s == pytest.approx(expected)
        assert sched.search.time_to_target_s == pytest.approx(expected)
        assert ep.time_to_target_s < best_static.times_to_target_s[SEEDS.index(s)]


def test_is_not_a_policy_and_round_trips(tmp_path):
    env = _env()
    oracle = OracleAdaptiveAgent(env, seeds=SEEDS)  # runs oracle-static itself
    with pytest.raises(RuntimeError, match="for_seed"):
        oracle.predict(env.reset(seed=0)[0])
    oracle.learn()
    assert oracle.static.ranking and oracle.search_decisions > oracle.static.search_decisions
    with pytest.raises(KeyError, match="searched"):
        oracle.for_seed(7)
    path = oracle.save(tmp_path / "oracle.zip")
    back = load_agent(path, env=env)
    assert isinstance(back, OracleAdaptiveAgent)
    assert {s: v.schedule for s, v in back.schedules.items()} == {
        s: v.schedule for s, v in oracle.schedules.items()
    }
    assert back.base == oracle.base


def test_conditions_drawn_per_episode_get_the_best_entry_per_condition():
    class ContextEnv(PhasedTableEnv):
        """One phase per episode; the seed's parity picks the condition (its bowl)."""

        cond = 0

        def reset(self, *, seed=None, options=None):
            if seed is not None:
                self.cond = seed % 2
            return super().reset(seed=seed, options=options)

        def phase(self, t):
            return self.cond

        @property
        def episode_phases(self):
            return [(0.0, f"condition {self.cond}")]

    env = ContextEnv(
        bests=BESTS, boundaries=[], menu=MENU, episode_len=200, sharpness=2.0,
        target_loss=TARGET, time_budget_s=50.0,
    )  # fmt: skip
    seeds = [0, 1, 2, 3]
    oracle = OracleAdaptiveAgent(env, seeds=seeds).learn()
    for s in seeds:
        sched = oracle.schedules[s]
        assert sched.mode == "context"
        assert sched.schedule == [(0.0, _entry(env, BESTS[s % 2]))]
        assert sched.phases[0].condition == f"condition {s % 2}"
    # per condition, no static entry is faster on that condition's seeds
    for cond in (0, 1):
        group = [s for s in seeds if s % 2 == cond]
        chosen = oracle.schedules[group[0]].phases[0].entry
        by_entry = {
            row.config: np.mean(
                [
                    50.0 if t is None else t
                    for t in (row.times_to_target_s[seeds.index(s)] for s in group)
                ]
            )
            for row in oracle.static.ranking
        }
        assert by_entry[chosen] == min(by_entry.values())


def test_schedule_agent_follows_training_time_and_rejects_bad_schedules():
    env = _env()
    agent = ScheduleAgent(env, [(0.0, "none/1MB/H1"), (0.35, "int8/25MB/H4")])
    ep = rollout(env, agent, 0, target_loss=TARGET)
    configs = [(s.train_time_s, s.config) for s in ep.steps]
    # a decision starting before 0.35 s plays the first entry, from 0.35 s on the second
    assert [c for t, c in configs[:4]] == ["none/1MB/H1"] * 4
    assert {c for _, c in configs[4:]} == {"int8/25MB/H4"}
    for bad in ([], [(0.5, "none/1MB/H1")], [(0.0, "none/1MB/H1"), (0.0, "int8/25MB/H4")]):
        with pytest.raises(ValueError, match="schedule"):
            ScheduleAgent(env, bad)
    with pytest.raises(ValueError):
        ScheduleAgent(env, [(0.0, "int4/1MB/H1")])  # off the menu


def test_needs_a_forkable_env():
    from tests.agents.synthetic import TimedTableEnv

    agent = OracleAdaptiveAgent(TimedTableEnv(target_loss=TARGET), seeds=SEEDS)
    with pytest.raises(TypeError, match="snapshot"):  # before any static search is spent
        agent.learn()
    assert not agent.static.ranking
    with pytest.raises(ValueError, match="total_timesteps"):
        OracleAdaptiveAgent(_env(), seeds=SEEDS).learn(100)


def test_real_ranks_straggler_phases():
    """A straggler schedule gives real episodes two phases; the search forks real ranks."""
    env = commgym.env.AllReduceEnv(
        workload="mlp-digits",
        world_size=2,
        steps_per_decision=4,
        time_budget_s=3.0,
        reward="time_to_target",
        target_loss=0.5,
        stragglers=[[0, "off"], [0.15, "30ms"]],
        action_menu={"compression": ["none"], "bucket_mb": [25.0], "sync_period": [1, 4]},
    )
    try:
        oracle = OracleAdaptiveAgent(env, seeds=[1000]).learn()
        sched = oracle.schedules[1000]
        assert sched.mode == "phases"
        assert [p.condition for p in sched.phases][:1] == ["loopback, stragglers off"]
        assert all(p.entry in ("none/25MB/H1", "none/25MB/H4") for p in sched.phases)
        ep = rollout(env, oracle.for_seed(1000), 1000, target_loss=0.5)
        assert ep.decisions > 0 and ep.reason in ("target_reached", "time_budget")
    finally:
        env.close()


def test_rollout_table_learns_the_phase_winners_on_training_seeds_and_recognises_them(tmp_path):
    """The learned counterpart: the table from training seeds, conditions from the probe."""
    from commgym.agents import RolloutTableAgent
    from commgym.agents.rollout_table import training_seeds

    env = _env()
    agent = make_agent("rollout-table", env, seed=0, episodes=2)
    assert isinstance(agent, RolloutTableAgent) and agent.learned and not agent.oracle
    with pytest.raises(RuntimeError, match="learn"):
        agent.predict(env.reset(seed=0)[0])
    agent.learn()
    assert not set(training_seeds(0, 2)) & {1000, 1001, 1002}
    assert agent.table == {"phase 0": _entry(env, BESTS[0]), "phase 1": _entry(env, BESTS[1])}
    assert agent.first == _entry(env, BESTS[0]) and agent.cost_decisions > 0
    # on an unseen seed it plays each phase's winner, recognising the phase from the probe
    ep = rollout(env, agent, 7, target_loss=TARGET)
    for step in ep.steps[1:]:  # the observation lags one decision: skip the one after a switch
        if step.condition == ep.steps[step.decision - 2].condition:
            winner = BESTS[int(step.condition.split()[-1])]
            assert step.config == _entry(env, winner)
    assert ep.time_to_target_s <= _time_to_target(env, BESTS, 7) + 2 * DT
    back = load_agent(agent.save(tmp_path / "table.zip"), env=env)
    assert back.table == agent.table and back.centres == agent.centres


def test_rerun_past_the_searched_phases_plays_by_condition():
    """A re-run slower than its search must not run its last entry into later phases."""
    from dataclasses import replace

    from commgym.agents.oracle_adaptive import PhaseChoice

    env = _env(bests=[*BESTS, BESTS[0], BESTS[1]], boundaries=(1.05, 2.1, 3.15))
    static = OracleStaticAgent(env, seeds=SEEDS).learn()
    oracle = OracleAdaptiveAgent(env, seeds=SEEDS, static=static).learn()
    sched = oracle.schedules[SEEDS[0]]
    # the search records every phase of the episode, searched or not
    env.reset(seed=SEEDS[0])
    assert list(sched.conditions) == env.episode_phases
    # as if the search had needed two phases of a link that alternates fast/slow
    fast, slow = _entry(env, BESTS[0]), _entry(env, BESTS[1])
    oracle.schedules[SEEDS[0]] = replace(
        sched,
        phases=(PhaseChoice(0.0, "fast", fast), PhaseChoice(1.05, "slow", slow)),
        conditions=((0.0, "fast"), (1.05, "slow"), (2.1, "fast"), (3.15, "slow"), (4.2, "new")),
    )
    assert oracle.full_schedule(SEEDS[0]) == [
        (0.0, fast), (1.05, slow), (2.1, fast), (3.15, slow), (4.2, oracle.base),
    ]  # fmt: skip
    assert oracle.searched_until_s(SEEDS[0]) == pytest.approx(2.1)
    player = oracle.for_seed(SEEDS[0])
    assert player.schedule == oracle.full_schedule(SEEDS[0])
    # a schedule whose search covered every phase has nothing past it
    oracle.schedules[SEEDS[1]] = replace(
        oracle.schedules[SEEDS[1]], conditions=((0.0, "fast"),),
        phases=(PhaseChoice(0.0, "fast", fast),),
    )  # fmt: skip
    assert oracle.searched_until_s(SEEDS[1]) == math.inf
    assert oracle.full_schedule(SEEDS[1]) == [(0.0, fast)]


def test_search_every_s_finds_a_switch_where_the_condition_never_changes():
    """The best entry changes at 1.65 s while the env reports one condition throughout
    (as where it depends on the remaining loss, not the link): only a search grid finds it."""

    class HiddenEnv(PhasedTableEnv):
        @property
        def episode_phases(self):
            return [(0.0, "one link")]

    env = HiddenEnv(
        bests=BESTS, boundaries=[1.65], menu=MENU, episode_len=200, sharpness=2.0,
        target_loss=TARGET, time_budget_s=49.5,
    )  # fmt: skip
    static = OracleStaticAgent(env, seeds=SEEDS).learn()
    plain = OracleAdaptiveAgent(env, seeds=SEEDS, static=static).learn()
    assert {plain.schedules[s].mode for s in SEEDS} == {"context"}  # one entry per seed
    grid = OracleAdaptiveAgent(env, seeds=SEEDS, static=static, search_every_s=0.55)
    decided: list[float] = []
    grid.learn(on_phase=decided.append)
    # the progress hook counts every search phase of every seed once (49.5 s / 0.55 s each),
    # those after the target at once
    assert sum(decided) == 2 * 90 and len(decided) < 2 * 90
    first, second = _entry(env, BESTS[0]), _entry(env, BESTS[1])
    for s in SEEDS:
        sched = grid.schedules[s]
        assert sched.mode == "phases"
        starts = [t for t, _ in sched.conditions[:4]]
        assert starts == pytest.approx([0.0, 0.55, 1.1, 1.65])
        assert {c for _, c in sched.conditions} == {"one link"}
        assert [e for _, e in sched.schedule[:4]] == [first, first, first, second]
        ep = rollout(env, grid.for_seed(s), s, target_loss=TARGET)
        assert ep.time_to_target_s == pytest.approx(_time_to_target(env, BESTS, s))
        assert ep.time_to_target_s < static.ranking[0].times_to_target_s[SEEDS.index(s)]
    # past its searched phases a re-run keeps the entry chosen last for the condition
    assert grid.full_schedule(SEEDS[0])[-1][1] == second


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, True, "3"])
def test_search_every_s_must_be_a_positive_number(bad):
    with pytest.raises(ValueError, match="search_every_s"):
        OracleAdaptiveAgent(_env(), seeds=SEEDS, search_every_s=bad)


def test_split_phases_keeps_each_condition_and_its_boundaries():
    from commgym.env.schedule import split_phases

    phases = [(0.0, "fast"), (4.0, "slow"), (5.0, "fast")]
    assert split_phases(phases, None, 10.0) == phases
    assert split_phases(phases, 2.0, 10.0) == [
        (0.0, "fast"), (2.0, "fast"), (4.0, "slow"), (5.0, "fast"), (5.0 + 5 / 3, "fast"),
        (5.0 + 10 / 3, "fast"),
    ]  # fmt: skip


def test_planned_phases_are_the_reset_episodes_phases_on_the_grid():
    """The evaluation's progress total, read from the config, matches what a reset resolves."""
    import warnings

    from commgym.env.schedule import split_phases
    from commgym.env.sim import SimEnv
    from commgym.experiments.config import load_run_config
    from tests.env.test_sim import _calibration

    cfg = load_run_config("flaky-link").env_config
    cfg = type(cfg)(**{**cfg.to_dict(), "action_menu": _calibration().menu})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = SimEnv(_calibration(), cfg)
    for every_s in (None, 2.0):
        oracle = OracleAdaptiveAgent(env, seeds=[1000, 1001, 1002], search_every_s=every_s)
        total = 0
        for s in oracle.seeds:
            env.reset(seed=s)
            total += len(split_phases(env.episode_phases, every_s, cfg.time_budget_s))
        assert oracle.planned_phases() == total
    assert total > 3 * 10  # flaky-link's ten link phases per seed, split every 2 s
