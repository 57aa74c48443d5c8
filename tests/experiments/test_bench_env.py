"""Smoke tests of ``commgym bench env`` (a tiny run of the real environment, 2 gloo ranks)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from rich.console import Console

from commgym.env.spaces import ActionMenu
from commgym.experiments.bench.env import (
    PARTS,
    WARMUP_DECISIONS,
    action_sequence,
    overhead_parts,
    run_env_benchmark,
    summarize,
)

_TOP_KEYS = {
    "measured_decisions",
    "median_env_step_s",
    "median_train_time_s",
    "median_command_s",
    "median_overhead_s",
    "overhead_ratio",
    "overhead_ratio_of_medians",
    "p90_overhead_ratio",
    "median_env_side_s",
    "median_round_trip_extra_s",
    "median_parts_s",
    "reset_first_s",
    "reset_second_s",
    "rank_reset_s",
    "launches",
    "episodes",
    "target",
    "goal",
    "meets_target",
    "meets_goal",
    "verdict",
    "breakdown",
    "meta",
    "per_decision",
}
_BREAKDOWN_KEYS = {
    "probe_round_trip_s",
    "probe_train_time_s",
    "fixed_per_decision_s",
    "reply_pickle_bytes",
    "command_pickle_bytes",
    *PARTS,
}


@pytest.mark.timeout(120)
def test_bench_env_tiny_run(tmp_path):
    out = tmp_path / "env.json"
    console = Console(width=140, record=True)
    res = run_env_benchmark(
        decisions=6, steps_per_decision=2, actions="cycle", json_path=out, console=console
    )
    text = console.export_text()
    assert "env overhead =" in text and "where the overhead goes" in text

    data = json.loads(out.read_text())
    assert _TOP_KEYS <= set(data)
    assert _BREAKDOWN_KEYS <= set(data["breakdown"])
    assert data["meta"]["steps_per_decision"] == 2 and data["meta"]["decisions"] == 6
    assert data["measured_decisions"] == 6 - WARMUP_DECISIONS
    assert len(data["per_decision"]) == 6
    for key in (
        "median_env_step_s",
        "median_train_time_s",
        "median_command_s",
        "reset_first_s",
        "reset_second_s",
    ):
        assert math.isfinite(data[key]) and data[key] > 0, key
    for key in ("overhead_ratio", "overhead_ratio_of_medians"):
        assert math.isfinite(data[key]), key
    # the env step contains the ranks' training: it cannot be shorter
    assert data["median_env_step_s"] >= data["median_train_time_s"]
    assert data["overhead_ratio"] > -0.01
    # ranks persist across resets: one launch, and a second reset is quick
    assert data["launches"] == 1
    assert data["reset_second_s"] < data["reset_first_s"]
    for key in ("eval_s", "messaging_s", "probe_round_trip_s"):
        assert math.isfinite(data["breakdown"][key]) and data["breakdown"][key] > 0, key
    # every measured decision's parts add up to its overhead over the slowest rank
    for rec in data["per_decision"]:
        overhead = rec["env_step_s"] - rec["train_time_s"]
        assert sum(rec["parts"].values()) == pytest.approx(overhead, abs=1e-9)
        assert rec["parts"]["skew_s"] <= 0.0
    assert data["verdict"].startswith(("PASS", "FAIL"))
    assert res["meets_target"] == (res["overhead_ratio"] <= 0.05)


def test_action_sequence_fixed_and_cycle():
    menu = ActionMenu.from_any(None)
    fixed = action_sequence(menu, "fixed", 4)
    assert all(np.array_equal(a, menu.default_action()) for a in fixed)
    n = int(np.prod(menu.nvec))
    cyc = action_sequence(menu, "cycle", n + 2)
    assert len({tuple(a) for a in cyc}) == n
    assert np.array_equal(cyc[n], cyc[0])
    with pytest.raises(ValueError, match="actions must be one of"):
        action_sequence(menu, "random", 3)


def test_overhead_parts_sum_to_the_overhead():
    replies = [
        {"train_time_s": 1.0, "handler_s": 1.3, "eval_s": 0.1, "instrumentation_s": 0.05},
        {"train_time_s": 1.1, "handler_s": 1.25, "eval_s": 0.1, "instrumentation_s": 0.0},
    ]
    parts = overhead_parts(1.5, 1.4, replies)
    assert set(parts) == set(PARTS)
    # rank 0's handler took longest: its parts, its skew against rank 1's 1.1 s
    assert parts["messaging_s"] == pytest.approx(0.1)
    assert parts["eval_s"] == 0.1 and parts["instrumentation_s"] == 0.05
    assert parts["handler_rest_s"] == pytest.approx(0.15)
    assert parts["skew_s"] == pytest.approx(-0.1)
    assert sum(parts.values()) == pytest.approx(1.5 - 1.1)
    with pytest.raises(KeyError):
        overhead_parts(1.5, 1.4, [{"train_time_s": 1.0, "handler_s": 1.2}])


def test_summarize_ratios_and_validation():
    recs = [{"env_step_s": 9.0, "train_time_s": 1.0, "command_s": 9.0}] * WARMUP_DECISIONS
    recs += [
        {"env_step_s": 1.05, "train_time_s": 1.0, "command_s": 1.0},
        {"env_step_s": 2.1, "train_time_s": 2.0, "command_s": 2.05},
        {"env_step_s": 3.3, "train_time_s": 3.0, "command_s": 3.2},
    ]
    s = summarize(recs)
    assert s["measured_decisions"] == 3
    assert s["overhead_ratio"] == pytest.approx(0.05)
    assert s["overhead_ratio_of_medians"] == pytest.approx(0.05)
    assert s["median_env_side_s"] == pytest.approx(0.05)
    with pytest.raises(ValueError, match="no measured decision"):
        summarize(recs[:WARMUP_DECISIONS])
    with pytest.raises(ValueError, match="actions must be one of"):
        run_env_benchmark(actions="random")
    with pytest.raises(ValueError, match="decisions must be"):
        run_env_benchmark(decisions=WARMUP_DECISIONS)


@pytest.mark.timeout(180)
def test_bench_env_on_an_emulated_link():
    """``network``: the ranks train on a shaped link (root, tc); the report names it."""
    from commgym.env.net import netem_available

    ok, why = netem_available()
    if not ok:
        pytest.skip(f"network emulation unavailable here ({why})")
    console = Console(width=140, record=True)
    res = run_env_benchmark(decisions=4, steps_per_decision=2, network="1gbit", console=console)
    assert res["meta"]["network"] == "1gbit" and res["measured_decisions"] == 1
    assert "network=1gbit" in " ".join(console.export_text().split())


def test_bench_env_refuses_an_unknown_network_before_launching(tmp_path):
    from tests.experiments.cli_helpers import cli

    proc = cli(["bench", "env", "--network", "nosuch"], tmp_path, 120)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0 and "nosuch" in out and "launching" not in out, out[-2000:]
