"""commgym/Surrogate-v1: prior, fit, env contract, throughput, and MAPE on real ranks."""

from __future__ import annotations

import math
import time

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
from gymnasium.utils.env_checker import check_env

import commgym.env  # noqa: F401 - registers the envs
from commgym.env import OBSERVATION_FIELDS, ActionMenu, ObservationBuilder
from commgym.env.surrogate import (
    AlphaBeta,
    SurrogateEnv,
    SurrogateModel,
    TransitionRecorder,
    benchmark_steps,
    read_transitions,
    step_time_mape,
    step_time_noise_floor,
)

MENU = ActionMenu()
TRUE_AB = AlphaBeta(alpha_s=50e-6, beta_s_per_byte=2e-9)


def synthetic_transitions(n: int, seed: int, noise: float = 0.03) -> pd.DataFrame:
    """Transitions of a made-up system: compute 1 ms + alpha-beta comm, loss decays."""
    rng = np.random.default_rng(seed)
    nvec = tuple(int(v) for v in MENU.nvec)
    rows = []
    loss, decision, episode = 2.3, 0, 0
    for _ in range(n):
        a = [int(rng.integers(v)) for v in nvec]
        cfg = MENU.decode(np.array(a))
        ratio = {"none": 1.0, "fp16": 0.5, "int8": 0.25}.get(str(cfg.compression), 0.05)
        nbytes = 100_000 * ratio
        comm = TRUE_AB.allreduce_s(nbytes, 2) / cfg.sync_period
        step = (1e-3 + comm) * math.exp(rng.normal(0, noise))
        prev = loss
        loss = max(prev * math.exp(-(0.02 + 0.01 * a[0] / 4) * rng.lognormal(0, 0.1)), 0.05)
        decision += 1
        rows.append(
            {
                "episode": episode, "decision": decision, "a_compression": a[0],
                "a_bucket": a[1], "a_period": a[2], "config": str(cfg), "prev_eval_loss": prev,
                "reward": math.log(prev) - math.log(loss), "diverged": False,
                "workload": "mlp-digits", "world_size": 2, "num_params": 26122,
                "steps_per_decision": 5, "time_budget_s": 6.0,
                "train_time_s": 5 * step * 1.05, "step_time_s": step, "iter_mean_s": step * 1.05,
                "compute_s": 1e-3, "comm_wait_s": comm * 0.8, "compress_s": 1e-5,
                "comm_s": 5 * comm, "bytes_per_step": nbytes, "bytes_total": 5 * nbytes,
                "train_loss": prev * 1.02, "eval_loss": loss, "eval_acc": 0.9, "eval_s": 1e-4,
                "grad_norm": 1.0, "compression_error": None, "nonfinite": False,
                "samples": 320, "steps": 5,
            }
        )  # fmt: skip
        if loss < 0.1:
            loss, decision, episode = 2.3, 0, episode + 1
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def model() -> SurrogateModel:
    return SurrogateModel(MENU, alpha_beta=TRUE_AB).fit(synthetic_transitions(400, 0))


def test_alpha_beta_formulas_and_fit():
    ab = AlphaBeta(1e-4, 1e-9)
    assert ab.allreduce_s(1e6, 4) == pytest.approx(2 * 3 * 1e-4 + 2 * 3 / 4 * 1e6 * 1e-9)
    assert ab.allgather_s(1e6, 4) == pytest.approx(3 * 1e-4 + 3 / 4 * 1e6 * 1e-9)
    samples = [
        (k, w, n, TRUE_AB.allreduce_s(n, w) if k == "allreduce" else TRUE_AB.allgather_s(n, w))
        for k in ("allreduce", "allgather")
        for w in (2, 4)
        for n in (1e3, 1e5, 1e7)
    ]
    fit = AlphaBeta.fit(samples)
    assert fit.alpha_s == pytest.approx(TRUE_AB.alpha_s, rel=1e-6)
    assert fit.beta_s_per_byte == pytest.approx(TRUE_AB.beta_s_per_byte, rel=1e-6)
    with pytest.raises(ValueError, match="unknown collective"):
        AlphaBeta.fit([("broadcast", 2, 1.0, 1.0)])


