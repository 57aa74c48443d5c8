"""commgym/Sim-v1: parts against references, the env's contract, conditions as the real env's."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

import commgym.env  # noqa: F401 - registers the envs
from commgym.env import AllReduceEnv, EnvConfig
from commgym.env.measure import DECISION_FIELDS, measurement_from_info
from commgym.env.net import tbf_burst_bytes
from commgym.env.schedule import episode_seed as draw_episode_seed
from commgym.env.sim import (
    Calibration,
    CodecMeasurement,
    EntryCalibration,
    ProgressModel,
    SimEnv,
    SimModel,
    WireModel,
    adaptive_times,
    best_schedule,
    best_schedule_time,
    fit_switch_penalties,
    fit_wire,
    simulate,
    static_ranking,
    switch_pair,
    workload_key,
)
from commgym.env.sim.progress import interp_scalar
from commgym.env.sim.wire import LinkFit, ring_uplink_bytes
from commgym.env.surrogate import AlphaBeta

MENU = {"compression": ["none", "topk:0.01"], "bucket_mb": [25.0], "sync_period": [1, 2]}
W = 4
K = 4


def _env_cfg(**kw):
    base = dict(
        workload="mid-mlp", world_size=W, shards="label-skew", lr=0.02, steps_per_decision=K,
        time_budget_s=30.0, reward="time_to_target", target_loss=0.2, action_menu=MENU,
    )  # fmt: skip
    base.update(kw)
    return EnvConfig(**base)


def _curve(rate: float, n: int = 80) -> list[float]:
    return [2.3 * math.exp(-rate * i) for i in range(n)]


def _calibration() -> Calibration:
    """A small fixture: two compressions, two periods, one recorded shaped rate (10 Mbit/s)."""
    wire = WireModel(
        W,
        loop_alpha_s={"allreduce": 1e-4, "allgather": 1e-4},
        beta_host_s={"allreduce": 1e-9, "allgather": 1e-9},
        links={10_000_000: {"allreduce": LinkFit(2e-4, 1.05), "allgather": LinkFit(2e-4, 1.05)}},
    )
    codec = {
        "none": CodecMeasurement("none", "allreduce", 4_505_640, (4_505_640,), (1,), 3e-4),
        "topk:0.01": CodecMeasurement("topk:0.01", "allgather", 4_505_640, (90_112,), (1,), 7e-3),
    }
    speed = {"none/25MB/H1": 0.060, "none/25MB/H2": 0.045, "topk:0.01/25MB/H1": 0.050,
             "topk:0.01/25MB/H2": 0.040}  # fmt: skip
    entries = {
        e: EntryCalibration(
            train_s=0.2 + 0.01 * i,
            step_s=0.05,
            compute_s=0.02,
            compress_s=0.0,
            bytes_total=1e6,
            train_loss_ratio=0.9,
            log10_grad_norm=0.0,
            compression_error=0.1,
            decisions=40,
            curves=[_curve(speed[e]), _curve(speed[e] * 1.1)],
        )
        for i, e in enumerate(speed)
    }
    return Calibration(
        key=workload_key(_env_cfg()), menu=dict(MENU, error_feedback=True), num_params=1_126_410,
        param_shapes=[[10, 1024], [10]], optimizer_state_bytes=4 * 1_126_410, target_loss=0.18,
        entries=entries, codec=codec, wire=wire, switch_penalty=0.2,
        eval_acc=[[0.1, 0.97], [2.3, 0.1]],
    )  # fmt: skip


# -- wire ----------------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [10e6, 100e6, 1e9])
@pytest.mark.parametrize("n", [65_536, 4_505_640])
def test_wire_is_the_closed_form_ring_beyond_the_burst(rate, n):
    """With no latency, host cost or inefficiency, an all-reduce is the ring's volume at 8/R."""
    wire = WireModel(
        W, links={int(rate): {k: LinkFit(0.0, 1.0) for k in ("allreduce", "allgather")}}
    )
    ring = AlphaBeta().allreduce_s(n, W, rate)  # 2(W-1)/W n 8/R: Thakur et al.
    burst = tbf_burst_bytes(rate)
    assert wire.exchange_s("allreduce", n, rate) == pytest.approx(max(0.0, ring - burst * 8 / rate))
    # ring all-gather: every rank forwards W-1 payloads (AlphaBeta's (W-1)/W x gathered total)
    gather = AlphaBeta().allgather_s(n * W, W, rate)
    assert wire.exchange_s("allgather", n, rate) == pytest.approx(
        max(0.0, gather - burst * 8 / rate)
    )


