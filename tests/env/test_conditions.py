"""Scenario conditions: label-skewed shards, straggler jitter, condition schedules, forks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

import commgym.env  # noqa: F401 - registers the env
from commgym.env import AllReduceEnv, EnvConfig
from commgym.env.schedule import Condition, Phases
from commgym.env.stragglers import StragglerDraw, StragglerSpec
from commgym.env.workloads.shards import parse_shards, shard_indices

LABELS = torch.arange(1000) % 10  # 10 balanced classes


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("shards", ["iid", "label-skew", "label-skew:0.5", "label-skew:0"])
def test_shards_partition_the_training_set(world, shards):
    parts = [shard_indices(LABELS, r, world, seed=7, shards=shards) for r in range(world)]
    joined = torch.cat(parts)
    assert sorted(joined.tolist()) == list(range(len(LABELS)))  # disjoint and complete
    # every rank computes the same assignment: recomputing gives the same part
    assert torch.equal(parts[0], shard_indices(LABELS, 0, world, seed=7, shards=shards))


def test_iid_shards_are_the_round_robin_deal_of_one_permutation():
    perm = torch.randperm(len(LABELS), generator=torch.Generator().manual_seed(3))
    assert torch.equal(shard_indices(LABELS, 1, 4, seed=3), perm[1::4])


def test_label_skew_concentrates_classes_per_rank():
    def classes_per_rank(shards):
        return [
            len(set(LABELS[shard_indices(LABELS, r, 4, seed=1, shards=shards)].tolist()))
            for r in range(4)
        ]

    assert classes_per_rank("iid") == [10] * 4
    # sorted into 4 blocks of 250 samples: 2-3 classes each (a block edge splits a class)
    assert all(2 <= n <= 4 for n in classes_per_rank("label-skew"))
    # half the samples move to a random rank: every class reaches every rank again
    assert classes_per_rank("label-skew:0.5") == [10] * 4
    # the fraction that stays: ~f + (1 - f) / W of a rank's samples are its block's
    mine = shard_indices(LABELS, 0, 4, seed=1, shards="label-skew:0.5")
    own_block = (LABELS[mine] <= 2).float().mean().item()
    assert 0.5 < own_block < 0.8


@pytest.mark.parametrize("bad", ["noniid", "label-skew:1.5", "label-skew:x", "", 3])
def test_bad_shards_name_the_valid_forms(bad):
    with pytest.raises(ValueError, match="label-skew"):
        parse_shards(bad)
    with pytest.raises(ValueError, match="label-skew"):
        EnvConfig(shards=bad)


def test_straggler_specs_parse_and_print():
    assert StragglerSpec.parse("40ms") == StragglerSpec(0.04, 1.0)
    assert StragglerSpec.parse("0.1s:p=0.25") == StragglerSpec(0.1, 0.25)
    assert StragglerSpec.parse("500us").delay_s == pytest.approx(5e-4)
    assert not StragglerSpec.parse("off").active and not StragglerSpec.parse(None).active
    for text in ("40ms", "40ms:p=0.5", "500us", "off"):
        assert str(StragglerSpec.parse(text)) == text
    for bad in ("fast", "40", "40ms:q=1", "40ms:p=2", "-1ms", "120s"):
        with pytest.raises(ValueError, match="straggler"):
            StragglerSpec.parse(bad)


def test_unquoted_off_in_a_scenario_file_is_off():
    # PyYAML reads `off` as False (YAML 1.1); a scenario file writes it unquoted
    doc = yaml.safe_load("fixed: off\nsched: {schedule: [[0, off], [5, 20ms]]}\nbad: on\n")
    assert doc["fixed"] is False
    fixed = Condition.parse(doc["fixed"], StragglerSpec.parse, "stragglers")
    assert fixed.for_episode(1) == Phases(((0.0, StragglerSpec()),))
    sched = Condition.parse(doc["sched"], StragglerSpec.parse, "stragglers")
    assert sched.for_episode(1) == Phases(((0.0, StragglerSpec()), (5.0, StragglerSpec(0.02))))
    with pytest.raises(ValueError, match=r"straggler spec must be .* got True"):
        StragglerSpec.parse(doc["bad"])


def test_straggler_draws_agree_across_ranks_and_pick_one_rank():
    spec = StragglerSpec(0.05, 0.5)
    draws = [StragglerDraw(11, 4) for _ in range(4)]  # one per rank, same episode seed
    late = []
    for _ in range(400):
        delays = [d.delay_s(rank, spec) for rank, d in enumerate(draws)]
        assert sum(x > 0 for x in delays) <= 1  # at most one straggler per iteration
        late.append(next((r for r, x in enumerate(delays) if x), None))
    hits = [r for r in late if r is not None]
    assert 150 < len(hits) < 250  # p = 0.5
    assert set(hits) == {0, 1, 2, 3}  # any rank can be the late one
    off = StragglerDraw(11, 4)
    assert all(off.delay_s(0, StragglerSpec()) == 0 for _ in range(50))


def test_conditions_parse_in_three_forms_and_shift_per_episode():
    parse = StragglerSpec.parse
    fixed = Condition.parse("20ms", parse, "stragglers")
    assert fixed.for_episode(1) == Phases(((0.0, StragglerSpec(0.02)),))
    sched = Condition.parse(
        {"schedule": [[0, "off"], [5, "20ms"], [10, "off"]], "shift_s": 1}, parse, "stragglers"
    )
    a, b = sched.for_episode(1), sched.for_episode(2)
    assert a == sched.for_episode(1) and a != b  # seeded shifts
    assert all(abs(x - y) <= 1 for x, y in zip(a.boundaries, (5, 10), strict=True))
    assert a.value_at(0) == StragglerSpec() and a.value_at(7.5) == StragglerSpec(0.02)
    prof = Condition.parse({"profiles": ["off", "20ms"]}, parse, "stragglers")
    drawn = {str(prof.for_episode(s).value_at(0)) for s in range(20)}
    assert drawn == {"off", "20ms"}
    bad_forms = (
        [[1, "off"]],
        [[0, "off"], [0, "20ms"]],
        {"schedule": [], "x": 1},
        {"schedule": [[0, "off"], [1, "20ms"]], "shift_s": 0.6},
        {"profiles": []},
    )
    for bad in bad_forms:
        with pytest.raises(ValueError, match="stragglers"):
            Condition.parse(bad, parse, "stragglers")


def _forkable_env(**kw):
    return AllReduceEnv(
        workload="mlp-digits",
        world_size=2,
        steps_per_decision=3,
        time_budget_s=100.0,
        shards="label-skew",
        action_menu={
            "compression": ["int8", "topk:0.05", "powersgd:2"],
            "bucket_mb": [25.0],
            "sync_period": [1, 2],
        },
        **kw,
    )


def test_a_forked_episode_continues_bit_identically():
    """Restoring a snapshot replays the episode's losses exactly (stateful compressors too)."""
    env = _forkable_env(stragglers="1ms:p=0.3")
    plan = [np.array(a) for a in ([0, 0, 1], [1, 0, 0], [2, 0, 1], [1, 0, 1], [2, 0, 0])]
    try:
        env.reset(seed=5)
        for a in plan[:2]:
            env.step(a)
        key = env.snapshot()
        t0 = env._train_time_s
        first = [env.step(a)[4]["measured"]["eval_loss"] for a in plan[2:]]
        env.restore(key)
        for a in plan[:3]:  # wander off elsewhere, then come back
            env.step(a)
        obs = env.restore(key)
        assert obs is not None and env._train_time_s == t0
        again = [env.step(a)[4]["measured"]["eval_loss"] for a in plan[2:]]
        assert again == first
        env.drop_snapshots()
        with pytest.raises(KeyError):
            env.restore(key)
    finally:
        env.close()


