"""`commgym train --env sim`: learning in commgym/Sim-v1, evaluation on real ranks.

The session's tiny real calibration (tests/conftest.py: one seed, 2 gloo ranks, a 4-entry
menu) feeds a PPO run of the smoke size through the CLI.
"""

from __future__ import annotations

import pytest
import yaml
from mlflow import MlflowClient

from tests.conftest import TINY_MENU as MENU
from tests.experiments.cli_helpers import cli, cli_ok

ENV = {
    "workload": "mlp-digits",
    "world_size": 2,
    "steps_per_decision": 2,
    "time_budget_s": 0.5,
    "max_decisions": 3,
    "reward": "time_to_target",
    "target_loss": 1.0,
    "action_menu": MENU,
}
SCENARIO = {
    "agent": "ppo",
    "agent_kwargs": {"ppo": {"n_steps": 8, "batch_size": 8, "n_epochs": 1}},
    "timesteps": 32,
    "env_kind": "sim",
    "episodes": 1,
    "baselines": [],
    "env": ENV,
    "experiment": "commgym-sim-test",
}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory, tiny_calibration):
    """The smoke-sized scenario file and the session's tiny calibration (tests/conftest.py)."""
    tmp = tmp_path_factory.mktemp("sim-train")
    (tmp / "sim.yaml").write_text(yaml.safe_dump(SCENARIO))
    return tmp, tiny_calibration[1]


def test_train_learns_in_the_simulator_and_evaluates_on_real_ranks(scenario):
    tmp, cal = scenario
    uri = f"sqlite:///{tmp}/mlflow.db"
    out = cli_ok(
        ["train", "--config", str(tmp / "sim.yaml"), "--calibration", str(cal),
         "--tracking-uri", uri, "--output-dir", str(tmp / "out")],
        tmp,
    )  # fmt: skip
    assert "training ppo on the simulator" in out and "learned in" in out
    assert f"simulator calibration {cal}" in out and "real decisions" in out
    assert "ppo (learned)" in out and "sim-to-real gap: simulator return" in out
    assert "simulator fidelity" in out  # bench sim's gates of this calibration, or none
    assert (tmp / "out" / "policy.zip").exists()
    # the simulator's learning keeps one row per episode, not one per decision
    import csv

    rows = list(csv.DictReader((tmp / "out" / "learning-episodes.csv").open()))
    assert rows and int(rows[-1]["decisions"]) <= 32 + 8
    assert {"episode_return", "episode_length", "most_played", "reason"} <= set(rows[0])
    assert sum(int(r["episode_length"]) for r in rows) == int(rows[-1]["decisions"])
    assert not (tmp / "out" / "learning-decisions.csv").exists()
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("commgym-sim-test")
    (parent,) = [
        r
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("commgym.command") == "train"
    ]
    assert parent.data.params["env_kind"] == "sim"
    assert "sim2real/gap" in parent.data.metrics
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"cal.json", "policy.zip", "sim_fidelity.txt"} <= names, names


def test_a_calibration_that_cannot_serve_the_scenario_is_refused_before_ranks_start(scenario):
    tmp, cal = scenario
    missing = cli(
        ["train", "--config", str(tmp / "sim.yaml"), "--calibration", str(tmp / "nope.json"),
         "--output-dir", str(tmp / "o1")],
        tmp,
    )  # fmt: skip
    assert missing.returncode != 0
    assert "calibration" in missing.stderr and "not found" in missing.stderr
    assert "commgym calibrate-sim" in missing.stderr and "Traceback" not in missing.stderr
    other = cli(
        ["train", "--config", str(tmp / "sim.yaml"), "--calibration", str(cal),
         "--world-size", "3", "--output-dir", str(tmp / "o2")],
        tmp,
    )  # fmt: skip
    assert other.returncode != 0 and "world_size=3 (calibrated: 2)" in other.stderr
    assert "Traceback" not in other.stderr