def test_wire_fit_recovers_alpha_and_efficiency():
    rate = 10_000_000
    truth = WireModel(
        W,
        loop_alpha_s={"allreduce": 2e-4, "allgather": 3e-4},
        beta_host_s={"allreduce": 2e-9, "allgather": 4e-9},
        links={rate: {"allreduce": LinkFit(5e-4, 1.1), "allgather": LinkFit(1e-3, 1.2)}},
    )
    sizes = [4096, 65_536, 262_144, 1_048_576]
    rows = [
        (k, r, n, truth.exchange_s(k, n, r))
        for k in ("allreduce", "allgather")
        for r in (None, rate)
        for n in sizes
    ]
    fit = fit_wire(rows, W)
    for k in ("allreduce", "allgather"):
        assert fit.links[rate][k].eta == pytest.approx(truth.links[rate][k].eta, rel=1e-3)
        for n in sizes:
            assert fit.exchange_s(k, n, rate) == pytest.approx(
                truth.exchange_s(k, n, rate), rel=1e-3
            )


def test_an_unrecorded_rate_is_serialisation_bounded_by_a_faster_links_ceiling():
    wire = WireModel(
        W,
        links={
            10**7: {k: LinkFit(1e-3, 1.1) for k in ("allreduce", "allgather")},
            10**10: {k: LinkFit(3e-3, 20.0) for k in ("allreduce", "allgather")},  # CPU-bound
        },
    )
    assert wire._alpha("allreduce", 10**8) == pytest.approx(1e-3 + 2e-3 / 3)
    # 100 Mbit/s: serialisation at the recorded framing (1.1), above the 10 Gbit/s ceiling
    assert wire.per_byte_s("allreduce", 10**8) == pytest.approx(1.1 * 8 / 10**8)
    # 5 Gbit/s: the 10 Gbit/s link's measured cost per byte is the floor
    assert wire.per_byte_s("allreduce", 5 * 10**9) == pytest.approx(20.0 * 8 / 10**10)
    assert not wire.recorded(10**8) and wire.recorded(10**7) and wire.recorded(None)
    # a fast link the host never saturated (eta << 1 beyond its burst) says nothing about a
    # slower link's framing: the token bucket still holds 100 Mbit/s to 8 / R per byte
    idle = WireModel(
        W,
        links=dict.fromkeys(
            [10**10], dict.fromkeys(("allreduce", "allgather"), LinkFit(3e-3, 1e-3))
        ),
    )
    assert idle.per_byte_s("allreduce", 10**8) == pytest.approx(8 / 10**8)
    assert ring_uplink_bytes("allgather", 100, 4) == 300


# -- timing ----------------------------------------------------------------------------------
def test_timing_decomposition_sums_back_to_the_measured_loopback_decision():
    cal = _calibration()
    model = SimModel(cal, _env_cfg().menu, K)
    for e, tm in zip(model.entries, model.timings(None), strict=True):
        assert tm.train_s == pytest.approx(cal.entries[e].train_s)
    slow = model.timings(10_000_000)
    k = model.entries.index("none/25MB/H1")
    extra = K * (model.exchange_s("none", 10_000_000) - model.exchange_s("none", None))
    assert slow[k].train_s == pytest.approx(cal.entries["none/25MB/H1"].train_s + extra)
    # period 2 at K=4: two averagings, so half the dense exchanges of period 1
    k2 = model.entries.index("none/25MB/H2")
    assert (slow[k2].rounds, slow[k].rounds) == (2, 4)
    # leaving a local-SGD period for period 1 all-reduces the optimizer state on the link
    assert model.switch_s(k2, k, 10_000_000) > 1.0
    assert model.switch_s(k, k2, 10_000_000) == 0.0


# -- progress ----------------------------------------------------------------------------------
def test_progress_follows_a_static_curve_decision_by_decision():
    curve = _curve(0.05)
    pm = ProgressModel({"a": [curve]}, 0.0, floor_loss=0.1)
    loss = curve[0]
    for i in range(1, 40):
        loss = pm.step("a", loss)
        assert loss == pytest.approx(curve[i], rel=1e-3)


