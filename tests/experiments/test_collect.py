"""`commgym collect`, `fit-surrogate`, `bench surrogate` and `train --env surrogate`."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from commgym.experiments.config import load_run_config
from tests.experiments.cli_helpers import cli_ok as _run


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("collect")
    uri = f"sqlite:///{tmp}/mlflow.db"
    out = _run(
        [
            "collect", "--decisions", "40", "--steps-per-decision", "2", "--policy", "grid",
            "--out", str(tmp / "t.parquet"), "--fit", str(tmp / "s.joblib"),
            "--tracking-uri", uri,
        ],
        tmp,
    )  # fmt: skip
    return tmp, uri, out


def test_collect_logs_dataset_run(collected):
    import pandas as pd

    tmp, uri, out = collected
    assert "40 decisions" in out and (tmp / "s.joblib").exists()
    df = pd.read_parquet(tmp / "t.parquet")
    assert len(df) == 40 and df["workload"].eq("mlp-digits").all()
    assert df["world_size"].eq(2).all() and df["config"].nunique() == 40  # grid order
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("commgym")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.tags["commgym.command"] == "collect" and run.data.params["policy"] == "grid"
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "t.parquet" in names and "t.bench.json" in names


def test_bench_surrogate_cli(collected):
    tmp, _, _ = collected
    out = _run(["bench", "surrogate", "--surrogate", str(tmp / "s.joblib"), "--steps", "2000"], tmp)
    assert "env steps/s" in out


def test_train_on_surrogate_evaluates_on_real_ranks(collected):
    tmp, uri, _ = collected
    out = _run(
        [
            "train", "--config", "smoke", "--env", "surrogate", "--surrogate",
            str(tmp / "s.joblib"), "--tracking-uri", uri, "--output-dir", str(tmp / "out"),
            "--episodes", "1", "--baselines", "random",
        ],
        tmp,
    )  # fmt: skip
    assert "on the surrogate" in out and "sim-to-real gap" in out and "random" in out
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("commgym-smoke")
    (parent,) = [
        r
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("commgym.command") == "train"
    ]
    assert "sim2real/gap" in parent.data.metrics
    assert parent.data.params["env_kind"] == "surrogate"


def test_config_env_kind_validation():
    with pytest.raises(ValueError, match="env_kind"):
        load_run_config("smoke", {"env_kind": "sim"})
    with pytest.raises(ValueError, match="surrogate"):
        load_run_config("smoke", {"env_kind": "surrogate"})
    cfg = load_run_config("surrogate")
    assert cfg.env_kind == "surrogate" and cfg.surrogate