def test_mpc_plans_over_the_runs_calibration(scenario):
    """``--calibration`` is also the record ``mpc`` plans over (no agent_kwargs needed)."""
    tmp, cal = scenario
    out = cli_ok(
        ["train", "--config", str(tmp / "sim.yaml"), "--agent", "mpc", "--calibration", str(cal),
         "--tracking-uri", f"sqlite:///{tmp}/mlflow.db", "--output-dir", str(tmp / "mpc")],
        tmp,
    )  # fmt: skip
    assert "mpc (learned)" in out and "sim-to-real gap" in out
    config = yaml.safe_load((tmp / "mpc" / "config.yaml").read_text())
    assert config["agent_kwargs"]["mpc"]["calibration"] == str(cal)


def test_sim_randomize_redraws_the_link_trace_while_learning(tmp_path, monkeypatch):
    """``sim_randomize``: learning sees a new link trace per episode; the returned simulator
    (the sim-to-real gap's) keeps the scenario's own plan. The simulator's fixture calibration
    (tests/env/test_sim.py) stands in for a real one: no rank runs here."""
    from commgym.env.sim.randomize import RandomizedConditions
    from commgym.experiments.config import RunConfig
    from commgym.experiments.tracking import Tracker
    from commgym.experiments.train import learn_agent
    from tests.env.test_sim import _calibration, _env_cfg

    flaky = {"schedule": [[0, "10mbit"], [1.0, "100mbit"], [2.0, "10mbit"]], "shift_s": 0.2}
    _calibration().save(tmp_path / "cal.json")
    traces: list[list] = []
    reset = RandomizedConditions.reset

    def spied(self, *args, **kwargs):
        out = reset(self, *args, **kwargs)
        traces.append([list(p) for p in self.schedule])
        return out

    monkeypatch.setattr(RandomizedConditions, "reset", spied)
    cfg = RunConfig(
        agent="ppo", agent_kwargs={"ppo": {"n_steps": 16, "batch_size": 16, "n_epochs": 1}},
        timesteps=64, env=_env_cfg(network=flaky, probe_bytes=65536).to_dict(), env_kind="sim",
        calibration=str(tmp_path / "cal.json"), baselines=[], output_dir=str(tmp_path / "out"),
        sim_randomize={"length_jitter": 0.6, "rate_swap": 0.0},
    )  # fmt: skip
    (tmp_path / "out").mkdir()
    with Tracker(f"sqlite:///{tmp_path}/m.db", experiment="x").start_run("t") as run:
        _, _, sim = learn_agent(cfg, None, run, tmp_path / "out")
    assert len(traces) >= 2 and len({str(t) for t in traces}) == len(traces), traces
    assert all([s for _, s in t] == ["10mbit", "100mbit", "10mbit"] for t in traces)
    assert sim.unwrapped.config.network_plan is cfg.env_config.network_plan
    with pytest.raises(ValueError, match="which has no schedule"):
        RunConfig(env_kind="sim", sim_randomize={"length_jitter": 0.4})
    RunConfig(env_kind="sim", sim_randomize={"timing_noise": 0.1})  # timing alone: any link
    with pytest.raises(ValueError, match="env_kind is 'real'"):
        RunConfig(env=cfg.env, sim_randomize={"length_jitter": 0.4})
    with pytest.raises(ValueError, match="sim_randomize: compute_scale must be"):
        RunConfig(**{**cfg.to_dict(), "sim_randomize": {"compute_scale": [0, 1]}})