def test_phases_and_conditions_of_an_episode_are_reported():
    env = _forkable_env(stragglers=[[0, "off"], [0.05, "2ms"]])
    try:
        _, info = env.reset(seed=1)
        assert env.episode_phases == [
            (0.0, "loopback, stragglers off"),
            (0.05, "loopback, stragglers 2ms"),
        ]
        seen = set()
        for _ in range(12):
            _, _, _term, _trunc, info = env.step(np.array([0, 0, 0]))
            seen.add(info["condition"])
            # a straggler sleeps 2 ms in every iteration of its phase: never faster than that
            if info["condition"].endswith("2ms"):
                assert info["measured"]["iter_mean_s"] >= 0.002
        assert seen == {"loopback, stragglers off", "loopback, stragglers 2ms"}
        with pytest.raises(RuntimeError, match="reset"):
            AllReduceEnv(workload="mlp-digits", world_size=1).snapshot()
    finally:
        env.close()


def test_the_probe_is_timed_counted_and_observed():
    """probe_bytes: every decision ends with a timed fp32 all-reduce of that size; its time is
    training time and the observation shows its rate; privileged fields stay 0 without the
    option."""
    from commgym.env.spaces import OBSERVATION_FIELDS

    idx = {f.name: i for i, f in enumerate(OBSERVATION_FIELDS)}
    env = _forkable_env(probe_bytes=65536)
    try:
        env.reset(seed=2)
        for _ in range(3):
            obs, _, _, _, info = env.step(np.array([0, 0, 0]))
            m = info["measured"]
            assert m["probe_bytes"] == 65536 and m["probe_s"] > 0
            assert m["train_time_s"] > m["probe_s"]  # counted in the decision's training time
            # the field is log10 of the probe's all-reduce rate, Gbit/s (ring model bytes)
            assert obs[idx["log10_probe_gbps"]] != 0.0
            assert obs[idx["log10_link_gbps"]] == 0.0 and obs[idx["straggler_ms"]] == 0.0
        # a player that does not read the probe (the rollout's reset option) runs none
        env.reset(seed=2, options={"probe": False})
        obs, _, _, _, info = env.step(np.array([0, 0, 0]))
        assert info["measured"]["probe_s"] == 0 and info["measured"]["probe_bytes"] == 0
        assert obs[idx["log10_probe_gbps"]] == 0.0
        env.reset(seed=2)  # no option: the probe runs, as configured
        _, _, _, _, info = env.step(np.array([0, 0, 0]))
        assert info["measured"]["probe_s"] > 0
        with pytest.raises(ValueError, match="reset option 'probe' must be True or False"):
            env.reset(seed=2, options={"probe": "no"})
    finally:
        env.close()


