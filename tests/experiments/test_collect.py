"""`commgym collect` and `train --env surrogate`: what they log and write.

`commgym bench surrogate` and `fit-surrogate` run as the docs show them (the surrogate
rows of tests/experiments/readme_commands.py), on the file `commgym collect` wrote.
"""

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
            "collect", "--decisions", "12", "--steps-per-decision", "1", "--policy", "grid",
            "--out", str(tmp / "t.parquet"), "--fit", str(tmp / "s.joblib"),
            "--tracking-uri", uri,
        ],
        tmp,
    )  # fmt: skip
    return tmp, uri, out


def test_collect_logs_dataset_run(collected):
    import pandas as pd

    tmp, uri, out = collected
    assert "12 decisions" in out and (tmp / "s.joblib").exists()
    df = pd.read_parquet(tmp / "t.parquet")
    assert len(df) == 12 and df["workload"].eq("mlp-digits").all()
    assert df["world_size"].eq(2).all() and df["config"].nunique() == 12  # grid order
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("commgym")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.tags["commgym.command"] == "collect" and run.data.params["policy"] == "grid"
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "t.parquet" in names and "t.bench.json" in names


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
    with pytest.raises(ValueError, match=r"env_kind must be one of \['real', 'surrogate', 'sim'\]"):
        load_run_config("smoke", {"env_kind": "simulator"})
    assert load_run_config("smoke", {"env_kind": "sim"}).calibration is None  # calibrate first
    cfg = load_run_config("smoke", {"env_kind": "surrogate"})
    assert cfg.surrogate is None and cfg.surrogate_decisions == 400  # collect and fit first
    cfg = load_run_config("surrogate")
    assert cfg.env_kind == "surrogate" and cfg.surrogate
    assert load_run_config("real").env_kind == "real"
    with pytest.raises(ValueError, match="surrogate_decisions"):
        load_run_config("default", {"surrogate_decisions": 0})


def test_train_with_missing_surrogate_file_fails_clearly(tmp_path):
    from tests.experiments.cli_helpers import cli

    proc = cli(
        ["train", "--config", "surrogate", "--surrogate", str(tmp_path / "none.joblib")],
        tmp_path,
    )
    assert proc.returncode == 2 and "not found" in proc.stderr
    assert "commgym collect" in proc.stderr and not (tmp_path / "mlflow.db").exists()
    (tmp_path / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    for args in (
        ["train", "--config", "surrogate", "--surrogate", str(tmp_path / "passwd")],
        ["bench", "surrogate", "--surrogate", str(tmp_path / "passwd")],
    ):
        proc = cli(args, tmp_path)
        assert proc.returncode == 2 and "not a commgym surrogate" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and not (tmp_path / "mlflow.db").exists()
