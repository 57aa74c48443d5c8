"""`commgym leaderboard` end to end on a tiny scenario: real ranks, real SQLite MLflow store."""

from __future__ import annotations

import csv
import json

import pytest
import yaml
from mlflow import MlflowClient

from commgym.experiments.leaderboard import read_leaderboard_csv
from commgym.experiments.reruns import rerun_name
from commgym.experiments.session import slug
from tests.experiments.cli_helpers import cli, cli_ok

AGENTS = ["ppo", "autotune", "oracle-static", "oracle-adaptive", "static:ddp-default", "bandit"]
SEEDS = 2

#: A scenario small enough for CI: 2 ranks on loopback, a 4-entry menu, 3 decisions.
TINY = {
    "agent": "ppo",
    "agent_kwargs": {"n_steps": 8, "batch_size": 8, "n_epochs": 1},
    "timesteps": 16,
    "env_kind": "surrogate",
    "surrogate_decisions": 16,
    "fine_tune_episodes": 1,
    "tuning_decisions": 3,
    "env": {
        "workload": "mlp-digits",
        "world_size": 2,
        "steps_per_decision": 2,
        "time_budget_s": 0.5,
        "max_decisions": 3,
        "reward": "time_to_target",
        "target_loss": 2.2,
        # players that read the probe run it; static players and the oracles do not
        "probe_bytes": 4096,
        # straggler jitter from 0.1 s on: two phases for oracle-adaptive to search
        "stragglers": [[0, "off"], [0.1, "5ms"]],
        "action_menu": {
            "compression": ["none", "fp16"],
            "bucket_mb": [25.0],
            "sync_period": [1, 2],
        },
    },
    "experiment": "commgym-lb-test",
}


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lb")
    (tmp / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    uri = f"sqlite:///{tmp}/mlflow.db"
    args = ["leaderboard", "--scenarios", str(tmp / "tiny.yaml"), "--agents",
            ",".join(AGENTS), "--seeds", str(SEEDS), "--tracking-uri", uri,
            "--output-dir", str(tmp / "out")]  # fmt: skip
    out = cli_ok(args, tmp, timeout_s=900)
    return tmp, uri, out, args


def test_table_lists_every_agent_with_speedups_and_costs(board):
    tmp, _, out, _ = board
    rows = read_leaderboard_csv(tmp / "out" / "leaderboard-tiny.csv")
    assert len(rows) == len(AGENTS) * SEEDS
    assert [r["agent"] for r in rows[::SEEDS]] == AGENTS
    roles = {r["agent"]: r["role"] for r in rows}
    assert roles["ppo"] == "learned" and roles["oracle-static"] == "oracle"
    assert roles["static:ddp-default"] == "baseline"
    for r in rows:
        assert 0 < r["time_to_target_s"] <= TINY["env"]["time_budget_s"] + 1e-9 or r["reached"]
        assert r["bytes_per_step"] > 0 and r["decisions"] >= 1
    ddp = [r for r in rows if r["agent"] == "static:ddp-default"]
    assert all(r["speedup_vs_ddp_default"] == pytest.approx(1.0) for r in ddp)
    auto = [r for r in rows if r["agent"] == "autotune"]
    assert all(r["speedup_vs_autotune"] == pytest.approx(1.0) for r in auto)
    # the learned agent's recipe and the oracle's search are paid in real decisions
    by_agent = {r["agent"]: r for r in rows}
    assert by_agent["ppo"]["cost_real_decisions"] >= TINY["surrogate_decisions"] + 1
    assert by_agent["oracle-static"]["cost_real_decisions"] >= 4 * SEEDS  # 4 entries x seeds
    assert by_agent["bandit"]["cost_real_decisions"] == TINY["tuning_decisions"]
    assert by_agent["static:ddp-default"]["cost_real_decisions"] == 0
    md = (tmp / "out" / "leaderboard.md").read_text()
    assert "| ppo (learned) |" in md and "(oracle)" in md and "vs autotune" in md
    assert "Strongest non-oracle baseline: `" in md and "Adaptation:" in md
    report = json.loads((tmp / "out" / "headroom-tiny.json").read_text())
    assert report["seeds"] == [1000, 1001] and report["strongest_baseline"] in AGENTS
    assert set(report["captured"]) == {a for a in AGENTS if not a.startswith("oracle")}
    h = report["headroom"]
    assert h["n"] == SEEDS and h["low"] <= h["value"] <= h["high"]
    # every agent's decisions are tabled by the condition they ran under
    assert {c.split(", stragglers ")[1] for c in report["actions"]["ppo"]} <= {"off", "5ms"}
    assert "time to target" in out and "oracle-static (oracle)" in out
    # oracle-static's near-tied entries (at least the top 3 of 4) were all re-run, and its
    # row is the best re-run
    reruns = report["reruns"]
    static_reruns = [r for r in reruns if r["oracle"] == "oracle-static"]
    assert len(static_reruns) >= 3 and sum(r["chosen"] for r in static_reruns) == 1
    kept = next(r for r in static_reruns if r["chosen"])
    assert kept["rerun_s"] == min(r["rerun_s"] for r in static_reruns)
    static_rows = [r for r in rows if r["agent"] == "oracle-static"]
    assert sum(r["time_to_target_s"] for r in static_rows) / SEEDS == pytest.approx(kept["rerun_s"])
    assert "Near-tied entries re-run" in md and "(kept)" in md
    assert report["departures"]["oracle-adaptive"]  # every phase-schedule seed has a row


def _decisions(tmp, agent, seed):
    path = tmp / "out" / "tiny" / f"decisions-{agent}-seed{seed}.csv"
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_only_players_that_read_the_probe_run_it(board):
    tmp, _, _, _ = board
    report = json.loads((tmp / "out" / "headroom-tiny.json").read_text())
    rerun = next(r["entry"] for r in report["reruns"])
    for seed in (1000, 1001):
        learner = _decisions(tmp, "ppo", seed)
        assert all(float(r["probe_s"]) > 0 and int(r["probe_bytes"]) == 4096 for r in learner)
        for agent in ("static_ddp-default", "bandit", "autotune", "oracle-adaptive",
                      slug(rerun_name(rerun))):  # fmt: skip
            rows = _decisions(tmp, agent, seed)
            assert rows and all(float(r["probe_s"]) == 0 for r in rows), agent


def test_figures_and_oracle_ranking_are_written(board):
    tmp, _, _, _ = board
    assert (tmp / "out" / "leaderboard-tiny.png").stat().st_size > 5000
    for agent in ("ppo", "autotune", "static_ddp-default"):
        assert (tmp / "out" / "tiny" / f"timeline-{agent}.png").stat().st_size > 5000
    ranking = (tmp / "out" / "tiny" / "static-entries-tiny.csv").read_text().splitlines()
    assert len(ranking) == 1 + 4  # header + every menu entry
    schedules = json.loads((tmp / "out" / "tiny" / "adaptive-schedules-tiny.json").read_text())
    assert [s["seed"] for s in schedules["seeds"]] == [1000, 1001]
    assert schedules["base"] in {"none/25MB/H1", "none/25MB/H2", "fp16/25MB/H1", "fp16/25MB/H2"}


def test_mlflow_parent_and_one_child_per_episode(board):
    tmp, uri, _, _ = board
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("commgym-leaderboard")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("commgym.command") == "leaderboard"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    assert parent.data.params["seeds"] == str(SEEDS) and "git.commit" in parent.data.params
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    # oracle-static plays no episode of its own: its near-tied entries' re-runs stand for it
    report = json.loads((tmp / "out" / "headroom-tiny.json").read_text())
    reruns = {r["entry"] for r in report["reruns"]}
    assert len(children) == (len(AGENTS) - 1 + len(reruns)) * SEEDS
    # seed-major: every player's seed 1000 episode started before any seed 1001 episode
    by_start = sorted(children, key=lambda r: r.info.start_time)
    seeds = [int(r.data.params["seed"]) for r in by_start]
    assert seeds == sorted(seeds), seeds
    assert {c.data.params["scenario"] for c in children} == {"tiny"}
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "tiny")}
    assert {"tiny/leaderboard-tiny.csv", "tiny/leaderboard-tiny.png"} <= arts, arts
    hist = client.get_metric_history(parent.info.run_id, "leaderboard/tiny/ppo/reached")
    assert len(hist) == 1 and 0 <= hist[0].value <= SEEDS
    gap = client.get_metric_history(parent.info.run_id, "tiny/ppo/sim2real/gap")
    assert len(gap) == 1
    # the learning curve and the recipe's parameters carry the scenario and agent
    assert client.get_metric_history(parent.info.run_id, "tiny/ppo/episode/return")
    assert parent.data.params["tiny/ppo/env.workload"] == "mlp-digits"


