"""The four folders install as ``commgym.*`` under an implicit namespace package."""

from __future__ import annotations

import importlib
import multiprocessing as mp

import commgym

PACKAGES = ["commgym.collectives", "commgym.env", "commgym.agents", "commgym.experiments"]


def _import_all(q) -> None:
    q.put([importlib.import_module(name).__name__ for name in PACKAGES])


def test_commgym_is_an_implicit_namespace():
    assert getattr(commgym, "__file__", None) is None
    assert len(list(commgym.__path__)) >= 1


def test_packages_import_in_spawned_processes():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_import_all, args=(q,))
    p.start()
    try:
        assert q.get(timeout=120) == PACKAGES
    finally:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()


def test_collectives_never_import_rl_or_tracking_libraries():
    import subprocess
    import sys

    code = (
        "import sys, commgym.collectives\n"
        "bad = [m for m in ('gymnasium', 'stable_baselines3', 'mlflow') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    cmd = [sys.executable, "-c", code]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_importing_commgym_never_imports_ray():
    """Ray is the optional extra commgym[ray]: no module imports it at import time."""
    import subprocess
    import sys

    code = (
        "import sys, pkgutil, importlib\n"
        "import commgym.collectives, commgym.env, commgym.agents, commgym.experiments\n"
        "import commgym.experiments.cli, commgym.experiments.executors\n"
        "import commgym.agents.ray_env, commgym.experiments.leaderboard\n"
        "print('ray' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
