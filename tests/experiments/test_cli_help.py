"""Option help lists the names the registries accept, and only those."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from commgym.agents import agent_names
from commgym.env.workloads import WORKLOADS
from commgym.experiments.cli import app
from commgym.experiments.config import shipped_configs


def _help(command: str) -> str:
    res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "400", "TERM": "dumb"})
    assert res.exit_code == 0, res.output
    # rich draws the options in a box: a long list wraps across its border characters
    return " ".join(res.output.replace("│", " ").split())


def _listed(text: str, lead: str) -> list[str]:
    """The comma-separated names after ``lead`` up to ';', ' (' or a full stop."""
    m = re.search(re.escape(lead) + r"\s*(.*?)(?:;|\s\(|\.\s)", text)
    assert m, (lead, text[:2000])
    return [n.strip() for n in m.group(1).split(",") if n.strip()]


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_help_lists_match_registries(command):
    text = _help(command)
    assert _listed(text, "a shipped name:") == shipped_configs()
    assert _listed(text, "Workload:") == list(WORKLOADS)
    agents = _listed(text, "Agent name:" if command == "train" else "Known:")
    assert agents == agent_names()
    assert "--network" in text and "--tuning-decisions" in text


def test_registry_lists_are_the_real_ones():
    assert {"default", "real", "smoke", "surrogate"} <= set(shipped_configs())
    assert {"ppo", "a2c", "dqn", "bayesopt", "bandit", "grid", "random"} <= set(agent_names())