def test_switch_penalties_per_family_pair_are_recovered_from_switching_episodes():
    """Noise-free episodes from a known per-pair model: the fit recovers each pair that was
    seen often enough (one pair sets training back: penalty > 1), pairs seen too rarely take
    the pooled value, and the held-out check separates per-pair from pooled penalties."""
    names = {"d": "none/25MB/H1", "s": "topk:0.01/25MB/H1", "l": "powersgd:2/25MB/H2"}
    curves = {names["d"]: [_curve(0.05)], names["s"]: [_curve(0.07)], names["l"]: [_curve(0.06)]}
    truth_pairs = {"dense->sparse": 0.2, "sparse->lowrank": 0.8, "lowrank->sparse": 0.7,
                   "sparse->dense": 1.5}  # fmt: skip
    truth = ProgressModel(curves, 0.3, floor_loss=0.1, switch_penalties=truth_pairs)
    assert truth.penalty(names["s"], names["d"]) == 1.5
    assert truth.penalty(names["d"], names["l"]) == 0.3  # no own value: the pooled one
    assert truth.penalty(names["s"], names["s"]) == 0.0
    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(6):
        entries, losses, prev = [], [curves[names["d"]][0][0]], None
        for _ in range(25):
            e = names["dsl"[int(rng.integers(3))]]
            losses.append(truth.step(e, losses[-1], prev))
            entries.append(e)
            prev = e
        episodes.append((entries, losses))
    fit = fit_switch_penalties(curves, episodes, floor_loss=0.1)
    for pair, value in truth_pairs.items():
        assert fit["counts"][pair] >= 4
        assert fit["penalties"][pair] == pytest.approx(value, abs=0.02), pair
    assert fit["penalties"][switch_pair(names["d"], names["l"])] == pytest.approx(0.3, abs=0.02)
    assert fit["switches"] == sum(fit["counts"].values())
    assert fit["err_switch_pairs"] < 0.01 < fit["err_switch_pooled"]
    assert fit["err_stay"] < 1e-3
    # replayed open loop, the per-pair model follows the episodes; pooled and free switches
    # drift from them
    assert fit["episodes"] == 6
    assert fit["open_pairs"] < 0.01 < fit["open_pooled"] < fit["open_zero"]
    assert fit["model"] == "pairs" and fit["open_model"] == fit["open_pairs"]
    assert np.isnan(fit["open_static"])  # one seed per entry: no held-out static curve
    two_seeds = {e: [c[0], _curve(0.055)] for e, c in curves.items()}
    assert fit_switch_penalties(two_seeds, episodes, floor_loss=0.1)["open_static"] > 0
    # a pair seen fewer than min_switches times falls back to the pooled value
    rare = fit_switch_penalties(curves, episodes, floor_loss=0.1, min_switches=10_000)
    assert rare["penalties"] == {} and 0.0 <= rare["penalty"] < 3.0


def test_two_decision_switch_costs_per_family_entered_are_recovered():
    """Noise-free episodes from a known two-decision model (the entered family's state
    restarts: the switching decision and the next one lose progress): the fit recovers
    the costs on its grid, picks that form, and the pair form cannot follow them."""
    names = {"d": "none/25MB/H1", "s": "topk:0.01/25MB/H1", "l": "powersgd:2/25MB/H2"}
    curves = {names["d"]: [_curve(0.05)], names["s"]: [_curve(0.07)], names["l"]: [_curve(0.06)]}
    truth_costs = {"dense": (0.0, 0.0), "sparse": (0.4, 0.8), "lowrank": (0.5, 0.3)}
    truth = ProgressModel(curves, 0.3, floor_loss=0.1, switch_costs=truth_costs)
    loss0 = curves[names["d"]][0][0]
    # a switch into top-k loses 0.4 of that decision, 0.8 of the next one on top-k, then none
    one = truth.step(names["s"], loss0, names["d"])
    assert one == pytest.approx(truth.loss_at(names["s"], truth.position(names["s"], loss0) + 0.6))
    two = truth.step(names["s"], one, names["s"], fresh=True)
    assert two == pytest.approx(truth.loss_at(names["s"], truth.position(names["s"], one) + 0.2))
    assert truth.step(names["s"], two, names["s"]) == pytest.approx(
        truth.loss_at(names["s"], truth.position(names["s"], two) + 1.0)
    )
    assert truth.penalty(names["s"], names["d"]) == 0.0 and truth.after_switch(names["l"]) == 0.3
    rng = np.random.default_rng(1)
    episodes = []
    for _ in range(6):
        entries, losses, prev, fresh = [], [loss0], None, False
        while len(entries) < 30:
            e = names["dsl"[int(rng.integers(3))]]
            for _ in range(int(rng.integers(1, 4))):  # held 1-3 decisions, as calibrate-sim
                losses.append(truth.step(e, losses[-1], prev, fresh))
                entries.append(e)
                fresh, prev = prev is not None and e != prev, e
        episodes.append((entries, losses))
    fit = fit_switch_penalties(curves, episodes, floor_loss=0.1)
    assert fit["model"] == "entered"
    for fam, (c0, c1) in truth_costs.items():
        assert fit["costs"][fam] == pytest.approx([c0, c1], abs=0.02), fam
    assert fit["open_entered"] < 0.01 < fit["open_pairs"]
    assert fit["open_model"] == fit["open_entered"]