def test_prior_uses_the_collective_each_compressor_declares(model):
    # int8 payloads are all-gathered and random-k payloads all-reduced, whatever the spec
    # string looks like: the prior follows Compressor.summable from the registry
    menu = ActionMenu(compression=("none", "int8", "randomk:0.01", "topk:0.01"))
    m = SurrogateModel(menu, alpha_beta=TRUE_AB)
    m.world_size, m.compute_s = 4, 1e-3
    m.bytes_table = np.full(menu.size, 1e5)
    nvec = tuple(int(n) for n in menu.nvec)
    for c, gathered in enumerate((False, True, False, True)):
        flat = np.ravel_multi_index((c, 0, 0), nvec)
        comm = TRUE_AB.allgather_s(1e5 * 4, 4) if gathered else TRUE_AB.allreduce_s(1e5, 4)
        assert m._prior_s(np.array([flat]))[0] == pytest.approx(1e-3 + comm), menu.compression[c]


def test_fit_predicts_held_out_synthetic(model):
    mape = step_time_mape(model, synthetic_transitions(200, 1))
    print(f"synthetic held-out step-time MAPE {mape:.1f}%")
    assert mape < 8.0


def test_save_load_roundtrip(model, tmp_path):
    path = model.save(tmp_path / "m.joblib")
    loaded = SurrogateModel.load(path)
    df = synthetic_transitions(20, 3)
    np.testing.assert_allclose(loaded.predict_step_time(df), model.predict_step_time(df))
    (tmp_path / "bad.joblib").write_bytes(b"")
    import joblib

    joblib.dump({"x": 1}, tmp_path / "bad.joblib")
    with pytest.raises(ValueError, match="not a commgym surrogate"):
        SurrogateModel.load(tmp_path / "bad.joblib")
    joblib.dump({"format": "commgym-surrogate", "version": 1, "model": model}, tmp_path / "v1")
    with pytest.raises(ValueError, match=r"version 1 .*refit"):
        SurrogateModel.load(tmp_path / "v1")
    (tmp_path / "text.joblib").write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(ValueError, match="not a commgym surrogate"):
        SurrogateModel.load(tmp_path / "text.joblib")


def test_same_spaces_as_real_env_and_gymnasium_contract(model, tmp_path):
    path = model.save(tmp_path / "m.joblib")
    env = gym.make("commgym/Surrogate-v1", model_path=str(path), time_budget_s=0.5)
    ref = ObservationBuilder(MENU, 2, 26122).space
    assert env.observation_space == ref
    assert env.action_space == gym.spaces.MultiDiscrete(MENU.nvec)
    assert env.observation_space.shape == (len(OBSERVATION_FIELDS),)
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


def test_seeded_episodes_repeat_and_truncate_on_budget(model):
    env = SurrogateEnv(model, time_budget_s=0.2)

    def episode(seed):
        obs, _ = env.reset(seed=seed)
        out, done, info = [obs], False, {}
        while not done:
            obs, _, term, trunc, info = env.step(np.array([1, 1, 1]))
            out.append(obs)
            done = term or trunc
            assert info["measured"]["step_time_s"] > 0
        return np.array(out), info, term, trunc

    a, info, term, trunc = episode(5)
    b, _, _, _ = episode(5)
    np.testing.assert_array_equal(a, b)
    assert trunc and not term and info["reason"] == "time_budget"
    assert info["train_time_s"] >= 0.2
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.array([0, 0, 0]))
    with pytest.raises(ValueError):
        env.reset()
        env.step(np.array([9, 0, 0]))


def test_divergence_terminates_with_zero_reward(model):
    env = SurrogateEnv(model, time_budget_s=10.0)
    env._p_div = [1.0] * MENU.size
    env.reset(seed=0)
    _, reward, term, trunc, info = env.step(np.array([0, 0, 0]))
    assert term and not trunc and reward == 0.0 and info["reason"] == "diverged"


def test_menu_mismatch_raises(model):
    with pytest.raises(ValueError, match="differs"):
        SurrogateEnv(
            model, action_menu={"compression": ["none"], "bucket_mb": [1], "sync_period": [1]}
        )