def test_sim_warm_start_clones_the_reactive_oracle_before_rl(tmp_path, capsys):
    """``sim_warm_start``: the oracle's episodes are cloned on the randomised learning env,
    then RL runs its ``timesteps``; the fit is printed and logged. The fixture calibration of
    tests/env/test_sim.py stands in for a real one: no rank runs here."""
    from mlflow import MlflowClient

    from commgym.experiments.config import RunConfig
    from commgym.experiments.tracking import Tracker
    from commgym.experiments.train import learn_agent
    from tests.env.test_sim import _calibration, _env_cfg

    # a schedule whose target the fixture's curves reach (the oracle has advice)
    flaky = {"schedule": [[0, "10gbit"], [4, "10mbit"], [6.4, "10gbit"]], "shift_s": 0.5}
    _calibration().save(tmp_path / "cal.json")
    kwargs = {"n_steps": 16, "batch_size": 16, "n_epochs": 1, "probe": False, "history": 2}
    cfg = RunConfig(
        agent="ppo", agent_kwargs={"ppo": kwargs}, timesteps=32,
        env=_env_cfg(network=flaky, probe_bytes=65536).to_dict(), env_kind="sim",
        calibration=str(tmp_path / "cal.json"), baselines=[], output_dir=str(tmp_path / "out"),
        sim_randomize={"length_jitter": 0.3}, sim_warm_start={"episodes": 3, "epochs": 5},
    )  # fmt: skip
    (tmp_path / "out").mkdir()
    uri = f"sqlite:///{tmp_path}/m.db"
    with Tracker(uri, experiment="x").start_run("t") as run:
        agent, _, _ = learn_agent(cfg, None, run, tmp_path / "out")
        run_id = run.run_id
    out = capsys.readouterr().out
    assert "cloned" in out and "of 3 expert episodes (the simulator's reactive oracle)" in out
    assert "training ppo" in out
    assert agent.model.num_timesteps >= 32  # RL ran after the clone
    metrics = MlflowClient(tracking_uri=uri).get_run(run_id).data.metrics
    assert metrics["train/bc_episodes"] == 3 and 0 <= metrics["train/bc_accuracy"] <= 1
    with pytest.raises(ValueError, match="env_kind is 'real'"):
        RunConfig(env=cfg.env, sim_warm_start={"episodes": 3})
    with pytest.raises(ValueError, match="agent ppo or a2c"):
        RunConfig(agent="dqn", env_kind="sim", sim_warm_start={"episodes": 3})
    with pytest.raises(ValueError, match="'episodes'"):
        RunConfig(env_kind="sim", sim_warm_start={"epochs": 3})
    with pytest.raises(ValueError, match=r"sim_warm_start\.episodes"):
        RunConfig(env_kind="sim", sim_warm_start={"episodes": 0})
    with pytest.raises(ValueError, match=r"opening 'topk:0\.5/25MB/H1' is not an entry.*valid: "):
        RunConfig(env_kind="sim", sim_warm_start={"episodes": 3, "opening": "topk:0.5/25MB/H1"})
    for opening in ("best", None, "none/25MB/H1"):
        RunConfig(env_kind="sim", sim_warm_start={"episodes": 3, "opening": opening})


