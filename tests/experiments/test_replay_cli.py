"""`commgym replay`: the saved policy and both static baselines, one real run each."""

from __future__ import annotations

from commgym.agents import StaticAgent
from commgym.agents.base import LayoutEnv
from commgym.env.spaces import ActionMenu
from tests.experiments.cli_helpers import cli as _cli


def test_replay_prints_policy_and_baselines(tmp_path):
    agent = StaticAgent(LayoutEnv(ActionMenu()), preset="int8/4MB/H1")
    # the budget it was trained with: replay runs under it unless --time-budget-s says otherwise
    agent.trained_on = {**(agent.trained_on or {}), "time_budget_s": 5.0}
    policy = agent.save(tmp_path / "p.zip")
    proc = _cli(
        [
            "replay",
            "--policy",
            str(policy),
            "--workload",
            "mlp-digits",
            "--world-size",
            "2",
            "--steps",
            "6",
            "--steps-per-decision",
            "2",
        ],
        tmp_path,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    assert "time budget 5 s: the policy's training budget" in out
    for label in ("policy (p.zip)", "static:ddp-default", "static:fp16-dense"):
        assert label in out, out
    assert "final config int8/4MB/H1" in out and "final config fp16/25MB/H1" in out
    assert "time to target" in out and "policy decision time" in out


def test_replay_refuses_policy_for_other_menu(tmp_path):
    menu = ActionMenu(compression=("none", "fp16"))
    policy = StaticAgent(LayoutEnv(menu), preset="fp16-dense").save(tmp_path / "p.zip")
    proc = _cli(["replay", "--policy", str(policy), "--steps", "2"], tmp_path)
    assert proc.returncode == 2
    assert "action menu 'compression'" in proc.stderr


def test_replay_takes_a_preset_as_policy(tmp_path):
    # the same names `evaluate --baselines` takes; the preset runs from the first step
    proc = _cli(
        [
            "replay",
            "--policy",
            "static:int8/4MB/H1",
            "--baselines",
            "static:fp16-dense",
            "--steps",
            "4",
            "--steps-per-decision",
            "2",
            "--time-budget-s",
            "5",
        ],
        tmp_path,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    assert "the policy's training budget" not in out  # a preset has none: the flag's budget
    assert "policy (static:int8/4MB/H1)" in out
    assert "final config int8/4MB/H1" in out
    assert "0 configuration changes between its decisions" in out
