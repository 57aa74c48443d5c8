"""The oracles' re-runs: near-tied entries, the best re-run kept, departures from a search."""

from __future__ import annotations

from typing import ClassVar

import pytest

from commgym.agents.oracle import OracleEntry
from commgym.agents.oracle_adaptive import PhaseChoice, SeedSchedule
from commgym.agents.rollout import Episode
from commgym.experiments.reruns import (
    RerunPlan,
    departure_lines,
    departures,
    near_tied,
    rerun_lines,
    rerun_name,
)

BUDGET = 30.0
SEEDS = [1000, 1001, 1002, 1003]


def _ep(seed, t, train=None):
    return Episode(
        seed=seed, decisions=10, train_time_s=train if train is not None else (t or BUDGET),
        time_to_target_s=t, final_eval_loss=0.1, final_eval_acc=0.9, bytes_per_step=1.0,
        episode_return=0.0, reason="target_reached" if t is not None else "time_budget",
    )  # fmt: skip


def _row(config, times, seeds=SEEDS):
    return OracleEntry.from_episodes(
        config, [_ep(s, t) for s, t in zip(seeds, times, strict=True)], BUDGET
    )


#: a: the search's winner; b within its noise; c, d clearly slower; e slower on every seed
#: by a constant 0.3 s (no spread: its difference from a is certain)
RANKING = sorted(
    [
        _row("a", [10.0, 11.0, 9.0, 10.0]),
        _row("b", [10.5, 10.0, 10.0, 10.5]),
        _row("c", [14.0, 15.0, 13.5, 14.2]),
        _row("d", [20.0, 21.0, 19.0, 22.0]),
        _row("e", [10.3, 11.3, 9.3, 10.3]),
    ],
    key=OracleEntry.rank_key,
)


def test_near_tied_keeps_the_top_three_and_every_entry_within_the_noise():
    assert near_tied(RANKING, SEEDS, BUDGET) == ["a", "b", "e"]
    # with the top one only, b (interval of b - a includes 0) stays, c, d and e do not
    assert near_tied(RANKING, SEEDS, BUDGET, at_least=1) == ["a", "b"]
    # one seed: no interval, the top entries only
    assert near_tied(RANKING, [1001], BUDGET, at_least=2) == ["b", "a"]


def test_misses_rank_last_and_count_at_the_budget():
    ranking = [_row("fast-miss", [5.0, None, 5.0, 5.0]), _row("slow", [12.0] * 4)]
    # fewest misses first; the miss counts as the budget (30 s), so fast-miss's paired
    # difference from slow (-7, +18, -7, -7 s) is within the noise: it is re-run too
    assert near_tied(ranking, SEEDS, BUDGET, at_least=1) == ["slow", "fast-miss"]
    ranking = [_row("miss-always", [None] * 4), _row("slow", [12.0] * 4)]
    assert near_tied(ranking, SEEDS, BUDGET, at_least=1) == ["slow"]


class _Static:
    """What RerunPlan reads of oracle-static (isinstance aside): a learned ranking."""


def test_plan_replaces_oracle_static_by_the_best_rerun(monkeypatch):
    from commgym.agents import OracleStaticAgent

    oracle = object.__new__(OracleStaticAgent)
    oracle.ranking = RANKING
    plan = RerunPlan({"oracle-static": oracle, "ppo": object()}, SEEDS, BUDGET)
    assert plan.entries == ["a", "b", "e"]
    assert plan.skip == {("oracle-static", s) for s in SEEDS}
    # the re-runs: a (the search's winner) is slower now, e the fastest
    rerun = {"a": [12.0] * 4, "e": [10.0, 10.5, 9.5, 10.0], "b": [11.0] * 4}
    played = {
        (rerun_name(e), s): _ep(s, t)
        for e, ts in rerun.items()
        for s, t in zip(SEEDS, ts, strict=True)
    }
    results, report = plan.fold(played)
    assert [ep.time_to_target_s for ep in results["oracle-static"]] == rerun["e"]
    assert [r.entry for r in report if r.chosen] == ["e"]
    a = next(r for r in report if r.entry == "a")
    assert a.search_s == pytest.approx(10.0) and a.rerun_s == pytest.approx(12.0)
    assert a.to_dict()["rerun_minus_search_s"] == pytest.approx(2.0)
    lines = rerun_lines(report)
    assert any("`e` (kept)" in ln for ln in lines) and any("+2.00" in ln for ln in lines)


def test_departures_say_where_a_rerun_went_past_its_search():
    phases = (PhaseChoice(0.0, "fast", "a"), PhaseChoice(4.0, "slow", "b"))
    conditions = ((0.0, "fast"), (4.0, "slow"), (6.4, "fast"), (10.4, "slow"))

    class _Adaptive:
        schedules: ClassVar = {
            1000: SeedSchedule(1000, "phases", phases, _ep(1000, 7.9), conditions),
            1001: SeedSchedule(1001, "context", (PhaseChoice(0.0, "fast", "a"),)),
        }

        def searched_until_s(self, seed):
            return 6.4

    rows = departures(_Adaptive(), [_ep(1000, 20.2), _ep(1001, 5.0)])
    assert rows == [
        {"seed": 1000, "search_s": 7.9, "rerun_s": 20.2, "searched_until_s": 6.4,
         "departed": True},
    ]  # fmt: skip
    assert "seed 1000: searched phases end at 6.40 s" in "\n".join(departure_lines("o", rows))
    within = departures(_Adaptive(), [_ep(1000, 6.0)])
    assert not within[0]["departed"]
    assert "stayed within" in departure_lines("o", within)[-1]