#: Another recipe for ppo on TINY's environment: fewer recorded decisions, other PPO settings.
RECIPE = {**TINY, "surrogate_decisions": 8, "agent_kwargs": {"n_steps": 16, "batch_size": 16}}


def test_policy_dir_loads_the_saved_policy_instead_of_training(board):
    """ppo loaded from --policy-dir, beside ``ppo@recipe``: ppo trained by its own run config
    (same environment) in the same invocation, its row and files labelled by the recipe."""
    tmp, uri, _, args = board
    cost = json.loads((tmp / "out" / "tiny" / "ppo" / "policy.cost.json").read_text())
    (tmp / "recipe.yaml").write_text(yaml.safe_dump(RECIPE))
    again = [*args[:-1], str(tmp / "out2")]
    again[again.index("--agents") + 1] = f"ppo,ppo@{tmp / 'recipe.yaml'},static:ddp-default"
    out = cli_ok([*again, "--policy-dir", str(tmp / "out")], tmp, timeout_s=600)
    assert "ppo: loaded" in out and "ppo@recipe: trained in" in out
    rows = read_leaderboard_csv(tmp / "out2" / "leaderboard-tiny.csv")
    assert [r["agent"] for r in rows[::SEEDS]] == ["ppo", "ppo@recipe", "static:ddp-default"]
    assert rows[0]["cost_wall_s"] == pytest.approx(cost["wall_s"])
    recipe = [r for r in rows if r["agent"] == "ppo@recipe"]
    assert recipe[0]["role"] == "learned"
    # the recipe's 8 recorded decisions (not the scenario's 16) and its own PPO settings
    assert RECIPE["surrogate_decisions"] <= recipe[0]["cost_real_decisions"]
    assert recipe[0]["cost_real_decisions"] < TINY["surrogate_decisions"]
    assert (tmp / "out2" / "tiny" / "ppo_recipe" / "policy.zip").is_file()
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("commgym-leaderboard")
    last = client.search_runs(
        [exp.experiment_id], "tags.`commgym.command` = 'leaderboard'",
        order_by=["attributes.start_time DESC"], max_results=1,
    )[0]  # fmt: skip
    assert last.data.params["tiny/ppo_recipe/agent.n_steps"] == "16"
    assert last.data.params["tiny/ppo_recipe/surrogate_decisions"] == "8"


