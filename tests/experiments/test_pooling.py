"""Replication: invocations of one scenario reported each and pooled (``commgym pool``)."""

from __future__ import annotations

import csv

import pytest
from typer.testing import CliRunner

from commgym.experiments.cli import app
from commgym.experiments.headroom import paired_difference
from commgym.experiments.pooling import pool, read_invocation

ROLES = {"oracle-static": "oracle", "oracle-adaptive": "oracle", "learner": "learned"}


def _write(folder, seeds, times, roles=None):
    """A leaderboard-flaky.csv as the leaderboard writes it (the columns pooling reads)."""
    roles = {**ROLES, **(roles or {})}
    folder.mkdir(parents=True)
    path = folder / "leaderboard-flaky.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["scenario", "agent", "role", "seed", "time_to_target_s", "reached"])
        for agent, ts in times.items():
            for s, t in zip(seeds, ts, strict=True):
                w.writerow(["flaky", agent, roles[agent], s, t, True])
    return folder


A = {
    "oracle-static": [10.0, 11.0, 12.0],
    "oracle-adaptive": [8.0, 8.5, 9.5],
    "learner": [9.0, 9.5, 10.5],
}
B = {
    "oracle-static": [10.5, 12.0, 11.0],
    "oracle-adaptive": [8.5, 9.0, 9.0],
    "learner": [10.6, 11.0, 10.0],
}


def test_each_invocation_and_the_pooled_units(tmp_path):
    a = read_invocation(_write(tmp_path / "a", [1000, 1001, 1002], A))
    b = read_invocation(_write(tmp_path / "b", [1003, 1004, 1005], B))
    report = pool([a, b])
    assert [inv["seeds"] for inv in report["invocations"]] == [
        [1000, 1001, 1002],
        [1003, 1004, 1005],
    ]
    assert report["overlapping_seeds"] == []
    pooled = {r.agent: r for r in report["pooled"]["rows"]}
    assert pooled["learner"].n == 6
    expected, p = paired_difference(
        A["learner"] + B["learner"], A["oracle-static"] + B["oracle-static"]
    )
    assert pooled["learner"].minus_static.value == pytest.approx(expected.value)
    assert pooled["learner"].p_value == pytest.approx(p)
    first = {r.agent: r for r in report["invocations"][0]["rows"]}
    assert first["learner"].captured.value == pytest.approx((11.0 - 9.6666667) / (11.0 - 8.6666667))
    assert first["oracle-static"].captured is None  # the oracles have no C


def test_command_prints_both_and_refuses_one_invocation(tmp_path):
    _write(tmp_path / "a", [1000, 1001, 1002], A)
    _write(tmp_path / "b", [1000, 1001, 1002], B)  # the same seeds again: a replicate
    res = CliRunner().invoke(app, ["pool", "--runs", f"{tmp_path / 'a'},{tmp_path / 'b'}"])
    assert res.exit_code == 0, res.output
    assert "2 invocations, pooled" in res.output and "| pooled | 6 |" in res.output
    assert "more than one invocation: each run counts as its own unit" in res.output
    res = CliRunner().invoke(app, ["pool", "--runs", str(tmp_path / "a")])
    assert res.exit_code == 2 and "at least 2 invocations" in res.output
    res = CliRunner().invoke(app, ["pool", "--runs", f"{tmp_path / 'a'},{tmp_path / 'nope'}"])
    assert res.exit_code == 2 and "no leaderboard CSV or folder" in res.output


def test_t_static_is_the_best_run_of_oracle_static_s_entries(tmp_path):
    """A static baseline that played oracle-static's own entry faster than its re-run is one
    more re-run of that entry: T_static takes it (the conservative choice), in each
    invocation and pooled; a faster constant player of another entry does not count."""
    import json

    roles = {"best-static": "baseline", "other": "baseline"}
    times = {**A, "best-static": [9.5, 10.5, 11.5], "other": [9.0, 10.0, 11.0]}
    folder = _write(tmp_path / "a", [1000, 1001, 1002], times, roles)

    def actions(entry):
        return {c: {"config": entry, "share": 1.0} for c in ("10gbit", "10mbit")}

    (folder / "headroom-flaky.json").write_text(
        json.dumps(
            {
                "reruns": [
                    {"oracle": "oracle-static", "entry": "powersgd:2/25MB/H2"},
                    {"oracle": "oracle-static", "entry": "powersgd:2/25MB/H1"},
                ],
                "actions": {
                    "oracle-static": actions("powersgd:2/25MB/H2"),
                    "best-static": actions("powersgd:2/25MB/H1"),  # a near-tied entry
                    "other": actions("topk:0.01/25MB/H1"),  # not one of them
                },
            }
        )
    )
    a = read_invocation(folder)
    assert a.t_static == "best-static"
    b = read_invocation(
        _write(
            tmp_path / "b",
            [1003, 1004, 1005],
            {**B, "best-static": B["oracle-static"], "other": B["learner"]},
            roles,
        )
    )
    assert b.t_static == "oracle-static"  # no report beside it
    report = pool([a, b])
    pooled = {r.agent: r for r in report["pooled"]["rows"]}
    expected, _ = paired_difference(
        A["learner"] + B["learner"], times["best-static"] + B["oracle-static"]
    )
    assert pooled["learner"].minus_static.value == pytest.approx(expected.value)
    first = {r.agent: r for r in report["invocations"][0]["rows"]}
    assert first["learner"].captured.value == pytest.approx((10.5 - 9.6666667) / (10.5 - 8.6666667))