def test_switch_costs_play_alike_in_the_env_the_replay_and_the_dynamic_programme():
    """With two-decision switch costs in force, the best schedule's time, its replay by
    simulate() and the env stepping the same entries agree (the second decision after a
    switch is charged in all three)."""
    import dataclasses

    cal = dataclasses.replace(
        _calibration(), switch_costs={"dense": [0.0, 0.0], "sparse": [0.4, 0.8]}
    )
    cfg = _env_cfg(
        network={"schedule": [[0, "10mbit"], [2, "10gbit"], [3.2, "10mbit"]], "shift_s": 0.2},
        time_budget_s=60.0,
    )
    with pytest.warns(UserWarning):
        env = SimEnv(cal, cfg)
    model = env.model
    k_s = model.entries.index("topk:0.01/25MB/H1")
    assert model.after_switch[k_s] == 0.8 and model.penalty[0][k_s] == 0.4
    seed = 1003
    best, sched = best_schedule(model, cfg, seed)
    assert best is not None and len({k for _, k in sched}) > 1  # it switches
    assert simulate(model, cfg, seed, sched)[0] == pytest.approx(best)
    env.reset(seed=seed, options={"probe": False})
    starts = [t for t, _ in sched]
    t = 0.0
    while True:
        k = sched[int(np.searchsorted(starts, t, side="right")) - 1][1]
        _, _, term, trunc, info = env.step(np.array(np.unravel_index(k, tuple(env.menu.nvec))))
        t = info["train_time_s"]
        if term or trunc:
            break
    assert info["train_time_s"] == pytest.approx(best)


def test_switch_family_names_what_it_does_not_know():
    with pytest.raises(ValueError, match="no switch family for compression 'zstd'"):
        switch_pair("zstd/25MB/H1", "none/25MB/H1")


# -- env contract --------------------------------------------------------------------------------
def test_sim_env_keeps_the_real_envs_spaces_and_records():
    cfg = _env_cfg(
        network={"schedule": [[0, "10gbit"], [4, "10mbit"], [6.4, "10gbit"]], "shift_s": 0.5}
    )
    with pytest.warns(UserWarning, match="never recorded"):
        env = gym.make("commgym/Sim-v1", calibration=_calibration(), config=cfg)
    from gymnasium.utils.env_checker import check_env

    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=1000)
    from commgym.env.spaces import ObservationBuilder

    real_space = ObservationBuilder(cfg.menu, W, 1_126_410).space
    assert env.observation_space == real_space and env.action_space.nvec.tolist() == [2, 1, 2]
    assert obs.shape == env.observation_space.shape and obs.dtype == np.float32
    steps = 0
    while True:
        obs, _, term, trunc, info = env.step(np.array([1, 0, 1]))
        steps += 1
        m = measurement_from_info(info)
        assert set(info["measured"]) >= set(DECISION_FIELDS)
        assert m.eval_loss > 0 and info["condition"].endswith("stragglers off")
        if term or trunc:
            break
    assert info["reason"] in ("target_reached", "time_budget") and steps > 5
    sim = env.unwrapped
    assert sim.decisions == steps and sim.train_time_s == pytest.approx(info["train_time_s"])
    assert sim.probe_bytes == cfg.probe_bytes
    # deterministic: the same seed and actions give the same episode
    a = [env.reset(seed=3)[0]] + [env.step(np.array([0, 0, 0]))[0] for _ in range(3)]
    b = [env.reset(seed=3)[0]] + [env.step(np.array([0, 0, 0]))[0] for _ in range(3)]
    np.testing.assert_array_equal(np.stack(a), np.stack(b))


def test_probe_option_as_the_real_env():
    cfg = _env_cfg(network="10mbit", probe_bytes=65_536)
    env = SimEnv(_calibration(), cfg)
    env.reset(seed=0)
    with_probe = env.step(np.array([0, 0, 0]))[4]["measured"]
    env.reset(seed=0, options={"probe": False})
    without = env.step(np.array([0, 0, 0]))[4]["measured"]
    assert with_probe["probe_s"] > 0.04 and without["probe_s"] == 0.0
    assert with_probe["train_time_s"] - without["train_time_s"] == pytest.approx(
        with_probe["probe_s"]
    )