def test_bad_input_fails_before_anything_runs(tmp_path):
    proc = cli(["leaderboard", "--scenarios", "smoke", "--output-dir", str(tmp_path / "o")],
               tmp_path)  # fmt: skip
    assert proc.returncode == 2 and "target_loss" in proc.stderr
    proc = cli(["leaderboard", "--scenarios", "default", "--agents", "ppo,nosuch",
                "--output-dir", str(tmp_path / "o")], tmp_path)  # fmt: skip
    assert proc.returncode == 2 and "nosuch" in proc.stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "mlflow.db").exists()
    # a static preset off a scenario's menu fails before ranks, store or folders exist
    proc = cli(["leaderboard", "--scenarios", "slow-link", "--agents", "static:int8/4MB/H1",
                "--output-dir", str(tmp_path / "o")], tmp_path)  # fmt: skip
    assert proc.returncode == 2 and "slow-link" in proc.stderr and "fp16/25MB/H4" in proc.stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "mlflow.db").exists()
    # a recipe for another environment than the scenario's, named by its differing fields
    proc = cli(["leaderboard", "--scenarios", "default", "--agents", "ppo@slow-link",
                "--output-dir", str(tmp_path / "o")], tmp_path)  # fmt: skip
    assert proc.returncode == 2 and "another environment" in proc.stderr, proc.stderr
    assert "env.network" in proc.stderr and "ppo@slow-link" in proc.stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize(
    ("agents", "says"),
    [
        (["ppo", "ppo"], "more than once"),
        (["ppo@a/x.yaml", "ppo@b/x.yaml"], "more than once"),  # both labelled ppo@x
        (["static:ddp-default@smoke"], "is not one"),
        (["oracle-static@smoke"], "is not one"),
        (["ppo@"], "name a run config"),
    ],
)
def test_agent_labels_refuse_what_cannot_be_a_row(agents, says):
    from commgym.experiments.leaderboard import _labels

    with pytest.raises(ValueError, match=says):
        _labels(agents)
    labels, recipes = _labels(["ppo", "ppo@runs/clock.yaml", "mpc@flaky-link-board"])
    assert labels == ["ppo", "ppo@clock", "mpc@flaky-link-board"]
    assert recipes == {"ppo@clock": "runs/clock.yaml", "mpc@flaky-link-board": "flaky-link-board"}