def test_cross_traffic_is_refused_with_what_to_do(model):
    with pytest.raises(ValueError, match="not competing flows; learn on real ranks"):
        SurrogateEnv(model, network="1gbit", cross_traffic="1flow")


def test_a_probe_at_reset_is_refused_with_what_to_do(model):
    with pytest.raises(ValueError, match=r"probe_at='reset'.*env_kind: sim\) or on real ranks"):
        SurrogateEnv(model, probe_bytes=65536, probe_at="reset")
    SurrogateEnv(model, probe_bytes=0, probe_at="reset")  # no probe: nothing to refuse


@pytest.mark.expensive
def test_throughput_over_10k_steps_per_second(model):
    env = SurrogateEnv(model, time_budget_s=6.0)
    rate = benchmark_steps(env, 20000)
    print(f"surrogate: {rate:,.0f} steps/s")
    # >= 10k/s on an idle core (about 50k/s measured); loose bound for loaded CI machines
    assert rate > 5000


class _FakeEnv(gym.Env):
    """Minimal env with AllReduce-v1's info shape."""

    def __init__(self):
        self.observation_space = ObservationBuilder(MENU, 2, 10).space
        self.action_space = gym.spaces.MultiDiscrete(MENU.nvec)
        self.n = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = 0
        return self.observation_space.low.copy(), {"eval_loss": 2.0, "episode_seed": 7}

    def step(self, action):
        self.n += 1
        m = {k: 0.001 for k in ("train_time_s", "step_time_s", "iter_mean_s", "compute_s")}
        m.update(
            comm_wait_s=0.0, compress_s=0.0, comm_s=0.0, bytes_per_step=10.0, bytes_total=50.0,
            train_loss=1.5, eval_loss=2.0 - 0.1 * self.n, eval_acc=0.5, eval_s=0.0,
            grad_norm=1.0, compression_error=None, nonfinite=False, samples=8, steps=5,
        )  # fmt: skip
        info = {
            "config": str(MENU.decode(np.asarray(action))),
            "action": MENU.decode(np.asarray(action)).to_dict(),
            "measured": m, "reason": None, "decision": self.n, "diverged": False,
        }  # fmt: skip
        return self.observation_space.low.copy(), 0.1, False, self.n >= 3, info


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_transition_recorder_reads_info(tmp_path, suffix):
    rec = TransitionRecorder(_FakeEnv(), tmp_path / f"t{suffix}")
    rec.reset(seed=0)
    for _ in range(3):
        rec.step(np.array([1, 0, 2]))
    rec.close()
    df = read_transitions(tmp_path / f"t{suffix}")
    assert len(df) == 3
    assert list(df["prev_eval_loss"]) == pytest.approx([2.0, 1.9, 1.8])
    assert df["a_period"].tolist() == [2, 2, 2] and df["sync_period"].tolist() == [4, 4, 4]
    assert df["held"].tolist() == [1, 2, 3]  # the same configuration three times in a row
    assert {"obs_step_time_s", "step_time_s", "bytes_per_step", "reward"} <= set(df.columns)


#: The default scenario of `commgym train` (experiments/configs/default.yaml).
SCENARIO = {
    "workload": "mlp-digits", "world_size": 2, "steps_per_decision": 10, "time_budget_s": 2.0,
    "reward": "time_to_target", "target_loss": 0.2,
}  # fmt: skip


# Collecting 600 real decisions and fitting takes 2-3 min on an idle 2-core machine and
# several times that next to other CPU-heavy jobs: whichever test first needs the real
# fixtures gets a longer timeout.
REAL_DATA_TIMEOUT = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def real_env():
    env = gym.make("commgym/AllReduce-v1", **SCENARIO)
    yield env
    env.close()


@pytest.fixture(scope="module")
def real_datasets(real_env, tmp_path_factory):
    """Real decisions of the default scenario: 400 to fit, 200 held out (another seed)."""
    from commgym.env.surrogate import bench_collectives
    from commgym.experiments.collect import collect_transitions

    tmp = tmp_path_factory.mktemp("real")
    t0 = time.perf_counter()
    real_env.reset(seed=0)
    samples = bench_collectives(real_env.unwrapped.cluster)
    a = collect_transitions(real_env, tmp / "a.csv", 400, "sticky", seed=1)
    b = collect_transitions(real_env, tmp / "b.csv", 200, "sticky", seed=2)
    print(f"collected 400 + 200 real decisions in {time.perf_counter() - t0:.1f} s")
    return samples, read_transitions(a), read_transitions(b)