def test_a_probe_at_reset_as_the_real_env():
    """probe_at="reset": one probe on the episode's first link, priced by the wire model;
    the clock starts at it, the reset observation reads it, the decisions run none."""
    from commgym.env.spaces import OBSERVATION_FIELDS, probe_gbps

    field = [f.name for f in OBSERVATION_FIELDS].index("log10_probe_gbps")
    env = SimEnv(_calibration(), _env_cfg(network="10mbit", probe_bytes=65_536, probe_at="reset"))
    probe_s = env.model.probe_s(65_536, 10e6)
    obs, info = env.reset(seed=0)
    assert probe_s > 0.04 and info["train_time_s"] == pytest.approx(probe_s, rel=1e-12)
    assert obs[field] == pytest.approx(math.log10(probe_gbps(65_536, probe_s, W)), rel=1e-6)
    assert env.probe_bytes == 0  # what each decision runs (the expert and planner read it)
    obs, _, _, _, step = env.step(np.array([0, 0, 0]))
    assert step["measured"]["probe_s"] == 0.0 and step["measured"]["probe_bytes"] == 0
    assert obs[field] == 0.0
    assert step["train_time_s"] == pytest.approx(probe_s + step["measured"]["train_time_s"])
    # the same decision with the probe at its end costs the probe more
    per_decision = SimEnv(_calibration(), _env_cfg(network="10mbit", probe_bytes=65_536))
    per_decision.reset(seed=0)
    m = per_decision.step(np.array([0, 0, 0]))[4]["measured"]
    assert m["train_time_s"] == pytest.approx(step["measured"]["train_time_s"] + probe_s)
    # a player that does not read the probe runs none at reset either
    obs, info = env.reset(seed=0, options={"probe": False})
    assert info["train_time_s"] == 0.0 and obs[field] == 0.0
    with pytest.raises(ValueError, match=r"probe_at must be one of \['decision', 'reset'\]"):
        _env_cfg(probe_at="start")


def test_a_measured_link_time_replaces_the_composed_one_on_that_link_only():
    """``Calibration.link_train_s``: the entry's measured decision time on a link is the
    simulator's there (the host cost spread over its iterations); other links and other
    entries keep the composed time."""
    import dataclasses

    from commgym.env.sim.model import SimModel

    cal = _calibration()
    cfg = _env_cfg(network="10mbit")
    plain = SimModel(cal, cfg.menu, cfg.steps_per_decision)
    k = plain.entries.index("none/25MB/H1")
    composed = plain.timings(10e6)[k]
    measured = composed.train_s + 0.2
    cal2 = dataclasses.replace(cal, link_train_s={"10000000": {"none/25MB/H1": measured}})
    model = SimModel(cal2, cfg.menu, cfg.steps_per_decision)
    got = model.timings(10e6)[k]
    assert got.train_s == pytest.approx(measured)
    assert got.step_s == pytest.approx(composed.step_s + 0.2 / cfg.steps_per_decision)
    assert got.exchange_s == composed.exchange_s  # the wire is the wire model's
    for j in range(len(model.entries)):
        assert model.timings(None)[j] == plain.timings(None)[j]  # loopback unchanged
        if j != k:
            assert model.timings(10e6)[j] == plain.timings(10e6)[j]
    env = SimEnv(cal2, cfg)
    env.reset(seed=0)
    a = np.unravel_index(k, env.menu.nvec)
    assert env.step(np.array(a))[4]["measured"]["train_time_s"] == pytest.approx(measured)


