"""MLflow tracking: runs, batching, concurrency, failure tolerance, the env wrapper."""

from __future__ import annotations

import csv
import math
import multiprocessing as mp
import re
import socket
import time
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from mlflow import MlflowClient

from commgym.experiments.tracking import (
    RunLogger,
    Tracker,
    TrackingWrapper,
    default_tracking_uri,
    reproducibility_params,
    ui_command,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One SQLite store for the module (initialising a fresh one takes seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


@pytest.fixture(scope="module")
def tracker(store) -> Tracker:
    t = Tracker(store, experiment="tests")
    assert t.enabled
    return t


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_default_uri_and_ui_command(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = default_tracking_uri(tmp_path)
    assert uri == f"sqlite:///{tmp_path.resolve().as_posix()}/mlflow.db"
    monkeypatch.chdir(tmp_path)
    assert default_tracking_uri() == uri
    assert ui_command(uri) == f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert default_tracking_uri(tmp_path) == "http://127.0.0.1:5000"


def test_parent_and_child_runs_round_trip(tracker, store, tmp_path, monkeypatch):
    # an inherited fluent run id must not leak into the explicit parent link
    monkeypatch.setenv("MLFLOW_RUN_ID", "0" * 32)
    cfg = {"env": {"world_size": 2, "menu": {"bucket_mb": [1, 4]}}, "agent": "ppo"}
    with tracker.start_run("parent", params=cfg, tags={"kind": "sweep"}) as parent:
        parent.log_params(reproducibility_params())
        children = []
        for seed in range(2):
            with tracker.start_run(
                f"seed-{seed}", params={"seed": seed}, parent_run_id=parent.run_id
            ) as child:
                for step in range(5):
                    child.log_metrics({"train/loss": 1.0 / (step + 1), "env/reward": step}, step)
                f = tmp_path / f"note{seed}.txt"
                f.write_text("hello")
                child.log_artifact(f)
                child.log_artifact(f, artifact_path="sub")
                child.log_text("text", "report/readme.md")
                child.log_dict({"a": 1, "b": [1, 2]}, "config.yaml")
                child.set_tags({"phase": "train"})
                children.append(child.run_id)

    client = MlflowClient(tracking_uri=store)
    p = client.get_run(parent.run_id)
    assert p.info.status == "FINISHED"
    assert p.data.params["env.world_size"] == "2"
    assert p.data.params["env.menu.bucket_mb"] == "[1, 4]"
    assert p.data.params["agent"] == "ppo"
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", p.data.params["git.commit"])
    assert p.data.tags["kind"] == "sweep"
    assert "mlflow.parentRunId" not in p.data.tags
    for seed, run_id in enumerate(children):
        r = client.get_run(run_id)
        assert r.info.status == "FINISHED"
        assert r.info.run_name == f"seed-{seed}"
        assert r.data.tags["mlflow.parentRunId"] == parent.run_id
        assert r.data.tags["phase"] == "train"
        assert r.data.params["seed"] == str(seed)
        hist = client.get_metric_history(run_id, "train/loss")
        assert sorted((m.step, m.value) for m in hist) == [(s, 1.0 / (s + 1)) for s in range(5)]
        top = {a.path for a in client.list_artifacts(run_id)}
        assert {f"note{seed}.txt", "sub", "report", "config.yaml"} <= top
        assert [a.path for a in client.list_artifacts(run_id, "report")] == ["report/readme.md"]
        assert Path(r.info.artifact_uri.removeprefix("file://")).is_relative_to(
            Path(store.removeprefix("sqlite:///")).parent
        )


def test_exception_marks_run_failed(tracker):
    with pytest.raises(RuntimeError, match="boom"), tracker.start_run("failing") as run:
        run.log_metrics({"x": 1.0}, step=0)
        raise RuntimeError("boom")
    r = tracker.client.get_run(run.run_id)
    assert r.info.status == "FAILED"
    assert [m.step for m in tracker.client.get_metric_history(run.run_id, "x")] == [0]


def test_step_is_required_and_must_be_int(tracker):
    run = RunLogger(tracker, None)
    with pytest.raises(TypeError):
        run.log_metrics({"x": 1.0})  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="step"):
        run.log_metrics({"x": 1.0}, step=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="number"):
        run.log_metrics({"x": "fast"}, step=0)
    run.log_metrics({"x": np.float32(1.0), "y": None}, step=np.int64(3))


def test_10k_points_are_batched(tracker, monkeypatch):
    calls = []
    with tracker.start_run("many") as run:
        orig = tracker.client.log_batch

        def counting(*args, **kwargs):
            calls.append(len(kwargs.get("metrics", ())))
            return orig(*args, **kwargs)

        monkeypatch.setattr(tracker.client, "log_batch", counting)
        t0 = time.perf_counter()
        for step in range(5000):
            run.log_metrics({"a": step * 0.5, "b": -step}, step=step)
        run.flush()
        elapsed = time.perf_counter() - t0
    print(f"10,000 metric points logged in {elapsed:.2f} s with {len(calls)} log_batch calls")
    # the machine-independent fact behind the speed: ~20 batched calls, not 10,000 (the
    # wall time, 15 s next to other CPU-heavy jobs, is not asserted)
    assert len(calls) <= 25
    hist = tracker.client.get_metric_history(run.run_id, "a")
    assert len(hist) == 5000
    assert sorted(m.step for m in hist) == list(range(5000))
    assert run.points_logged == 10_000 and run.points_dropped == 0


def test_nonfinite_becomes_tags_not_numbers(tracker):
    with tracker.start_run("diverging") as run:
        run.log_metrics({"loss": 2.0, "grad": 1.0}, step=0)
        run.log_metrics({"loss": float("nan"), "grad": float("inf")}, step=1)
        run.log_metrics({"loss": float("nan"), "grad": 3.0}, step=2)
    r = tracker.client.get_run(run.run_id)
    assert r.data.tags["diverged"] == "true"
    assert r.data.tags["nonfinite.loss"].startswith("nan")
    assert "step 1" in r.data.tags["nonfinite.loss"]
    assert r.data.tags["nonfinite.grad"].startswith("inf")
    loss = tracker.client.get_metric_history(run.run_id, "loss")
    assert [(m.step, m.value) for m in loss] == [(0, 2.0)]
    grad = sorted((m.step, m.value) for m in tracker.client.get_metric_history(run.run_id, "grad"))
    assert grad == [(0, 1.0), (2, 3.0)]


def test_long_param_truncated_with_warning(tracker):
    with pytest.warns(UserWarning, match="truncated"), tracker.start_run("long") as run:
        run.log_params({"cmd": "x" * 7000})
    assert len(tracker.client.get_run(run.run_id).data.params["cmd"]) == 6000


def test_store_failures_warn_once_and_continue(tracker, monkeypatch):
    with tracker.start_run("broken-store") as run:

        def fail(*args, **kwargs):
            raise ConnectionError("server went away")

        monkeypatch.setattr(tracker.client, "log_batch", fail)
        monkeypatch.setattr(tracker.client, "log_artifact", fail)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(1200):
                run.log_metrics({"x": 1.0}, step=step)
            run.flush()
            run.log_artifact(__file__)
            run.log_artifact(__file__)
            run.set_tags({"a": "b"})
        monkeypatch.undo()
    msgs = [str(w.message) for w in caught]
    assert sum("log_metrics failed" in m for m in msgs) == 1
    assert sum("log_artifact failed" in m for m in msgs) == 1
    assert run.points_dropped == 1200
    assert tracker.client.get_run(run.run_id).info.status == "FINISHED"


def test_unreachable_server_degrades_to_noop_fast():
    uri = f"http://127.0.0.1:{_closed_port()}"
    t0 = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="unreachable"):
        t = Tracker(uri)
    with t.start_run("x", params={"a": 1}) as run:
        run.log_metrics({"m": 1.0}, step=0)
        run.log_text("t", "t.txt")
        run.flush()
    assert time.perf_counter() - t0 < 5.0
    assert not t.enabled and run.run_id is None


def test_silent_server_times_out():
    """A port that accepts connections but never answers must not hang the tracker."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        uri = f"http://127.0.0.1:{srv.getsockname()[1]}"
        t0 = time.perf_counter()
        with pytest.warns(RuntimeWarning, match="unreachable"):
            t = Tracker(uri, connect_timeout_s=0.5)
        assert time.perf_counter() - t0 < 3.0
    assert not t.enabled


def _concurrent_worker(uri: str, rank: int, n_steps: int) -> tuple[str | None, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker = Tracker(uri, experiment="concurrent")
        with tracker.start_run(f"rank-{rank}", params={"rank": rank}) as run:
            run.flush_every = 50  # many small batches: maximal write contention
            for step in range(n_steps):
                run.log_metrics({"loss": float(rank * 1000 + step), "rank": rank}, step=step)
    print(f"rank {rank}: {tracker.lock_retries} 'database is locked' retries")
    return run.run_id, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_four_processes_log_to_one_fresh_sqlite_store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    n_steps = 400
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.starmap(_concurrent_worker, [(uri, r, n_steps) for r in range(4)])
    for run_id, msgs in results:
        assert run_id is not None, msgs
        assert msgs == [], msgs
    client = MlflowClient(tracking_uri=uri)
    exps = [e for e in client.search_experiments() if e.name == "concurrent"]
    assert len(exps) == 1
    for rank, (run_id, _) in enumerate(results):
        r = client.get_run(run_id)
        assert r.info.status == "FINISHED"
        assert r.info.experiment_id == exps[0].experiment_id
        hist = client.get_metric_history(run_id, "loss")
        assert sorted((m.step, m.value) for m in hist) == [
            (s, float(rank * 1000 + s)) for s in range(n_steps)
        ]


# -- TrackingWrapper ------------------------------------------------------------------------


class FakeAllReduceEnv(gym.Env):
    """Returns info dicts shaped like ``AllReduceEnv``'s; episode ends after 3 steps."""

    COMPRESSION = ("none", "fp16", "int8", "topk:0.01", "powersgd:2")
    BUCKET_MB = (1.0, 4.0, 25.0)
    PERIOD = (1, 2, 4)

    def __init__(self, diverge_at: int | None = None):
        self.action_space = spaces.MultiDiscrete([5, 3, 3])
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.diverge_at = diverge_at
        self.total = 0
        self.closed = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0.0
        self.n = 0
        return np.zeros(2, np.float32), {"config": "none/25MB/H1"}

    def step(self, action):
        c, b, h = (int(x) for x in action)
        self.n += 1
        self.total += 1
        dt = 0.5 + 0.1 * c
        self.t += dt
        diverged = self.diverge_at is not None and self.total == self.diverge_at
        nan = float("nan")
        m = {
            "train_time_s": dt,
            "step_time_s": dt / 10,
            "iter_mean_s": dt / 10,
            "compute_s": 0.01,
            "comm_wait_s": 0.02,
            "compress_s": 0.001 * c,
            "comm_s": 0.2,
            "bytes_per_step": 1000.0 * (5 - c),
            "bytes_total": 10000.0 * (5 - c),
            "train_loss": nan if diverged else 1.0 / self.total,
            "eval_loss": nan if diverged else 1.1 / self.total,
            "eval_acc": 0.5,
            "eval_s": 0.01,
            "grad_norm": float("inf") if diverged else 2.0,
            "compression_error": None if c == 0 else 0.1 * c,
            "nonfinite": diverged,
            "samples": 640,
            "steps": 10,
            "bucket_bytes": [100, 200],
        }
        cfg = {
            "compression": self.COMPRESSION[c],
            "bucket_mb": self.BUCKET_MB[b],
            "sync_period": self.PERIOD[h],
            "error_feedback": True,
            "stochastic_rounding": False,
        }
        terminated = diverged
        truncated = not terminated and self.n >= 3
        reason = "diverged" if diverged else ("time_budget" if truncated else None)
        info = {
            "config": f"{cfg['compression']}/{cfg['bucket_mb']:g}MB/H{cfg['sync_period']}",
            "action": cfg,
            "measured": m,
            "reason": reason,
            "train_time_s": self.t,
            "elapsed_frac": min(1.0, self.t / 3),
            "decision": self.n,
            "diverged": diverged,
        }
        return np.zeros(2, np.float32), 0.1 * self.n, terminated, truncated, info

    def close(self):
        self.closed += 1


def test_tracking_wrapper_metrics_steps_and_csv(tracker, tmp_path):
    actions = [(0, 2, 0), (1, 1, 0), (3, 0, 1), (2, 2, 2), (4, 0, 0)]
    with tracker.start_run("wrapped") as run:
        env = TrackingWrapper(FakeAllReduceEnv(diverge_at=5), run)
        env.reset(seed=0)
        for a in actions:
            _, _, term, trunc, _ = env.step(np.array(a))
            if term or trunc:
                env.reset()
        env.close()
        env.close()  # safe twice
    assert env.unwrapped.closed == 2
    client = tracker.client
    rid = run.run_id

    def hist(key):
        return sorted((m.step, m.value) for m in client.get_metric_history(rid, key))

    assert [s for s, _ in hist("env/reward")] == [1, 2, 3, 4, 5]
    assert [v for _, v in hist("env/reward")] == pytest.approx([0.1, 0.2, 0.3, 0.1, 0.2])
    assert hist("action/compression") == [(i + 1, float(a[0])) for i, a in enumerate(actions)]
    assert [v for _, v in hist("action/bucket_mb")] == [25.0, 4.0, 1.0, 25.0, 1.0]
    assert [v for _, v in hist("action/sync_period")] == [1.0, 1.0, 2.0, 4.0, 1.0]
    # compression_error is None for "none": absent at step 1
    assert [s for s, _ in hist("comm/compression_error")] == [2, 3, 4, 5]
    assert hist("comm/bytes_per_step")[0] == (1, 5000.0)
    assert [s for s, _ in hist("env/train_time_s")] == [1, 2, 3, 4, 5]
    for key in ("comm/step_time_s", "comm/comm_wait_s", "comm/compress_s", "train/eval_acc"):
        assert len(hist(key)) == 5, key
    # the diverged decision (5) has NaN loss / inf grad: not logged as numbers
    assert [s for s, _ in hist("train/loss")] == [1, 2, 3, 4]
    assert [s for s, _ in hist("train/grad_norm")] == [1, 2, 3, 4]
    tags = client.get_run(rid).data.tags
    assert tags["diverged"] == "true"
    assert tags["nonfinite.train/loss"].startswith("nan")
    assert tags["nonfinite.train/grad_norm"].startswith("inf")
    assert hist("episode/length") == [(0, 3.0), (1, 2.0)]
    assert [s for s, _ in hist("episode/return")] == [0, 1]
    assert hist("episode/return")[0][1] == pytest.approx(0.6)

    assert "decisions.csv" in {a.path for a in client.list_artifacts(rid)}
    local = client.download_artifacts(rid, "decisions.csv", str(tmp_path))
    with open(local, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5
    assert rows[0]["config"] == "none/25MB/H1"
    assert rows[2]["reason"] == "time_budget"
    assert rows[4]["reason"] == "diverged"
    assert math.isnan(float(rows[4]["train_loss"]))
    assert float(rows[4]["grad_norm"]) == math.inf
    assert rows[0]["compression_error"] == ""
    assert [int(r["episode"]) for r in rows] == [0, 0, 0, 1, 1]
    out = env.write_csv(tmp_path / "again" / "d.csv")
    assert out.read_text().count("\n") == 6


def test_tracking_wrapper_prefix_and_noop_run(tmp_path):
    t = Tracker(f"sqlite:///{tmp_path}/never.db", enabled=False)
    run = t.start_run("noop")
    env = TrackingWrapper(FakeAllReduceEnv(), run, prefix="eval")
    env.reset()
    env.step(np.array([1, 1, 1]))
    env.close()
    assert env.prefix == "eval/"
    assert env.rows[0]["compression"] == "fp16"
    assert env.write_csv(tmp_path / "d.csv").exists()
    assert run.run_id is None and not (tmp_path / "never.db").exists()


def test_interrupt_marks_run_killed_and_experiment_is_model_training(tracker):
    with pytest.raises(KeyboardInterrupt), tracker.start_run("interrupted") as run:
        raise KeyboardInterrupt
    assert tracker.client.get_run(run.run_id).info.status == "KILLED"
    exp = tracker.client.get_experiment(tracker.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


def test_tracking_wrapper_learning_curve_only(tracker):
    with tracker.start_run("learning") as run:
        env = TrackingWrapper(FakeAllReduceEnv(), run, log_decisions=False)
        env.reset(seed=0)
        for _ in range(5):
            _, _, term, trunc, _ = env.step(np.array([0, 2, 0]))
            if term or trunc:
                env.reset()
        run.flush()
    client = tracker.client
    logged = set(client.get_run(run.run_id).data.metrics)
    assert logged == {"episode/return", "episode/length"}, logged
    # step = decisions so far when the episode ended (the learning curve's x axis)
    assert [m.step for m in client.get_metric_history(run.run_id, "episode/length")] == [3]
    assert len(env.rows) == 5  # the CSV keeps every decision