def test_a_probe_at_reset_runs_once_and_starts_the_episodes_clock():
    """probe_at="reset": one probe after the reset on the episode's link (the reset
    observation reads it; the clock, in the reset's info too, starts at its time), none at
    the decisions; a player that does not read the probe runs none at all."""
    from commgym.env.spaces import OBSERVATION_FIELDS

    field = [f.name for f in OBSERVATION_FIELDS].index("log10_probe_gbps")
    env = _forkable_env(probe_bytes=65536, probe_at="reset")
    try:
        obs, info = env.reset(seed=2)
        assert info["probe_s"] > 0 and info["train_time_s"] >= info["probe_s"]
        assert obs[field] != 0.0
        clock = info["train_time_s"]
        for _ in range(2):
            obs, _, _, _, step = env.step(np.array([0, 0, 0]))
            m = step["measured"]
            assert m["probe_bytes"] == 0 and m["probe_s"] == 0 and obs[field] == 0.0
            clock += m["train_time_s"]
            assert step["train_time_s"] == pytest.approx(clock, rel=1e-12)
        obs, info = env.reset(seed=2, options={"probe": False})
        assert info["probe_s"] == 0 and info["train_time_s"] == 0 and obs[field] == 0.0
    finally:
        env.close()


def test_probe_for_all_charges_every_player():
    """probe_for_all: the earlier figures' setting, every player runs the probe."""
    from commgym.agents import StaticAgent, rollout

    env = _forkable_env(probe_bytes=65536, probe_for_all=True, max_decisions=2)
    try:
        ep = rollout(env, StaticAgent(env, preset="int8/25MB/H1"), 3)
        assert ep.steps and all(st.measured.probe_s > 0 for st in ep.steps)
    finally:
        env.close()


@pytest.mark.parametrize(
    ("network", "fastest"),
    [
        (None, None),
        ("100mbit", "100mbit"),
        ({"profiles": ["10mbit", "10gbit", "1gbit"]}, "10gbit"),
        ([[0, "1gbit"], [2, "10mbit"], [4, "1gbit"]], "1gbit"),
        ({"profiles": ["1gbit", "ethernet-1g"]}, "1gbit"),  # equal rates: the first
    ],
)
def test_fastest_spec_is_the_highest_rate_of_the_plan(network, fastest):
    from commgym.env.net import NetworkPlan

    spec = NetworkPlan.parse(network).fastest_spec
    assert (None if spec is None else str(spec)) == fastest
