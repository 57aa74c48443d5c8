"""Smoke tests of ``commgym bench sync`` (2 gloo ranks launched by torchrun)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest

from commgym.collectives import WorkerFailed
from commgym.experiments.bench.sync import run_sync_benchmark


def test_bench_sync_smoke(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, "-m", "commgym.experiments.bench", "sync",
        "--steps", "3", "--warmup", "1", "--rounds", "1",
        "--compressors", "none,int8", "--json", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ours/DDP (none) =" in proc.stdout
    for row in ("torch DDP", "ours none", "ours int8"):
        assert row in proc.stdout
    result = json.loads(out.read_text())
    ratio = result["ratio_none_vs_ddp"]
    assert math.isfinite(ratio) and ratio > 0
    rows = {r["spec"]: r for r in result["rows"]}
    assert set(rows) == {"ddp", "none", "int8"}
    # Lossless paths put the same fp32 gradient on the wire as DDP and train identically.
    assert rows["ddp"]["bytes_per_step"] == 4 * result["numel"]
    # and no control collective: every parameter's result is non-zero, so none is asked
    assert rows["none"]["bytes_per_step"] == 4 * result["numel"]
    buckets = result["raw"]["ours"]["none"][0][0]["bucket_bytes"]
    assert rows["none"]["collectives"] == len(buckets)  # one all-reduce per bucket, as DDP
    assert "per-round ratios" in proc.stdout and "interval" in proc.stdout
    assert rows["int8"]["compression_ratio"] > 3.5
    assert result["max_param_diff_ddp_vs_none"] < 1e-5
    assert len(result["raw"]["step_s"]["ddp"][0]) == 3


def test_bench_sync_timeout_kills_ranks():
    t0 = time.monotonic()
    with pytest.raises(WorkerFailed, match="did not finish"):
        run_sync_benchmark(steps=3, warmup=0, rounds=1, compressors=["none"], timeout_s=0.5)
    assert time.monotonic() - t0 < 30


def test_bench_sync_rejects_unknown_model_and_spec():
    with pytest.raises(ValueError, match="unknown benchmark model"):
        run_sync_benchmark(model="resnet")
    with pytest.raises(ValueError, match="unknown compression spec"):
        run_sync_benchmark(compressors=["int7"])
