"""The realistic example loop under real torchrun: stop after a checkpoint, resume, compare.

``experiments/examples/train_real_loop.py`` (CNN + BatchNorm, AdamW, cosine LR with
warm-up, gradient accumulation, clipping after ``synchronize()``, bf16 autocast) runs
once uninterrupted (writing per-rank checkpoints at step 10) and once as a new job
resumed from those checkpoints; the final parameters must be bit-identical and equal on
both ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "experiments" / "examples" / "train_real_loop.py"


def _run(tmp: Path, name: str, *extra: str) -> dict:
    out = tmp / f"{name}.json"
    env = dict(os.environ, TMPDIR=str(tmp), OMP_NUM_THREADS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(EXAMPLE), "--policy", "static:int8/4MB/H1", "--steps", "16", "--decision-every",
        "4", "--json", str(out), *extra,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.timeout(600)
def test_real_loop_resumes_bit_identical(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    # the uninterrupted run leaves its per-rank checkpoints of step 10 behind
    full = _run(tmp_path, "full", "--checkpoint-dir", ckpt, "--checkpoint-every", "10")
    # a new job started with the same command resumes from them
    resumed = _run(tmp_path, "resumed", "--checkpoint-dir", ckpt, "--checkpoint-every", "10")
    assert full["params_identical"] and resumed["params_identical"]
    assert full["start_step"] == 0 and resumed["start_step"] == 10
    assert resumed["steps_done"] == full["steps_done"] == 16
    assert resumed["params_sha256"] == full["params_sha256"]
    assert full["configs"] == ["int8/4MB/H1"] * 4  # the preset from the first step
    assert full["eval_loss"] < 2.2  # it learns (chance is ln 10 = 2.30)