def test_sim_warm_start_clones_mpc_into_a_policy_with_a_link_clock(tmp_path, capsys):
    """``sim_warm_start: {expert: mpc}``: mpc learns the links' dwells in the simulator,
    then its episodes are cloned into a probe-free PPO policy whose link clock reads mpc's
    timing filter and its belief (flaky-link-clock's recipe), with a DAgger round after."""
    import warnings

    from mlflow import MlflowClient

    from commgym.agents.imitation import AgentExpert
    from commgym.env.sim.wire import LinkFit
    from commgym.experiments.config import RunConfig
    from commgym.experiments.tracking import Tracker
    from commgym.experiments.train import learn_agent
    from tests.env.test_sim import _calibration, _env_cfg

    flaky = {"schedule": [[0, "10gbit"], [4, "10mbit"], [6.4, "10gbit"]], "shift_s": 0.5}
    cal = _calibration()
    cal.wire.links[10**10] = {k: LinkFit(3e-4, 1.0) for k in ("allreduce", "allgather")}
    cal.save(tmp_path / "cal.json")
    kwargs = {"n_steps": 16, "batch_size": 16, "n_epochs": 1, "history": 2, "probe": False,
              "link_clock": {"reader": "mpc", "learn_decisions": 40, "belief": True}}  # fmt: skip
    warm = {"episodes": 3, "epochs": 5, "expert": "mpc", "expert_timesteps": 40,
            "expert_kwargs": {"link_from": "timing"}, "dagger_rounds": 1,
            "regret_scale_s": 0.1}  # fmt: skip
    cfg = RunConfig(
        agent="ppo", agent_kwargs={"ppo": kwargs}, timesteps=16,
        env=_env_cfg(network=flaky, probe_bytes=65536).to_dict(), env_kind="sim",
        calibration=str(tmp_path / "cal.json"), baselines=[], output_dir=str(tmp_path / "out"),
        sim_warm_start=warm,
    )  # fmt: skip
    (tmp_path / "out").mkdir()
    uri = f"sqlite:///{tmp_path}/m.db"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Tracker(uri, experiment="x").start_run("t") as run:
            agent, _, _ = learn_agent(cfg, None, run, tmp_path / "out")
            run_id = run.run_id
    out = capsys.readouterr().out
    assert "mpc learning the links" in out and "(the model-predictive agent)" in out
    flat = " ".join(out.split())  # the console wraps long lines
    assert "(1 DAgger rounds; before the last round's fit it played the expert's" in flat
    metrics = MlflowClient(tracking_uri=uri).get_run(run_id).data.metrics
    assert metrics["train/bc_episodes"] == 6 and metrics["train/bc_skipped"] == 0
    assert 0.0 <= metrics["train/bc_dagger_agreement"] <= 1.0
    assert agent.link_clock["belief"] is True
    # the clock reads mpc's timing filter over the run's calibration, learned in the simulator
    assert agent.link_clock["calibration"] == str(tmp_path / "cal.json")
    assert agent._clock_filter.prior_decisions > 0 and agent.model.num_timesteps >= 16
    with pytest.raises(TypeError, match="acts on the simulator's observation"):
        AgentExpert(agent)(object())
    with pytest.raises(ValueError, match="expert must be 'oracle' or 'mpc'"):
        RunConfig(env_kind="sim", sim_warm_start={"episodes": 3, "expert": "dp"})
    with pytest.raises(ValueError, match="are the mpc expert's"):
        RunConfig(env_kind="sim", sim_warm_start={"episodes": 3, "expert_timesteps": 9})
    with pytest.raises(ValueError, match="opening is the oracle expert's"):
        RunConfig(env_kind="sim", sim_warm_start={"episodes": 3, "expert": "mpc", "opening": None})
    with pytest.raises(ValueError, match="dagger_rounds"):
        RunConfig(env_kind="sim", sim_warm_start={"episodes": 3, "dagger_rounds": -1})
    with pytest.raises(ValueError, match="only the mpc expert gives"):
        RunConfig(env_kind="sim", sim_warm_start={"episodes": 3, "regret_scale_s": 0.1})
    with pytest.raises(ValueError, match="regret_scale_s must be a number > 0"):
        RunConfig(
            env_kind="sim", sim_warm_start={"episodes": 3, "expert": "mpc", "regret_scale_s": 0}
        )


def test_a_learner_whose_searches_are_its_own_size_shows_their_bars(tmp_path, monkeypatch, capsys):
    """``rollout-table`` searches a fixed number of episodes whatever ``timesteps`` says:
    the recipe lets its searches draw their own bars (``progress_bar=True``) instead of a
    bar over ``timesteps`` that fills at once (issue 39 item 6). A stand-in agent records
    the call; the recipe around it is the real one."""
    import warnings
    from typing import ClassVar

    from commgym.agents.base import Preparation
    from commgym.env.sim import SimEnv
    from commgym.experiments import train
    from commgym.experiments.config import RunConfig
    from commgym.experiments.tracking import Tracker
    from tests.env.test_sim import _calibration, _env_cfg

    calls = []

    class Searcher:
        oracle = False
        searches_when_learning = True
        hyperparams: ClassVar[dict] = {}
        preparation = Preparation(1.0, 42)

        def learn(self, total_timesteps=None, progress_bar=False, callback=None):
            calls.append((total_timesteps, progress_bar, callback))
            return self

        def save(self, path):
            return path

    monkeypatch.setattr(train, "build_agent", lambda *a, **k: Searcher())
    cfg = RunConfig(agent="rollout-table", timesteps=1, env=_env_cfg(network="10mbit").to_dict(),
                    baselines=[], output_dir=str(tmp_path))  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = SimEnv(_calibration(), cfg.env_config)
    with Tracker(f"sqlite:///{tmp_path}/m.db", experiment="x").start_run("t") as run:
        _, cost, _ = train.learn_agent(cfg, env, run, tmp_path)
    assert calls == [(1, True, None)]
    assert "its searches, one bar each" in capsys.readouterr().out
    assert cost.real_decisions == 42  # what its searches cost, not timesteps