def test_probe_noise_spreads_the_probe_s_time_and_its_reading_only():
    """probe_noise multiplies the probe's time by a mean-1 log-normal per decision: the
    decision's time moves by exactly the probe's change, the observation's reading with it."""
    from commgym.env.sim.randomize import RandomizedConditions

    cfg = _env_cfg(network="10mbit", probe_bytes=65536)
    env = SimEnv(_calibration(), cfg)
    base = env.model.probe_s(65536, 10e6)

    def first(noise, seed):
        env.probe_noise = noise
        env.reset(seed=seed)
        m = env.step(np.array([0, 0, 0]))[4]["measured"]
        return m["probe_s"], m["train_time_s"]

    plain_probe, plain_t = first(0.0, 0)
    assert plain_probe == pytest.approx(base, rel=1e-12)  # off by default
    draws = [first(0.5, seed) for seed in range(300)]
    probes = np.array([p for p, _ in draws])
    np.testing.assert_allclose([t - p for p, t in draws], plain_t - plain_probe, rtol=1e-9)
    # log-normal, sigma 0.5, mean 1: 300 draws' log s.d. and mean within sampling error
    assert 0.42 < np.log(probes / base).std() < 0.58
    assert abs(probes.mean() / base - 1.0) < 4 * math.sqrt(math.exp(0.25) - 1) / math.sqrt(300)
    sched = _env_cfg(network={"schedule": [[0, "10gbit"], [4, "10mbit"]], "shift_s": 0.5})
    with pytest.warns(UserWarning, match="never recorded"):
        wrapped = RandomizedConditions(SimEnv(_calibration(), sched), probe_noise=0.5)
    wrapped.reset(seed=1)
    assert wrapped.unwrapped.probe_noise == 0.5
    fixed = _env_cfg(network="10mbit", probe_bytes=65536)
    RandomizedConditions(SimEnv(_calibration(), fixed), probe_noise=0.5)  # a fixed link: fine


def test_timing_randomisation_scales_the_time_off_the_wire_only():
    """compute_scale multiplies compute and codec, never the wire; timing_noise spreads it
    per decision from the env's own generator (reproducible by seed); off by default."""
    from commgym.env.sim.randomize import RandomizedConditions, check_randomization

    cfg = _env_cfg(network="10mbit", probe_bytes=0)
    env = SimEnv(_calibration(), cfg)
    k = env.model.entries.index("none/25MB/H1")
    tm = env.model.timings(10e6)[k]
    wire = tm.rounds * tm.exchange_s
    assert 0 < wire < tm.train_s  # both parts present on this link

    def first(scale=1.0, noise=0.0, seed=0):
        env.compute_scale, env.timing_noise = scale, noise
        env.reset(seed=seed)
        return env.step(np.array([0, 0, 0]))[4]["measured"]

    plain = first()
    assert plain["train_time_s"] == pytest.approx(tm.train_s, rel=1e-12)  # off by default
    doubled = first(2.0)
    assert doubled["train_time_s"] == pytest.approx(2 * (tm.train_s - wire) + wire, rel=1e-9)
    assert doubled["compute_s"] == pytest.approx(2 * plain["compute_s"])
    assert doubled["comm_wait_s"] == plain["comm_wait_s"]  # the wire's wait is the link's
    noisy = [first(1.0, 0.15, seed)["train_time_s"] for seed in range(200)]
    assert noisy[:5] == [first(1.0, 0.15, seed)["train_time_s"] for seed in range(5)]
    factors = (np.array(noisy) - wire) / (tm.train_s - wire)
    # log-normal with mean 1 and sigma 0.15: 200 draws' mean within 4 standard errors
    assert abs(factors.mean() - 1.0) < 4 * 0.15 / math.sqrt(200)
    assert 0.10 < np.log(factors).std() < 0.20

    sched = _env_cfg(network={"schedule": [[0, "10gbit"], [4, "10mbit"]], "shift_s": 0.5})
    with pytest.warns(UserWarning, match="never recorded"):
        wrapped = RandomizedConditions(
            SimEnv(_calibration(), sched), compute_scale=[0.9, 1.7], timing_noise=0.1
        )
    scales = set()
    for seed in range(5):
        wrapped.reset(seed=seed)
        scales.add(wrapped.unwrapped.compute_scale)
        assert 0.9 <= wrapped.unwrapped.compute_scale <= 1.7
        assert wrapped.unwrapped.timing_noise == 0.1
    assert len(scales) == 5
    for bad, match in [
        ({"probe_noise": -1}, "probe_noise must be >= 0, got -1"),
        ({"compute_scale": [1.7, 0.9]}, "compute_scale must be \\[lo, hi\\]"),
        ({"compute_scale": 1.2}, "compute_scale must be"),
        ({"timing_noise": -0.1}, "timing_noise must be >= 0, got -0.1"),
        ({"timing_noise": "x"}, "timing_noise must be a number"),
    ]:
        with pytest.raises(ValueError, match=match):
            check_randomization(**bad)


