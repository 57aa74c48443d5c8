"""Run the ``commgym`` CLI in a subprocess, isolated from inherited MLflow settings."""

from __future__ import annotations

import os
import subprocess
import sys


def cli(args: list[str], cwd, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m commgym.experiments.cli *args`` in ``cwd``; never inherits an MLflow run."""
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("MLFLOW_RUN_ID", None)
    return subprocess.run(
        [sys.executable, "-m", "commgym.experiments.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def cli_ok(args: list[str], cwd, timeout_s: float = 600) -> str:
    """Like :func:`cli` but asserts exit code 0 and returns stdout."""
    proc = cli(args, cwd, timeout_s)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout
