"""The headroom bound from per-condition times, its CSV input and its command."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from commgym.agents.oracle import OracleEntry
from commgym.agents.rollout import Episode
from commgym.experiments.cli import app
from commgym.experiments.headroom import switching_bound
from commgym.experiments.leaderboard_report import read_static_ranking, write_static_ranking

#: Two conditions, each with its own best entry, twice as fast as the other there.
MIRROR = {"fast": {"x": 1.0, "y": 2.0}, "slow": {"x": 2.0, "y": 1.0}}


def test_mirrored_conditions_bound_at_an_even_mix():
    # within a job at 50/50: the schedule progresses at 1/s, either entry at 0.75/s
    b = switching_bound(MIRROR)
    assert b.h == pytest.approx(0.25, abs=1e-9)
    assert b.shares == pytest.approx({"fast": 0.5, "slow": 0.5}, abs=1e-6)
    assert b.best_entries == {"fast": "x", "slow": "y"}
    assert b.static_entry in ("x", "y") and not b.per_job
    # one draw per job at even odds: static 1.5 s on average, the contextual oracle 1 s
    b = switching_bound(MIRROR, per_job=True)
    assert b.h == pytest.approx(1 / 3, abs=1e-9) and b.per_job


def test_an_entry_best_everywhere_leaves_nothing():
    times = {"a": {"x": 1.0, "y": 1.5, "z": 3.0}, "b": {"x": 2.0, "y": 2.5, "z": 2.1}}
    for per_job in (False, True):
        b = switching_bound(times, per_job=per_job)
        assert b.h == pytest.approx(0.0, abs=1e-9)
        assert b.static_entry == "x"


def test_an_entry_missing_under_a_condition_is_left_out():
    # "w" was measured only under "a": the bound compares the entries common to both
    times = {"a": {"w": 0.1, "x": 1.0, "y": 2.0}, "b": {"x": 2.0, "y": 1.0}}
    b = switching_bound(times)
    assert b.entries == ("x", "y")
    assert b.best_entries == {"a": "x", "b": "y"}
    assert b.h == pytest.approx(switching_bound(MIRROR).h, abs=1e-9)


def _h(t: np.ndarray, p: np.ndarray, per_job: bool) -> float:
    if per_job:
        return 1 - float(p @ t.min(axis=1)) / float((p @ t).min())
    return 1 - float((p @ (1 / t)).max()) / float(p @ (1 / t.min(axis=1)))


@pytest.mark.parametrize("per_job", [False, True])
def test_bound_is_the_maximum_over_mixes_of_a_grid_search(per_job):
    rng = np.random.default_rng(7)
    for _ in range(20):
        t = rng.uniform(1.0, 20.0, size=(3, 5))  # 3 conditions x 5 entries
        times = {f"c{i}": {f"e{j}": float(t[i, j]) for j in range(5)} for i in range(3)}
        b = switching_bound(times, per_job=per_job)
        grid = [
            np.array([i, j, 60 - i - j]) / 60
            for i, j in itertools.product(range(61), repeat=2)
            if i + j <= 60
        ]
        best = max(_h(t, p, per_job) for p in grid)
        p_star = np.array([b.shares[f"c{i}"] for i in range(3)])
        assert b.h == pytest.approx(_h(t, p_star, per_job), abs=1e-9)  # h at its own mix
        assert b.h >= best - 1e-9  # no grid mix beats it
        assert b.h <= best + 0.02  # and the grid (step 1/60) comes close


def test_given_shares_are_evaluated_not_searched():
    times = {"quiet": {"h1": 6.12, "h2": 6.77}, "busy": {"h1": 25.73, "h2": 14.28}}
    b = switching_bound(times, shares={"quiet": 2 / 3, "busy": 1 / 3})
    adaptive = 2 / 3 / 6.12 + 1 / 3 / 14.28
    static = max(2 / 3 / 6.12 + 1 / 3 / 25.73, 2 / 3 / 6.77 + 1 / 3 / 14.28)
    assert b.h == pytest.approx(1 - static / adaptive, rel=1e-12)
    assert b.shares == pytest.approx({"quiet": 2 / 3, "busy": 1 / 3})
    # the README's contention figures: h <= 0.08, reached with the link busy a third of the time
    worst = switching_bound(times)
    assert worst.h == pytest.approx(0.079, abs=5e-4)
    assert worst.shares["busy"] == pytest.approx(0.335, abs=5e-3)


@pytest.mark.parametrize(
    ("times", "shares", "needle"),
    [
        ({"a": {"x": 1.0}}, None, "at least 2 conditions"),
        ({"a": {"x": 1.0}, "b": {"y": 1.0}}, None, "no menu entry was measured under every"),
        ({"a": {"x": 1.0}, "b": {"x": 0.0}}, None, "time to target of x under b must be > 0"),
        ({"a": {"x": 1.0}, "b": {"x": math.nan}}, None, "must be > 0 s, got nan"),
        (MIRROR, {"fast": 1.0}, "shares must name exactly the conditions"),
        (MIRROR, {"fast": 0.7, "slow": 0.7}, "sum to 1"),
        (MIRROR, {"fast": 1.5, "slow": -0.5}, "shares must be >= 0"),
    ],
)
def test_bad_input_names_the_value(times, shares, needle):
    with pytest.raises(ValueError, match=needle):
        switching_bound(times, shares=shares)


def _episode(seed: int, t: float | None, budget: float) -> Episode:
    return Episode(
        seed=seed, decisions=40, train_time_s=t or budget, time_to_target_s=t,
        final_eval_loss=0.19 if t else 0.4, final_eval_acc=0.95, bytes_per_step=45056.0,
        episode_return=-1.0, reason="target_reached" if t else "time_budget",
    )  # fmt: skip


def _entry(config: str, times: list[float | None], budget: float = 30.0) -> OracleEntry:
    episodes = [_episode(1000 + i, t, budget) for i, t in enumerate(times)]
    return OracleEntry.from_episodes(config, episodes, time_budget_s=budget)


def _write(tmp_path, name: str, ranking: list[OracleEntry]):
    return write_static_ranking(SimpleNamespace(ranking=ranking), name, tmp_path)


def test_static_ranking_csv_round_trips(tmp_path):
    ranking = [_entry("topk:0.01/25MB/H2", [8.5, 9.0]), _entry("none/25MB/H1", [12.0, None])]
    path = _write(tmp_path, "quiet", ranking)
    assert path.name == "static-entries-quiet.csv"
    back = read_static_ranking(path)
    assert back == ranking
    assert back[1].seeds_missed == 1 and back[1].mean_time_to_target_s == pytest.approx(21.0)


def test_static_ranking_csv_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="no static-entries CSV at"):
        read_static_ranking(tmp_path / "missing.csv")
    other = tmp_path / "leaderboard.csv"
    other.write_text("agent,seed,time_to_target_s\nppo,1000,3.0\n")
    with pytest.raises(ValueError, match=r"not oracle-static's static-entries CSV: no column"):
        read_static_ranking(other)
    empty = tmp_path / "empty.csv"
    empty.write_text(
        "config,mean_time_to_target_s,seeds_reached,times_to_target_s,final_eval_loss,episodes\n"
    )
    with pytest.raises(ValueError, match="has no entry"):
        read_static_ranking(empty)
    broken = tmp_path / "broken.csv"
    broken.write_text(empty.read_text() + 'x,1.0,1,"[1.0",0.2,[]\n')
    with pytest.raises(ValueError, match="a row does not parse"):
        read_static_ranking(broken)


def _invoke(args: list[str]):
    return CliRunner().invoke(
        app, ["headroom-bound", *args], env={"COLUMNS": "200", "TERM": "dumb"}
    )


def test_command_prints_the_table_and_the_bound(tmp_path):
    fast = _write(tmp_path, "fast", [_entry("x", [1.0, 1.0]), _entry("y", [2.0, 2.0])])
    slow = _write(tmp_path, "slow", [_entry("y", [1.0, 1.0]), _entry("x", [2.0, 2.0])])
    res = _invoke(["--conditions", f"fast={fast},slow={slow}"])
    assert res.exit_code == 0, res.output
    text = res.output
    assert "h <= 0.250: conditions alternating inside a job, shares fast 0.50 / slow 0.50" in text
    assert "fastest per condition: fast x, slow y" in text
    rows = {ln.split()[0]: ln.split()[1:] for ln in text.splitlines() if ln[:2] in ("x ", "y ")}
    assert rows == {"x": ["1.00*", "2.00"], "y": ["2.00", "1.00*"]}
    res = _invoke(["--conditions", f"fast={fast},slow={slow}", "--per-job"])
    assert "h <= 0.333: conditions drawn once per job" in res.output
    res = _invoke(["--conditions", f"fast={fast},slow={slow}", "--shares", "1,0"])
    assert res.exit_code == 0 and "h <= 0.000" in res.output and "(given)" in res.output
    missed = _write(tmp_path, "lossy", [_entry("x", [1.0, None]), _entry("y", [3.0, 3.0])])
    res = _invoke(["--conditions", f"fast={fast},lossy={missed}"])
    assert "missed the target on some seed (counted at the budget): x" in res.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--conditions", "fast"], "is not <condition>=<static-entries CSV>"),
        (["--conditions", "a={p},a={p}"], "names 'a' twice"),
        (["--conditions", "a={p},b=nowhere.csv"], "no static-entries CSV at 'nowhere.csv'"),
        (["--conditions", "a={p},b={p}", "--shares", "1"], "gives 1 shares for the conditions"),
        (["--conditions", "a={p},b={p}", "--shares", "x,y"], "must be numbers"),
        (["--conditions", "a={p}"], "at least 2 conditions"),
    ],
)
def test_command_bad_input_is_one_error_line(tmp_path, args, needle):
    path = _write(tmp_path, "one", [_entry("x", [1.0])])
    res = _invoke([a.replace("{p}", str(path)) for a in args])
    assert res.exit_code == 2, res.output
    assert "error: " in res.output and needle in " ".join(res.output.split()), res.output


# -- intervals -------------------------------------------------------------------------
def test_paired_difference_is_the_paired_t_interval():
    from scipy import stats

    from commgym.experiments.headroom import paired_difference

    a, b = [9.0, 9.2, 10.0, 9.0, 9.9], [10.0, 11.0, 12.0, 10.5, 11.5]
    est, p = paired_difference(a, b)
    d = np.subtract(a, b)
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    assert est.value == pytest.approx(d.mean())
    assert (est.low, est.high) == pytest.approx((d.mean() - half, d.mean() + half))
    assert p == pytest.approx(stats.ttest_rel(a, b).pvalue)


def test_t_intervals_cover_at_their_level_with_few_seeds():
    """Monte Carlo: 95 % intervals of h over 3 and 5 seeds cover the true h about 95 % of
    the time (percentile bootstrap intervals covered ~75 % and ~85 %)."""
    from commgym.experiments.headroom import headroom

    rng = np.random.default_rng(0)
    true_h = 1 - 8.0 / 10.0
    for n in (3, 5):
        hits = 0
        for _ in range(2000):
            common = rng.normal(0, 1.0, n)  # a hard seed is hard for both
            s = 10.0 + common + rng.normal(0, 0.4, n)
            a = 8.0 + common + rng.normal(0, 0.4, n)
            h = headroom(s, a)
            hits += h.low <= true_h <= h.high
        assert 0.90 <= hits / 2000 <= 0.99, (n, hits / 2000)


def test_headroom_rule_in_standard_errors_and_seeds_needed():
    from commgym.experiments.headroom import (
        HEADROOM_FACTOR,
        captured_fraction,
        has_headroom,
        headroom,
        seeds_needed,
        t_critical,
    )

    s, a = [10.0, 11.0, 12.0, 10.5, 11.5], [8.0, 8.5, 9.4, 8.0, 9.0]
    h = headroom(s, a)
    assert h.half_width == pytest.approx(t_critical(5) * h.se)
    assert h.z == pytest.approx(h.value / h.se)
    assert has_headroom(h) == (h.z >= HEADROOM_FACTOR * t_critical(5))
    assert has_headroom(h) and seeds_needed(h) <= 5
    noisy = headroom([10.0, 11.0, 9.0], [9.0, 11.5, 8.0])
    assert not has_headroom(noisy)
    need = seeds_needed(noisy)
    assert need is not None and need > 3
    # at the needed count the rule would hold with the same per-seed spread
    sd = noisy.se * np.sqrt(3)
    assert noisy.value >= HEADROOM_FACTOR * t_critical(need) * sd / np.sqrt(need)
    assert noisy.value < HEADROOM_FACTOR * t_critical(need - 1) * sd / np.sqrt(need - 1)
    assert seeds_needed(headroom([10.0, 11.0], [10.5, 11.5])) is None  # h < 0
    c = captured_fraction(s, a, [9.0, 9.2, 10.0, 9.0, 9.9])
    assert c.low < c.value < c.high
    # oracles that tie with a seed left out: C's interval is unbounded
    tied = captured_fraction([10.0, 10.0, 10.0], [10.0, 10.0, 9.0], [10.0, 10.0, 9.5])
    assert tied.low == -math.inf and tied.high == math.inf


def test_decision_times_reads_each_players_csvs_with_a_miss_as_the_budget(tmp_path):
    from commgym.experiments.headroom import decision_times

    rows = {
        "decisions-ppo_learned-seed1000.csv": [("1.5", ""), ("3.25", "target_reached")],
        "decisions-ppo_learned-seed1001.csv": [("2.0", ""), ("31.0", "budget")],
        "decisions-oracle_re-run_topk_0.01_25MB_H1-seed1000.csv": [("4.0", "target_reached")],
        "not-a-decisions-file.csv": [("9.0", "target_reached")],
    }
    for name, lines in rows.items():
        text = "decision,train_time_s,reason\n" + "".join(
            f"{i},{t},{r}\n" for i, (t, r) in enumerate(lines, 1)
        )
        (tmp_path / name).write_text(text)
    assert decision_times(tmp_path, 30.0) == {
        "ppo_learned": {1000: 3.25, 1001: 30.0},
        "oracle_re-run_topk_0.01_25MB_H1": {1000: 4.0},
    }