@pytest.mark.parametrize(
    "network",
    [
        {
            "schedule": [[0, "10gbit"], [4, "10mbit"], [6.4, "10gbit"], [10.4, "10mbit"]],
            "shift_s": 0.5,
        },
        {"profiles": ["10mbit", "10gbit"]},
    ],
)
def test_phase_replay_equals_the_real_envs_resolution(network):
    """The real env's own episode_phases/condition_at, fed by its reset's draws, are the sim's."""
    cfg = _env_cfg(network=network)
    sim = SimEnv(_calibration(), cfg)
    for seed in (1000, 1001, 1002, 7):
        sim.reset(seed=seed)
        real = AllReduceEnv.__new__(AllReduceEnv)  # no ranks: only its resolution is read
        real.config = cfg
        gym.Env.reset(real, seed=seed)  # what AllReduceEnv.reset does first
        es = draw_episode_seed(real.np_random)
        real._schedule = cfg.network_plan.for_episode(es)
        real._stragglers = cfg.straggler_condition.for_episode(es)
        real._crossing = cfg.cross_traffic_condition.for_episode(es)
        assert sim.episode_seed == es
        starts = [0.0] if real._schedule is None else [float(t) for t, _ in real._schedule]
        assert sim.link_phase_starts == starts
        # the trace a learner may read: the same phases with their rates, within the budget
        budget = cfg.time_budget_s
        assert [t for t, _ in sim.link_phases] == [t for t in starts if t < budget]
        assert all(
            rate == sim_spec.rate_bit_s
            for (t, rate) in sim.link_phases
            for sim_spec in [real._schedule.spec_at(t)]
        )
        assert sim.episode_phases == real.episode_phases
        for t in (0.0, 3.9, 4.6, 7.0, 11.0):
            assert sim.condition_at(t) == real.condition_at(t)


def test_link_lottery_seeds_draw_the_links_its_scenario_file_names():
    from commgym.experiments.config import load_run_config

    cfg = load_run_config("link-lottery").env_config
    sim = SimEnv(_calibration(), _env_cfg(network=cfg.network))
    drawn = []
    for seed in range(1000, 1006):
        drawn.append(sim.reset(seed=seed)[1]["network"])
    assert drawn == ["10mbit", "10gbit", "10mbit", "10gbit", "10gbit", "10gbit"]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"stragglers": "40ms"}, "straggler"),
        ({"target_loss": 0.1}, "below the calibrated"),
        ({"lr": 0.05}, "another setting"),
        ({"network": "10mbit:5ms"}, "delay, jitter or loss"),
        ({"action_menu": {**MENU, "bucket_mb": [1.0]}}, "several buckets|not calibrated"),
    ],
)
def test_what_it_cannot_model_is_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        SimEnv(_calibration(), _env_cfg(**{**{"network_strict": False}, **kw}))


# -- the simulator's oracles -------------------------------------------------------------
def test_oracles_in_the_simulator():
    cfg = _env_cfg(
        network={"schedule": [[0, "10gbit"], [4, "10mbit"], [6.4, "10gbit"]], "shift_s": 0.5}
    )
    with pytest.warns(UserWarning):
        env = SimEnv(_calibration(), cfg)
    model = env.model
    seeds = [1000, 1001]
    ranking = static_ranking(model, cfg, seeds)
    assert [r.rank_key() for r in ranking] == sorted(r.rank_key() for r in ranking)
    # the simulate() path is the env's: a static episode in the env ends at the same time
    k = model.entries.index(ranking[0].config)
    env.reset(seed=seeds[0], options={"probe": False})
    a = np.array(np.unravel_index(k, tuple(env.menu.nvec)))
    while True:
        _, _, term, trunc, info = env.step(a)
        if term or trunc:
            break
    assert info["train_time_s"] == pytest.approx(simulate(model, cfg, seeds[0], [(0.0, k)])[0])
    ad = adaptive_times(model, cfg, seeds, ranking)
    for i, t in enumerate(ad):
        assert t is not None and t <= ranking[0].times_s[i] + 1e-9
    # a fixed link has one phase: the best schedule is the best static entry of that seed
    fixed = _env_cfg(network="10mbit", time_budget_s=120.0)
    best = min(simulate(model, fixed, 5, [(0.0, j)])[0] or math.inf for j in range(4))
    assert math.isfinite(best)
    assert best_schedule_time(model, fixed, 5) == pytest.approx(best)


