"""The oracles' best static entries, chosen by re-runs instead of by a noisy search.

``oracle-static`` ranks every menu entry by one search on the evaluation seeds. When several
entries lie within the search's noise of each other, the one the search put first won by
luck as much as by speed, and re-running that winner alone overstates how fast the best
static entry is (it biases ``h`` and ``C`` up: the search took the lucky draw, the re-run
then measures it afresh while every competitor stays at its search time). So the
evaluation re-runs **every near-tied entry** on the evaluation seeds, interleaved with the
agents, and takes the best *re-run* mean as ``T_static``: the conservative choice, which
can only lower ``h`` and ``C``. The contextual oracle (conditions drawn per episode) gets
the same per condition: its entry for a condition is the best re-run over that condition's
seeds among the entries near-tied there.

An entry is near-tied with the search's best when the paired t-interval of its per-seed
difference from the best includes 0 (:func:`~commgym.experiments.headroom.paired_difference`),
and the top :data:`AT_LEAST` entries always are.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from commgym.agents.oracle import OracleEntry
from commgym.agents.rollout import Episode

__all__ = [
    "AT_LEAST",
    "Rerun",
    "RerunPlan",
    "departure_lines",
    "departures",
    "near_tied",
    "rerun_lines",
    "rerun_name",
]

#: Entries re-run at least (the search's top ones), near-tied or not.
AT_LEAST = 3


def rerun_name(entry: str) -> str:
    """The player name of a near-tied entry's re-run (``oracle re-run int8/4MB/H1``)."""
    return f"oracle re-run {entry}"


def _times(row: OracleEntry, seeds: Sequence[int], budget_s: float) -> list[float]:
    by_seed = {int(ep.seed): ep.time_to_target_s for ep in row.episodes}
    return [budget_s if by_seed[s] is None else float(by_seed[s]) for s in seeds]


def near_tied(
    ranking: Sequence[OracleEntry],
    seeds: Sequence[int],
    budget_s: float,
    *,
    at_least: int = AT_LEAST,
) -> list[str]:
    """The entries whose search on ``seeds`` is within the search's noise of the best.

    Args:
        ranking: ``oracle-static``'s ranking (each row's episodes cover ``seeds``).
        seeds: the seeds compared (all evaluation seeds, or one condition's).
        budget_s: what a missed target counts as, s.
        at_least: the top entries always included.

    Returns:
        Entries, best search first: the top ``at_least`` by mean time on ``seeds`` (misses
        at the budget, fewest misses first), then every other whose paired 95 % t-interval
        of the difference from the best includes 0 (with one seed: the top ones only).
    """
    from commgym.experiments.headroom import paired_difference

    seeds = list(seeds)

    def key(row: OracleEntry) -> tuple[int, float]:
        t = _times(row, seeds, budget_s)
        missed = sum(
            1 for ep in row.episodes if int(ep.seed) in seeds and ep.time_to_target_s is None
        )
        return missed, statistics.fmean(t)

    order = sorted(ranking, key=key)
    best = _times(order[0], seeds, budget_s)
    out = [r.config for r in order[:at_least]]
    if len(seeds) < 2:
        return out
    for row in order[at_least:]:
        diff, _ = paired_difference(_times(row, seeds, budget_s), best)
        # identical series have no spread: the interval is the point, and it is 0 here
        if diff.value == 0 or (math.isfinite(diff.low) and diff.low <= 0):
            out.append(row.config)
    return out


@dataclass(frozen=True)
class Rerun:
    """One near-tied entry, its search and its re-run, for one oracle (and condition).

    Attributes:
        oracle: the oracle it stands for (``oracle-static``, ``oracle-adaptive``).
        condition: the condition (contextual oracle), or ``None`` (all seeds).
        entry: the menu entry.
        seeds: the seeds compared.
        search_s: its search's mean time to target on them, s (misses at the budget).
        rerun_s: its re-run's mean, s.
        chosen: the entry with the best re-run (what the oracle's row reports).
    """

    oracle: str
    condition: str | None
    entry: str
    seeds: tuple[int, ...]
    search_s: float
    rerun_s: float
    chosen: bool

    def to_dict(self) -> dict[str, Any]:
        """Plain values."""
        return {
            "oracle": self.oracle,
            "condition": self.condition,
            "entry": self.entry,
            "seeds": list(self.seeds),
            "search_s": self.search_s,
            "rerun_s": self.rerun_s,
            "rerun_minus_search_s": self.rerun_s - self.search_s,
            "chosen": self.chosen,
        }