@pytest.fixture(scope="module")
def real_model(real_datasets, tmp_path_factory):
    samples, a, _ = real_datasets
    model = SurrogateModel(MENU, alpha_beta=AlphaBeta.fit(samples)).fit(a)
    return model, model.save(tmp_path_factory.mktemp("model") / "s.joblib")


def _real_mape(real_datasets, real_model) -> tuple[float, float]:
    _, _, b = real_datasets
    mape, floor = step_time_mape(real_model[0], b), step_time_noise_floor(b)
    print(
        f"real held-out step-time MAPE {mape:.1f}% (noise floor of the held-out set {floor:.1f}%)"
    )
    return mape, floor


@REAL_DATA_TIMEOUT
def test_real_fit_reproduces_recorded_bytes_and_predicts_positive_times(real_datasets, real_model):
    # machine-independent facts of a fit on real decisions: byte counts per configuration
    # are deterministic, so the model's table equals every held-out record of a
    # configuration it has seen; step-time predictions are finite and positive
    _, a, b = real_datasets
    model = real_model[0]
    nvec = tuple(int(n) for n in MENU.nvec)

    def flat(df):
        return np.ravel_multi_index(
            df[["a_compression", "a_bucket", "a_period"]].to_numpy().T, nvec
        )

    seen = set(flat(a).tolist())
    held = flat(b)
    mask = np.isin(held, list(seen))
    assert mask.sum() >= 0.5 * len(b), "held-out set shares few configurations with the fit set"
    np.testing.assert_allclose(
        model.bytes_table[held[mask]], b["bytes_per_step"].to_numpy(float)[mask], rtol=1e-9
    )
    pred = model.predict_step_time(b)
    assert np.all(np.isfinite(pred)) and np.all(pred > 0)
    assert np.isfinite(step_time_mape(model, b)) and np.isfinite(step_time_noise_floor(b))


@pytest.mark.expensive
def test_real_held_out_mape_near_noise_floor(real_datasets, real_model):
    # the floor is what an oracle knowing the held-out set's own per-configuration step-time
    # distributions scores (9-19 % measured on this shared 2-core VM); the rest of the error
    # is the machine's speed drifting between the two collections (medians move 10-20 %
    # from minute to minute), which a model of the configuration cannot know: measured
    # excess 5-9 points on an otherwise idle machine, 15 next to another CPU-heavy job
    mape, floor = _real_mape(real_datasets, real_model)
    assert mape <= floor + 12.0


@pytest.mark.expensive
def test_real_held_out_mape_target(real_datasets, real_model):
    # the accuracy target (<= 15 %); below the measurement noise of many held-out sets here
    assert _real_mape(real_datasets, real_model)[0] <= 15.0


def _static_runs(path, **env_kw) -> tuple[list[str], dict[str, list]]:
    """Each menu entry held for three seeded surrogate episodes: entries that stall, and
    the training times of the episodes that reached the target (None otherwise)."""
    env = SurrogateEnv(path, **{**SCENARIO, **env_kw})
    stalled, times = [], {}
    for flat in range(MENU.size):
        a = np.array(np.unravel_index(flat, tuple(int(n) for n in MENU.nvec)))
        name = str(MENU.decode(a))
        times[name] = []
        for seed in range(3):
            env.reset(seed=seed)
            done, info = False, {}
            while not done:
                _, _, term, trunc, info = env.step(a)
                done = term or trunc
            reached = info["reason"] == "target_reached"
            times[name].append(info["train_time_s"] if reached else None)
        if sum(t is not None for t in times[name]) < 2:
            stalled.append(name)
    print(f"stalled on the surrogate: {stalled}")
    return stalled, times