def test_interp_scalar_is_numpys_interp_on_lists():
    """The fits' scalar interpolation against ``np.interp``: ties, clamped ends, exact knots."""
    rng = np.random.default_rng(3)
    xs = np.sort(np.concatenate([rng.uniform(0, 10, 40), [2.5, 2.5, 2.5, 7.0, 7.0]]))
    ys = np.cumsum(rng.uniform(0, 1, len(xs)))
    probes = np.concatenate([rng.uniform(-2, 12, 500), xs, [xs[0], xs[-1], -1e9, 1e9]])
    got = [interp_scalar(float(x), xs.tolist(), ys.tolist()) for x in probes]
    np.testing.assert_allclose(got, np.interp(probes, xs, ys), rtol=1e-12, atol=1e-12)


def test_a_search_grid_lets_the_oracles_switch_where_the_link_never_changes():
    """One entry is fast at a high loss and slow at a low one (as long local-SGD periods):
    on a fixed link only a grid of switch points (``every_s``) lets the schedule use it."""
    cal = _calibration()

    def kinked(fast: float, slow: float, knee: float, n: int = 200) -> list[float]:
        out, loss = [], 2.3
        for _ in range(n):
            out.append(loss)
            loss *= math.exp(-(fast if loss > knee else slow))
        return out

    # on 10 Mbit/s the dense entries are far too slow; of the sparse ones, period 2 is fast
    # down to a loss of 0.8 and slow below it, period 1 steady
    early, steady = kinked(0.12, 0.01, 0.8), kinked(0.05, 0.05, 0.8)
    late_entry, early_entry = "topk:0.01/25MB/H1", "topk:0.01/25MB/H2"
    cal.entries[early_entry].curves = [early, early]
    cal.entries[late_entry].curves = [steady, steady]
    cal.switch_penalty = 0.0
    for cfg in (
        _env_cfg(network={"schedule": [[0, "10mbit"]]}, time_budget_s=200.0),
        _env_cfg(network="10mbit", time_budget_s=200.0),  # fixed: the contextual bound
    ):
        model = SimEnv(cal, cfg).model
        seeds = [1000, 1001]
        ranking = static_ranking(model, cfg, seeds)
        static = ranking[0].times_s  # the best static entry per seed
        assert adaptive_times(model, cfg, seeds, ranking) == list(static)  # no switch point
        grid = adaptive_times(model, cfg, seeds, ranking, every_s=1.0)
        assert all(g < s for g, s in zip(grid, static, strict=True))
        t, sched = best_schedule(model, cfg, seeds[0], every_s=1.0)
        assert t == pytest.approx(grid[0])
        played = [model.entries[k] for _, k in sched]
        assert played[0] == early_entry and played[-1] == late_entry
        assert all(t0 == pytest.approx(round(t0)) for t0, _ in sched)  # on the 1 s grid
        # the schedule replays to the same time; a reactive player loses nothing where the
        # link never changes (its lag applies where the link does)
        assert simulate(model, cfg, seeds[0], sched)[0] == pytest.approx(t)
        reactive = adaptive_times(model, cfg, seeds, ranking, reaction_lag=1, every_s=1.0)
        if cfg.network_plan.kind == "schedule":
            assert reactive == pytest.approx(grid)


def test_a_search_grid_keeps_the_reactive_lag_where_the_link_changes():
    """A reactive player on a grid still lags a decision where the link changes, also when
    one decision crosses the change and grid points after it, and after a blind opening:
    the grid's best schedule replays to its own time and is never slower than without."""
    from commgym.env.schedule import split_phases

    cal = _calibration()
    cases = [
        (_env_cfg(network={"schedule": [[0, "10gbit"], [4, "10mbit"]], "shift_s": 0.5}), None),
        (_env_cfg(network={"schedule": [[0, "10mbit"], [0.5, "10gbit"]]}), 1),
        (_env_cfg(network={"schedule": [[0, "10mbit"], [0.5, "10gbit"]]}), 3),
    ]
    for cfg, opening in cases:
        with pytest.warns(UserWarning):  # 10 Gbit/s is not in the fixture's calibration
            model = SimEnv(cal, cfg).model
        for seed in (1000, 1001, 1002):
            plain, _ = best_schedule(model, cfg, seed, reaction_lag=1, opening=opening)
            t, sched = best_schedule(
                model, cfg, seed, reaction_lag=1, opening=opening, every_s=0.05
            )
            assert t is not None and t <= plain + 1e-9
            replay = simulate(model, cfg, seed, sched, reaction_lag=1, opening=opening)[0]
            assert replay == pytest.approx(t)
    for bad in (0, -5.0, math.inf, True):
        with pytest.raises(ValueError, match="every_s"):
            split_phases([(0.0, "a")], bad, 10.0)