class RerunPlan:
    """Which players an evaluation adds for the oracles, and how their episodes fold back.

    ``oracle-static`` (an :class:`~commgym.agents.OracleStaticAgent` with ``oracle`` set and a
    ranking) is not played itself: its near-tied entries are, as static players named by
    :func:`rerun_name`, and its row becomes the best of their re-runs. ``oracle-adaptive``'s
    contextual seeds likewise; its phase schedules are re-run by the oracle itself.

    Args:
        agents: the evaluation's agents, by name.
        seeds: the evaluation seeds.
        budget_s: what a missed target counts as, s.
    """

    def __init__(self, agents: Mapping[str, Any], seeds: Sequence[int], budget_s: float) -> None:
        from commgym.agents import OracleAdaptiveAgent, OracleStaticAgent

        self.seeds = list(seeds)
        self.budget_s = float(budget_s)
        #: oracle name -> [(condition or None, its seeds, near-tied entries)]
        self.groups: dict[str, list[tuple[str | None, list[int], list[str]]]] = {}
        #: (oracle name, seed) pairs the oracle does not play (its episode is a re-run)
        self.skip: set[tuple[str, int]] = set()
        self._search: dict[str, OracleEntry] = {}
        for name, agent in agents.items():
            if isinstance(agent, OracleStaticAgent) and agent.oracle and agent.ranking:
                ranking = agent.ranking
                self.groups[name] = [(None, self.seeds, near_tied(ranking, self.seeds, budget_s))]
                self.skip |= {(name, s) for s in self.seeds}
            elif isinstance(agent, OracleAdaptiveAgent) and agent.schedules:
                ranking = agent.static.ranking
                for condition, group in agent.contextual_groups().items():
                    tied = near_tied(ranking, group, budget_s)
                    self.groups.setdefault(name, []).append((condition, group, tied))
                    self.skip |= {(name, s) for s in group}
            else:
                continue
            self._search.update({row.config: row for row in ranking})

    @property
    def entries(self) -> list[str]:
        """Every entry to re-run (each once, on every evaluation seed), in first-seen order."""
        out: list[str] = []
        for groups in self.groups.values():
            for _, _, tied in groups:
                out += [e for e in tied if e not in out]
        return out

    def players(self, env: Any) -> dict[str, Any]:
        """``rerun_name(entry)`` -> a static player of the entry, for every entry to re-run."""
        from commgym.agents import StaticAgent

        return {rerun_name(e): StaticAgent(env, preset=e) for e in self.entries}

    def _mean(self, eps: Sequence[Episode]) -> tuple[int, float]:
        times = [self.budget_s if e.time_to_target_s is None else e.time_to_target_s for e in eps]
        return sum(e.time_to_target_s is None for e in eps), statistics.fmean(times)

    def fold(
        self, played: Mapping[tuple[str, int], Episode]
    ) -> tuple[dict[str, list[Episode]], list[Rerun]]:
        """The oracles' episodes from the re-runs, and the re-run report.

        Args:
            played: ``(player name, seed) -> episode`` of everything the evaluation played.

        Returns:
            ``(oracle name -> its episodes in seed order (its own where it played, the
            chosen re-run's where it did not), the report rows)``.
        """
        results: dict[str, list[Episode]] = {}
        report: list[Rerun] = []
        for oracle, groups in self.groups.items():
            by_seed: dict[int, Episode] = {}
            for condition, seeds, tied in groups:
                reruns = {e: [played[(rerun_name(e), s)] for s in seeds] for e in tied}
                chosen = min(tied, key=lambda e: self._mean(reruns[e]))  # ties: search order
                for e in tied:
                    search = _times(self._search[e], seeds, self.budget_s)
                    report.append(
                        Rerun(
                            oracle, condition, e, tuple(seeds), statistics.fmean(search),
                            self._mean(reruns[e])[1], e == chosen,
                        )
                    )  # fmt: skip
                by_seed.update(zip(seeds, reruns[chosen], strict=True))
            for s in self.seeds:
                if (oracle, s) not in self.skip:
                    by_seed[s] = played[(oracle, s)]
            results[oracle] = [by_seed[s] for s in self.seeds]
        return results, report


def rerun_lines(report: Sequence[Rerun]) -> list[str]:
    """Markdown lines: each near-tied entry's search and re-run means, and which was kept."""
    if not report:
        return []
    lines = [
        "",
        "Near-tied entries re-run on the evaluation seeds (the best re-run is the oracle's "
        "entry; search = its time in the oracle's search):",
        "",
        "| oracle | condition | entry | search s | re-run s | re-run - search s |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in report:
        mark = " (kept)" if r.chosen else ""
        lines.append(
            f"| {r.oracle} | {r.condition or 'all seeds'} | `{r.entry}`{mark} | "
            f"{r.search_s:.2f} | {r.rerun_s:.2f} | {r.rerun_s - r.search_s:+.2f} |"
        )
    return lines


def departures(agent: Any, episodes: Sequence[Episode]) -> list[dict[str, Any]]:
    """Where ``oracle-adaptive``'s re-runs of its phase schedules left what the search covered.

    Args:
        agent: the learned :class:`~commgym.agents.OracleAdaptiveAgent`.
        episodes: its evaluation episodes (one per searched seed).

    Returns:
        One row per phase-schedule seed: ``seed``, ``search_s`` (the search's time to target,
        ``None``: missed), ``rerun_s`` (the re-run's), ``searched_until_s`` (where the
        searched phases end) and ``departed`` (the re-run trained past them, playing by
        condition from there).
    """
    rows = []
    for ep in episodes:
        sched = agent.schedules.get(int(ep.seed)) if ep.seed is not None else None
        if sched is None or sched.mode != "phases":
            continue
        until = agent.searched_until_s(int(ep.seed))
        reached = ep.time_to_target_s
        search = None if sched.search is None else sched.search.time_to_target_s
        rows.append(
            {
                "seed": int(ep.seed),
                "search_s": search,
                "rerun_s": reached,
                "searched_until_s": until if math.isfinite(until) else None,
                "departed": (reached if reached is not None else ep.train_time_s) > until,
            }
        )
    return rows


def departure_lines(name: str, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown lines for the re-runs that went past their search (none: one line saying so)."""
    if not rows:
        return []
    gone = [r for r in rows if r["departed"]]
    if not gone:
        return ["", f"`{name}`: every re-run stayed within its searched phases."]

    def fmt(t: float | None) -> str:
        return "missed" if t is None else f"{t:.2f} s"

    lines = ["", f"`{name}` re-runs that went past their search (then played by condition):"]
    for r in gone:
        lines.append(
            f"- seed {r['seed']}: searched phases end at {r['searched_until_s']:.2f} s; the "
            f"search reached the target at {fmt(r['search_s'])}, the re-run at "
            f"{fmt(r['rerun_s'])}."
        )
    return lines