def _entry(agent: str, role: str, times: list[float]):
    from commgym.experiments.leaderboard import LeaderboardEntry

    n = len(times)
    return LeaderboardEntry(
        "s", agent, role, list(range(1000, 1000 + n)), times, [True] * n, [0.2] * n,
        [0.9] * n, [1.0] * n, [40] * n,
    )  # fmt: skip


def test_a_constant_player_faster_than_oracle_static_invalidates_the_headroom():
    """oracle-static is the best entry in hindsight: an agent that played one entry and beat
    it shows the search measured other conditions (the report says so, h is not valid)."""
    from commgym.experiments.leaderboard_report import static_oracle_beaten

    static = _entry("oracle-static", "oracle", [15.4, 14.3, 13.6])
    constant = _entry("bandit", "baseline", [8.3, 9.0, 8.7])
    switching = _entry("ppo", "learned", [8.0, 8.5, 8.2])
    slower = _entry("autotune", "baseline", [20.4, 20.3, 14.5])
    actions = {
        "bandit": {"fast": ("powersgd:2/25MB/H2", 1.0, 50, 0.0),
                   "slow": ("powersgd:2/25MB/H2", 1.0, 40, 0.0)},
        "ppo": {"fast": ("none/25MB/H1", 0.9, 50, 0.5),
                "slow": ("powersgd:2/25MB/H2", 1.0, 40, 0.0)},
        "autotune": {"fast": ("topk:0.01/25MB/H1", 1.0, 50, 0.0)},
    }  # fmt: skip
    beaten = static_oracle_beaten([static, constant, switching, slower], actions, static)
    assert [b["agent"] for b in beaten] == ["bandit"]  # adapting may beat it; slower may not
    assert beaten[0]["config"] == "powersgd:2/25MB/H2" and beaten[0]["p_value"] < 0.05
    assert static_oracle_beaten([static, slower], actions, static) == []
    assert static_oracle_beaten([constant], actions, None) == []


def test_t_static_is_the_best_run_of_oracle_static_s_near_tied_entries():
    """A non-oracle player that played one of oracle-static's near-tied entries throughout
    ran that entry again: the faster of the runs is T_static (it can only lower h and C)."""
    from commgym.experiments.leaderboard_report import constant_config, t_static_player

    means = {"oracle-static": 10.4, "best-static": 10.0, "bandit": 9.0, "oracle-adaptive": 7.2}
    roles = {"oracle-static": "oracle", "oracle-adaptive": "oracle", "best-static": "baseline",
             "bandit": "baseline"}  # fmt: skip
    constants = {"best-static": "powersgd:2/25MB/H2", "bandit": "topk:0.01/25MB/H1",
                 "oracle-adaptive": "powersgd:2/25MB/H2"}  # fmt: skip
    tied = {"powersgd:2/25MB/H2", "powersgd:2/25MB/H1"}
    assert t_static_player(means, constants, roles, tied) == "best-static"
    # a faster constant player of an entry outside the near-tied ones is no re-run of them
    assert t_static_player({**means, "best-static": 10.6}, constants, roles, tied) == (
        "oracle-static"
    )
    assert constant_config({"a": ("x", 1.0, 3, 0.0), "b": ("x", 1.0, 2, 0.0)}) == "x"
    assert constant_config({"a": ("x", 1.0, 3, 0.0), "b": ("y", 1.0, 2, 0.0)}) is None
    assert constant_config({"a": ("x", 0.9, 3, 0.5)}) is None
