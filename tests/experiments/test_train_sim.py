"""`commgym train --env sim`: learning in commgym/Sim-v1, evaluation on real ranks.

A tiny real calibration (one seed, 2 gloo ranks, a 4-entry menu, as
tests/env/test_sim_calibration.py) feeds a PPO run of the smoke size through the CLI.
"""

from __future__ import annotations

import pytest
import yaml
from mlflow import MlflowClient

from commgym.env import EnvConfig
from commgym.experiments.calibrate_sim import calibrate_sim
from tests.experiments.cli_helpers import cli, cli_ok

MENU = {"compression": ["none", "fp16"], "bucket_mb": [25.0], "sync_period": [1, 2]}
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
def scenario(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sim-train")
    cal = tmp / "cal.json"
    calibrate_sim(
        EnvConfig(**{**ENV, "time_budget_s": 20.0}), cal, seeds=(900_001,), budget_s=10.0,
        switch_episodes=0, rates=[], repeats=1,
    )  # fmt: skip
    (tmp / "sim.yaml").write_text(yaml.safe_dump(SCENARIO))
    return tmp, cal


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
    assert "ppo (learned)" in out and "sim-to-real gap" in out
    assert (tmp / "out" / "policy.zip").exists()
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
    assert {"cal.json", "policy.zip"} <= names, names


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
