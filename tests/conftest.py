"""Shared fixtures: persistent 2- and 4-rank gloo pools, one tiny real simulator calibration,
GPU marker handling."""

from __future__ import annotations

import os

# OpenMP workers spin while they wait for each other: next to other CPU-heavy jobs on a
# 2-core machine that made one scikit-learn surrogate fit 9x slower (415 s against 47 s
# wall with one thread, measured). Set before torch or scikit-learn load their runtimes;
# an explicit setting wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

from tests.dist_pool import DistPool, close_shared_pools, shared_pool


@pytest.fixture(scope="session")
def dist2() -> DistPool:
    """Two gloo ranks on CPU."""
    return shared_pool(2)


@pytest.fixture(scope="session")
def dist4() -> DistPool:
    """Four gloo ranks on CPU."""
    return shared_pool(4)


#: The action menu of :func:`tiny_calibration`: two compressions, one bucket, two periods.
TINY_MENU = {"compression": ["none", "fp16"], "bucket_mb": [25.0], "sync_period": [1, 2]}


@pytest.fixture(scope="session")
def tiny_calibration(tmp_path_factory):
    """A tiny real calibration of ``commgym/Sim-v1``: ``(env_config, path, calibration)``.

    2 gloo ranks of ``mlp-digits``, :data:`TINY_MENU`, 2 iterations a decision, target 1.0;
    one calibration seed, one random-switch episode, loopback only. Measured once per
    session for the simulator's tests (tests/env/test_sim_calibration.py) and
    ``commgym train --env sim`` (tests/experiments/test_train_sim.py).
    """
    from commgym.env import EnvConfig
    from commgym.experiments.calibrate_sim import calibrate_sim

    cfg = EnvConfig(
        workload="mlp-digits", world_size=2, steps_per_decision=2, time_budget_s=20.0,
        reward="time_to_target", target_loss=1.0, action_menu=TINY_MENU,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("sim") / "cal.json"
    cal = calibrate_sim(
        cfg, path, seeds=(900_001,), budget_s=10.0, switch_episodes=1, rates=[], repeats=1
    )
    return cfg, path, cal


@pytest.fixture(params=[2, 4], ids=["w2", "w4"])
def dist_any(request) -> DistPool:
    """Parametrised over 2 and 4 ranks."""
    return shared_pool(request.param)


def pytest_sessionfinish(session, exitstatus) -> None:
    close_shared_pools()


def pytest_collection_modifyitems(config, items) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
