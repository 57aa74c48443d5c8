"""Every agent ``commgym train`` accepts trains, saves and is evaluated on the smoke scenario.

The recipe of ``commgym train`` (:func:`~commgym.experiments.train.train`) once per
registered agent, on one set of real ranks (started once for all of them) and one MLflow
store; the command line itself runs in tests/experiments/test_readme_commands.py.
"""

from __future__ import annotations

import pytest

from commgym.agents import AGENTS, load_agent
from commgym.experiments.config import load_run_config
from commgym.experiments.session import make_env
from commgym.experiments.train import train

#: Agents that need more than a scenario to be built: ``mpc`` plans over a calibration record
#: of the scenario's workload (``commgym calibrate-sim``; tests/agents/test_mpc.py).
NEEDS_CALIBRATION = {"mpc"}
#: Every registered agent, a static one by a menu entry (``static`` takes a preset).
NAMES = [n if n != "static" else "static:int8/4MB/H1" for n in AGENTS if n not in NEEDS_CALIBRATION]


def test_an_agent_without_its_calibration_is_refused_before_anything_runs(tmp_path):
    from commgym.experiments.cli import app  # noqa: F401 - the command the error reaches
    from tests.experiments.cli_helpers import cli

    proc = cli(["train", "--config", "smoke", "--agent", "mpc"], tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "calibrate-sim" in proc.stderr and not (tmp_path / "commgym-out").exists()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """The smoke scenario's env, ranks started once, and a store shared by every agent."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('agents')}/mlflow.db"
    env = make_env(load_run_config("smoke"))
    yield env, uri
    env.close()


@pytest.mark.parametrize("name", NAMES)
def test_agent_trains_on_the_smoke_scenario(ranks, tmp_path, name):
    env, uri = ranks
    cfg = load_run_config(
        "smoke",
        {"agent": name, "episodes": 1, "output_dir": str(tmp_path), "tracking_uri": uri},
    )
    assert cfg.agent_kwargs.get(name, {}) == cfg.agent_hyperparams  # its own only
    results = train(cfg, env=env)
    assert list(results) == [f"{name} (learned)", *cfg.baselines]
    assert all(len(eps) == 1 and eps[0].decisions >= 1 for eps in results.values())
    agent = load_agent(tmp_path / "policy.zip", env=env)
    assert agent.name == name.split(":", 1)[0]