@REAL_DATA_TIMEOUT
def test_surrogate_learning_tracks_real_static_runs(real_model):
    """Static configurations reach the target on the surrogate within a decision budget.

    On real ranks every menu entry reaches held-out loss 0.2 (within 0.19-1.0 s of training
    on an idle 2-core machine, i.e. well under 100 decisions). The learning progress per
    decision does not depend on the machine's speed, so the wall-time budget is lifted and
    episodes are capped at 200 decisions instead. The surrogate is fitted to 400
    exploration decisions (about 9 per entry); entries whose progress near the target it
    under-predicts (measured: top-k at H=1) may stall, so at least 80 % must reach it.
    """
    stalled, _ = _static_runs(real_model[1], time_budget_s=1e9, max_decisions=200)
    assert len(stalled) <= 0.2 * MENU.size, stalled


@pytest.mark.expensive
def test_surrogate_dynamics_track_real_static_runs(real_model):
    """Within the scenario's 2 s budget, as on real ranks, and in a plausible time.

    Needs data collected on an otherwise idle machine: next to other CPU-heavy jobs the
    recorded step times are several times longer and 21 of 45 entries stalled.
    """
    stalled, times = _static_runs(real_model[1])
    for name, ts in times.items():
        reached = [t for t in ts if t is not None]
        if len(reached) >= 2:
            # not faster than the fastest real entry can be (0.19 s measured)
            assert float(np.median(reached)) > 0.05, (name, ts)
    assert len(stalled) <= 0.2 * MENU.size, stalled


def _ppo_on_surrogate(real_model):
    from commgym.agents import make_agent

    _, path = real_model
    sim = gym.make("commgym/Surrogate-v1", model_path=str(path), **SCENARIO)
    t0 = time.perf_counter()
    ppo = make_agent("ppo", sim, seed=0, n_steps=256, batch_size=64, n_epochs=4).learn(20000)
    return sim, ppo, time.perf_counter() - t0


@REAL_DATA_TIMEOUT
def test_ppo_learned_on_surrogate_runs_on_real(real_env, real_model):
    """PPO learns only on the surrogate, beats ``random`` there, then runs on real ranks.

    The surrogate is a seeded simulator, so the comparison on it does not depend on the
    machine's speed; on real ranks only the episode's contract is checked here (the
    return comparison is ``test_ppo_on_surrogate_beats_random_on_real``, expensive).
    """
    from commgym.agents import make_agent
    from commgym.agents.rollout import rollout

    sim, ppo, _ = _ppo_on_surrogate(real_model)
    rnd = make_agent("random", sim, seed=0)
    seeds = range(1000, 1008)
    sim_ret = {
        name: np.mean([rollout(sim, agent, s).episode_return for s in seeds])
        for name, agent in (("ppo", ppo), ("random", rnd))
    }
    assert sim_ret["ppo"] > sim_ret["random"], sim_ret
    ep = rollout(real_env, ppo, 1000, target_loss=SCENARIO["target_loss"])
    assert np.isfinite(ep.episode_return) and ep.decisions >= 1


@pytest.mark.expensive
def test_ppo_on_surrogate_beats_random_on_real(real_env, real_model):
    """PPO learns only on the surrogate, then runs on real ranks against ``random``."""
    from commgym.agents import make_agent
    from commgym.agents.rollout import rollout

    sim, ppo, learn_s = _ppo_on_surrogate(real_model)
    rnd = make_agent("random", real_env, seed=0)
    seeds = range(1000, 1004)
    res = {
        name: [rollout(real_env, agent, s, target_loss=SCENARIO["target_loss"]) for s in seeds]
        for name, agent in (("ppo", ppo), ("random", rnd))
    }
    sim_ret = np.mean([rollout(sim, ppo, s).episode_return for s in seeds])
    ret = {k: float(np.mean([e.episode_return for e in v])) for k, v in res.items()}
    ttt = {k: [e.time_to_target_s for e in v] for k, v in res.items()}
    print(
        f"PPO learned 20,000 surrogate decisions in {learn_s:.1f} s; real return "
        f"ppo {ret['ppo']:.3f} vs random {ret['random']:.3f}; time to target ppo {ttt['ppo']}, "
        f"random {ttt['random']}; surrogate return of ppo {sim_ret:.3f}"
    )
    assert ret["ppo"] > ret["random"]
