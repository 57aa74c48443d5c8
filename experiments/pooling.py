"""Replication: one scenario's leaderboard run in several invocations, each and pooled.

One invocation of a few seeds does not settle a comparison: the machine's state moves
between invocations by more than a single run's interval admits (a learner's margin over
``oracle-static`` was +0.39 s a seed, p = 0.04, in one invocation and -1.36 s, p = 0.0003,
70 minutes later). A headline is therefore run in two or more invocations (hours apart, or
on other workers), and reported invocation by invocation *and* pooled: every (invocation,
seed) pair is one paired unit (the agents of one invocation ran that seed side by side,
seed-major), so the pooled paired test and intervals use them all.

``commgym leaderboard --eval-seed`` moves an invocation to new seeds (e.g. 1008-1015 after a
run on 1000-1007); ``commgym pool`` reads the ``leaderboard-<scenario>.csv`` of each
invocation and prints both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commgym.experiments.headroom import (
    Estimate,
    captured_fraction,
    has_headroom,
    headroom,
    paired_difference,
    seeds_needed,
)

__all__ = ["Invocation", "PooledRow", "pool", "pool_lines", "read_invocation"]


@dataclass(frozen=True)
class Invocation:
    """One leaderboard invocation of one scenario: per agent, per seed times to target.

    Attributes:
        label: where it came from (the CSV's folder).
        scenario: the scenario's name.
        seeds: evaluation seeds, in order.
        times: agent -> per-seed time to target, s (misses at the budget), in ``seeds`` order.
        roles: agent -> ``learned`` / ``baseline`` / ``oracle``.
        t_static: the agent whose times are T_static: ``oracle-static``, or a faster run
            of one of its near-tied entries by another player (``best-static``), as the
            leaderboard's ``headroom-<scenario>.json`` beside the CSV shows
            (:func:`~commgym.experiments.leaderboard_report.t_static_player`).
    """

    label: str
    scenario: str
    seeds: tuple[int, ...]
    times: dict[str, tuple[float, ...]]
    roles: dict[str, str]
    t_static: str = "oracle-static"


def read_invocation(path: str | Path, scenario: str | None = None) -> Invocation:
    """An invocation from a ``leaderboard-<scenario>.csv`` or the folder holding it.

    Args:
        path: the CSV, or a leaderboard ``--output-dir``.
        scenario: which scenario's CSV in a folder (needed when it holds several).

    Raises:
        FileNotFoundError: no such file or folder, or no matching CSV in the folder.
        ValueError: a folder with several scenarios and no ``scenario``; a CSV whose agents
            do not share one list of seeds.
    """
    from commgym.experiments.leaderboard import read_leaderboard_csv

    p = Path(path)
    if p.is_dir():
        pattern = f"leaderboard-{scenario}.csv" if scenario else "leaderboard-*.csv"
        found = sorted(p.glob(pattern))
        if not found:
            raise FileNotFoundError(f"no {pattern} in {str(p)!r}")
        if len(found) > 1:
            names = [f.stem.removeprefix("leaderboard-") for f in found]
            raise ValueError(f"{str(p)!r} holds several scenarios {names}: pass --scenario")
        p = found[0]
    elif not p.is_file():
        raise FileNotFoundError(f"no leaderboard CSV or folder at {str(p)!r}")
    rows = read_leaderboard_csv(p)
    if not rows:
        raise ValueError(f"{str(p)!r} has no rows")
    times: dict[str, dict[int, float]] = {}
    roles: dict[str, str] = {}
    for r in rows:
        times.setdefault(r["agent"], {})[int(r["seed"])] = float(r["time_to_target_s"])
        roles[r["agent"]] = r["role"]
    seeds = sorted(next(iter(times.values())))
    for agent, by_seed in times.items():
        if sorted(by_seed) != seeds:
            raise ValueError(f"{str(p)!r}: {agent} played seeds {sorted(by_seed)}, others {seeds}")
    scenario = str(rows[0]["scenario"])
    out = {a: tuple(t[s] for s in seeds) for a, t in times.items()}
    return Invocation(
        label=str(p.parent),
        scenario=scenario,
        seeds=tuple(seeds),
        times=out,
        roles=roles,
        t_static=_t_static(p.parent / f"headroom-{scenario}.json", out, roles),
    )


def _t_static(path: Path, times: dict[str, tuple[float, ...]], roles: dict[str, str]) -> str:
    """T_static's agent from the headroom report beside the CSV (``oracle-static`` without one).

    Reports written before the report named it (``t_static``) are read the same way: its
    near-tied re-runs and each agent's per-condition modal entry.
    """
    import json

    from commgym.experiments.leaderboard_report import constant_config, t_static_player

    if "oracle-static" not in times or not path.is_file():
        return "oracle-static"
    report = json.loads(path.read_text())
    tied = {r["entry"] for r in report.get("reruns", []) if r["oracle"] == "oracle-static"}
    actions = {
        a: {c: (v["config"], v["share"]) for c, v in table.items()}
        for a, table in report.get("actions", {}).items()
    }
    own = constant_config(actions.get("oracle-static", {}))
    tied |= {own} if own else set()
    means = {a: sum(t) / len(t) for a, t in times.items()}
    constants = {a: constant_config(actions.get(a, {})) for a in times}
    return t_static_player(means, constants, roles, tied)


@dataclass(frozen=True)
class PooledRow:
    """One agent in one invocation (or pooled): its mean, C and its margin over oracle-static.

    Attributes:
        label: the invocation's label, or ``"pooled"``.
        agent: the agent.
        n: paired units (seeds; pooled: every invocation's seeds).
        mean_s: mean time to target, s.
        captured: ``C`` with its interval (None without both oracles, or for an oracle).
        minus_static: mean of agent - T_static per unit, s, with its interval (T_static:
            :attr:`Invocation.t_static`'s times, oracle-static's unless a faster run of its
            entries is there).
        p_value: the paired t-test's p-value of ``minus_static``.
    """

    label: str
    agent: str
    n: int
    mean_s: float
    captured: Estimate | None
    minus_static: Estimate | None
    p_value: float


def _rows(
    label: str, times: dict[str, list[float]], roles: dict[str, str], t_static: list[float]
) -> tuple[Estimate | None, list[PooledRow]]:
    static, adaptive = t_static, times.get("oracle-adaptive")
    h = headroom(static, adaptive) if static and adaptive else None
    out = []
    for agent, t in times.items():
        c = d = None
        p = math.nan
        if roles.get(agent) != "oracle":
            if h is not None:
                c = captured_fraction(static, adaptive, t)
            if static:
                d, p = paired_difference(t, static)
        out.append(PooledRow(label, agent, len(t), sum(t) / len(t), c, d, p))
    return h, out


def pool(invocations: Sequence[Invocation]) -> dict[str, Any]:
    """Each invocation's figures and the pooled ones over every (invocation, seed) unit.

    Args:
        invocations: two or more invocations of the same scenario with the same agents.

    Returns:
        ``{"scenario", "invocations": [{"label", "seeds", "headroom", "rows"}], "pooled":
        {...same...}, "overlapping_seeds": [...]}``; each ``headroom`` an :class:`Estimate`
        (None without both oracles), rows :class:`PooledRow`.

    Raises:
        ValueError: fewer than two invocations, other scenarios or other agents.
    """
    if len(invocations) < 2:
        raise ValueError(
            f"pooling needs at least 2 invocations of a scenario, got {len(invocations)}"
        )
    first = invocations[0]
    for inv in invocations[1:]:
        if inv.scenario != first.scenario:
            raise ValueError(
                f"invocations of different scenarios: {first.scenario}, {inv.scenario}"
            )
        if set(inv.times) != set(first.times):
            raise ValueError(
                f"invocations compare different agents: {sorted(first.times)} "
                f"({first.label}) and {sorted(inv.times)} ({inv.label})"
            )
    seen: dict[int, int] = {}
    for inv in invocations:
        for s in inv.seeds:
            seen[s] = seen.get(s, 0) + 1
    report: dict[str, Any] = {
        "scenario": first.scenario,
        "invocations": [],
        "overlapping_seeds": sorted(s for s, k in seen.items() if k > 1),
    }
    pooled: dict[str, list[float]] = {a: [] for a in first.times}
    pooled_static: list[float] = []
    for inv in invocations:
        static = list(inv.times.get(inv.t_static, ()))
        h, rows = _rows(inv.label, {a: list(t) for a, t in inv.times.items()}, inv.roles, static)
        report["invocations"].append(
            {
                "label": inv.label, "seeds": list(inv.seeds), "headroom": h, "rows": rows,
                "t_static": inv.t_static,
            }
        )  # fmt: skip
        for a, t in inv.times.items():
            pooled[a] += list(t)
        pooled_static += static
    h, rows = _rows("pooled", pooled, first.roles, pooled_static)
    n = sum(len(inv.seeds) for inv in invocations)
    report["pooled"] = {"label": "pooled", "seeds": n, "headroom": h, "rows": rows}
    return report


def pool_lines(report: dict[str, Any]) -> list[str]:
    """The report as Markdown: per invocation and pooled, headroom then one row per agent."""
    lines = [f"**{report['scenario']}**: {len(report['invocations'])} invocations, pooled"]
    if report["overlapping_seeds"]:
        lines.append(
            f"(seeds {report['overlapping_seeds']} ran in more than one invocation: each run "
            "counts as its own unit)"
        )
    lines += [
        "",
        "| invocation | seeds | h [95% CI] | agent | mean s | C [95% CI] | - T_static s "
        "[95% CI] | p |",
        "|---|---:|---|---|---:|---|---|---:|",
    ]
    for block in [*report["invocations"], report["pooled"]]:
        h: Estimate | None = block["headroom"]
        seeds = block["seeds"]
        n = seeds if isinstance(seeds, int) else len(seeds)
        htext = "-" if h is None else f"{h}" + (" (established)" if has_headroom(h) else "")
        for i, r in enumerate(block["rows"]):
            first = i == 0
            diff = "-" if r.minus_static is None else f"{r.minus_static}"
            p = "-" if not math.isfinite(r.p_value) else f"{r.p_value:.3g}"
            c = "-" if r.captured is None else f"{r.captured}"
            lines.append(
                f"| {block['label'] if first else ''} | {n if first else ''} | "
                f"{htext if first else ''} | {r.agent} | {r.mean_s:.2f} | {c} | {diff} | {p} |"
            )
    for block in report["invocations"]:
        if block["t_static"] != "oracle-static":
            lines.append(
                f"\nT_static of {block['label']}: `{block['t_static']}`'s run of one of "
                "oracle-static's near-tied entries, faster than its re-run (the conservative "
                "choice)."
            )
    h = report["pooled"]["headroom"]
    if h is not None and not has_headroom(h):
        need = seeds_needed(h)
        lines.append(
            ""
            if need is None
            else f"\nPooled h is not established: about {need} seeds at this spread would be."
        )
    return lines
