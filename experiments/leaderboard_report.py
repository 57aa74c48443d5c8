"""The leaderboard's report: its rows, tables, headroom report and the files it writes.

:func:`~commgym.experiments.leaderboard.run_leaderboard` (the sweep) plays every scenario
and hands the episodes here: one :class:`LeaderboardEntry` per (scenario, agent)
(:func:`entry_of`), speed-ups against the :data:`REFERENCES` (:func:`add_speedups`), the
printed table's rows (:data:`COLUMNS`, :func:`table_row`), the headroom report of a scenario
(:func:`headroom_report`: h, C and their intervals, the re-run and departure lines), the
per-agent MLflow metrics (:func:`agent_metrics`) and the files: ``leaderboard-<scenario>.csv``
/ ``.md`` (:func:`write_tables`), oracle-static's ranking (:func:`write_static_ranking`)
and oracle-adaptive's schedules (:func:`write_adaptive_schedules`). The readers
(:func:`read_leaderboard_csv`, :func:`read_static_ranking`) read those files back
(``commgym pool``, ``commgym headroom-bound``).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from commgym.agents.oracle import OracleEntry
from commgym.agents.rollout import Episode
from commgym.experiments.config import RunConfig
from commgym.experiments.evaluation import (
    mean_pm,
)
from commgym.experiments.headroom import (
    HEADROOM_FACTOR,
    Estimate,
    captured_fraction,
    has_headroom,
    headroom,
    paired_difference,
    seeds_needed,
    t_critical,
)
from commgym.experiments.reruns import Rerun, departure_lines, rerun_lines
from commgym.experiments.session import slug

__all__ = [
    "COLUMNS",
    "REFERENCES",
    "LeaderboardEntry",
    "add_speedups",
    "agent_metrics",
    "board_title",
    "entry_of",
    "headroom_report",
    "modal_actions",
    "read_leaderboard_csv",
    "read_static_ranking",
    "static_oracle_beaten",
    "strongest_baseline",
    "table_row",
    "write_adaptive_schedules",
    "write_static_ranking",
    "write_tables",
]

#: The references every speed-up is measured against.
REFERENCES = ("static:ddp-default", "autotune")


@dataclass
class LeaderboardEntry:
    """One agent in one scenario, over the evaluation seeds.

    Attributes:
        scenario: scenario name.
        agent: agent name as given (``ppo``, ``static:ddp-default``, ...).
        role: ``"learned"``, ``"baseline"`` or ``"oracle"``.
        seeds: evaluation seeds.
        time_to_target_s: per seed, seconds of training until the held-out loss first
            reached the target; the budget where it never did (see ``reached``).
        reached: per seed, whether the target was reached.
        final_eval_loss: per seed, held-out loss at the end of the episode (nats).
        final_eval_acc: per seed, held-out accuracy at the end.
        bytes_per_step: per seed, mean bytes handed to collectives per iteration.
        decisions: per seed, decisions of the episode.
        speedup: reference agent -> mean time to target of the reference / this agent's.
        cost_wall_s: wall time spent preparing the agent before evaluation (training,
            tuning, the oracle's search), seconds; ``nan`` for a loaded policy without a
            recorded cost.
        cost_real_decisions: real decisions spent preparing it.
        cost_parts: ``cost_wall_s`` by phase.
        captured: the share of the scenario's headroom this agent captured
            (:func:`~commgym.experiments.headroom.captured_fraction`); ``None`` for the
            oracles and where the scenario was not measured against both oracles.
    """

    scenario: str
    agent: str
    role: str
    seeds: list[int]
    time_to_target_s: list[float]
    reached: list[bool]
    final_eval_loss: list[float]
    final_eval_acc: list[float]
    bytes_per_step: list[float]
    decisions: list[int]
    speedup: dict[str, float] = field(default_factory=dict)
    cost_wall_s: float = 0.0
    cost_real_decisions: int = 0
    cost_parts: dict[str, float] = field(default_factory=dict)
    captured: Estimate | None = None

    @property
    def time_to_target_mean_s(self) -> float:
        """Mean over seeds (unreached seeds at the budget)."""
        return statistics.fmean(self.time_to_target_s)

    @property
    def time_to_target_ci95_s(self) -> float:
        """Half-width of the 95 % t-interval of the mean (NaN for one seed)."""
        from commgym.experiments.plots import mean_ci

        return mean_ci(self.time_to_target_s)[1]


def entry_of(
    scenario: str, name: str, role: str, eps: list[Episode], budget_s: float
) -> LeaderboardEntry:
    """The row of ``name`` in ``scenario`` (a missed target counts as ``budget_s``)."""
    return LeaderboardEntry(
        scenario=scenario,
        agent=name,
        role=role,
        seeds=[e.seed for e in eps],
        time_to_target_s=[
            budget_s if e.time_to_target_s is None else float(e.time_to_target_s) for e in eps
        ],
        reached=[e.time_to_target_s is not None for e in eps],
        final_eval_loss=[e.final_eval_loss for e in eps],
        final_eval_acc=[e.final_eval_acc for e in eps],
        bytes_per_step=[e.bytes_per_step for e in eps],
        decisions=[e.decisions for e in eps],
    )


def add_speedups(entries: list[LeaderboardEntry]) -> None:
    """Fill each entry's ``speedup`` against every one of the :data:`REFERENCES` present."""
    by_name = {e.agent: e for e in entries}
    for e in entries:
        for ref in REFERENCES:
            if ref in by_name:
                e.speedup[ref] = by_name[ref].time_to_target_mean_s / e.time_to_target_mean_s


#: Columns of the per-scenario table (CSV, Markdown and the terminal).
COLUMNS = (
    "agent",
    "time to target s (mean ± 95% CI)",
    "reached",
    "vs ddp-default",
    "vs autotune",
    "final eval loss",
    "accuracy",
    "bytes/step",
    "preparation cost",
)


def table_row(e: LeaderboardEntry) -> list[str]:
    """The printed table's cells of ``e``, in :data:`COLUMNS` order."""

    def speed(ref: str) -> str:
        v = e.speedup.get(ref)
        return "-" if v is None or not math.isfinite(v) else f"{v:.2f}x"

    if e.cost_real_decisions or e.cost_wall_s:
        cost = (
            f"{e.cost_wall_s:.0f} s, {e.cost_real_decisions} real decisions"
            if math.isfinite(e.cost_wall_s)
            else "loaded"
        )
    else:
        cost = "none"
    label = e.agent + (" (oracle)" if e.role == "oracle" else "")
    label += " (learned)" if e.role == "learned" else ""
    return [
        label,
        mean_pm(e.time_to_target_s, ".2f"),
        f"{sum(e.reached)}/{len(e.reached)}",
        speed("static:ddp-default"),
        speed("autotune"),
        mean_pm(e.final_eval_loss, ".4f"),
        f"{statistics.fmean(e.final_eval_acc):.3f}",
        f"{statistics.fmean(e.bytes_per_step):,.0f}",
        cost,
    ]


def strongest_baseline(entries: list[LeaderboardEntry]) -> LeaderboardEntry | None:
    """The non-oracle, non-learned agent with the lowest mean time to target (None if none)."""
    baselines = [e for e in entries if e.role == "baseline"]
    return min(baselines, key=lambda e: e.time_to_target_mean_s) if baselines else None


def modal_actions(episodes: list[Episode]) -> dict[str, tuple[str, float, int, float]]:
    """Per condition, the configuration an agent played most, and how varied its play was.

    Args:
        episodes: one agent's evaluation episodes (their steps carry the condition).

    Returns:
        condition label -> ``(modal configuration, its share of the decisions under that
        condition, number of decisions, entropy of the configurations played there in
        bits)``; decisions without a condition count as ``"-"``. The entropy is the
        empirical one of what was played (0: one configuration), whatever the agent's kind.
    """
    from collections import Counter

    counts: dict[str, Counter[str]] = {}
    for ep in episodes:
        for step in ep.steps:
            counts.setdefault(step.condition or "-", Counter())[step.config] += 1
    out = {}
    for cond, c in counts.items():
        config, n = c.most_common(1)[0]
        total = sum(c.values())
        p = np.array(list(c.values()), dtype=np.float64) / total
        out[cond] = (config, n / total, total, max(0.0, float(-(p * np.log2(p)).sum())))
    return out


def constant_config(table: dict[str, tuple[str, float, int, float]]) -> str | None:
    """The one entry a player played on every decision of every condition (else ``None``).

    ``table`` is :func:`modal_actions`' per-condition ``(entry, share, decisions, ...)``.
    """
    played = {v[0] for v in table.values()}
    if len(played) != 1 or any(v[1] < 1.0 for v in table.values()):
        return None
    return played.pop()


def t_static_player(
    means: dict[str, float],
    constants: dict[str, str | None],
    roles: dict[str, str],
    tied: set[str],
) -> str:
    """Whose times are T_static: oracle-static, or a faster run of one of its entries.

    oracle-static's row is the best re-run of its near-tied entries (``tied``); a player
    that played one of those entries throughout (``best-static``, a static baseline) ran
    that entry again on the same seeds, so its run is one more re-run, and the best of them
    all is T_static: the conservative choice (issue 38), which can only lower h and C.

    Args:
        means: agent -> mean time to target on the seeds, s (``oracle-static`` included).
        constants: agent -> the one entry it played throughout (:func:`constant_config`).
        roles: agent -> ``learned`` / ``baseline`` / ``oracle``.
        tied: oracle-static's near-tied entries (its own entry where it was not re-run).

    Returns:
        The agent's name (``"oracle-static"`` unless another run of its entries is faster).
    """
    best = "oracle-static"
    for agent, mean in means.items():
        if roles.get(agent) != "oracle" and constants.get(agent) in tied and mean < means[best]:
            best = agent
    return best


def static_oracle_beaten(
    entries: list[LeaderboardEntry],
    actions: dict[str, dict[str, tuple[str, float, int, float]]],
    static: LeaderboardEntry | None,
) -> list[dict[str, Any]]:
    """Agents that played one configuration throughout and beat ``oracle-static``.

    ``oracle-static`` is the best menu entry *in hindsight*; a constant player faster than
    it (paired t-test over the seeds, p < 0.05) proves that its search measured other
    conditions than the evaluation did (a machine busy with other work during the search,
    for one), and every figure derived from it (h, C) is then wrong.
    """
    if static is None:
        return []
    out = []
    for e in entries:
        config = constant_config(actions.get(e.agent, {}))
        if e.role == "oracle" or config is None:
            continue
        diff, p = paired_difference(e.time_to_target_s, static.time_to_target_s)
        if diff.value < 0 and p < 0.05:
            out.append(
                {
                    "agent": e.agent,
                    "config": config,
                    "time_s": mean_pm(e.time_to_target_s, ".2f"),
                    "oracle_static_s": mean_pm(static.time_to_target_s, ".2f"),
                    "p_value": p,
                }
            )
    return out


def headroom_report(
    scenario: str,
    entries: list[LeaderboardEntry],
    results: dict[str, list[Episode]],
    out: Path,
    reruns: list[Rerun] = (),
    gone: dict[str, list[dict[str, Any]]] | None = None,
) -> tuple[list[str], dict[str, Any], Path]:
    """Headroom, captured fractions, strongest baseline and per-condition actions.

    Sets :attr:`LeaderboardEntry.captured` and writes ``headroom-<scenario>.json``, with the
    oracles' near-tied re-runs (``reruns``) and where ``oracle-adaptive``'s re-runs went
    past their search (``gone``: oracle name -> :func:`~commgym.experiments.reruns.departures`).

    Returns:
        ``(Markdown lines that follow the scenario's table, the report, its file)``.
    """
    by_agent = {e.agent: e for e in entries}
    static = next((e for e in entries if e.agent == "oracle-static"), None)
    adaptive = next((e for e in entries if e.agent == "oracle-adaptive"), None)
    strongest = strongest_baseline(entries)
    report: dict[str, Any] = {"scenario": scenario, "seeds": entries[0].seeds}
    lines: list[str] = [""]
    if strongest is not None:
        report["strongest_baseline"] = strongest.agent
        lines.append(
            f"Strongest non-oracle baseline: `{strongest.agent}` "
            f"({mean_pm(strongest.time_to_target_s, '.2f')} s)."
        )
    actions = {name: modal_actions(eps) for name, eps in results.items() if name in by_agent}
    tied = {r.entry for r in reruns if r.oracle == "oracle-static"}
    own = None if static is None else constant_config(actions.get(static.agent, {}))
    tied |= {own} if own else set()  # oracle-static played without re-runs: its own entry
    same = [e for e in entries if constant_config(actions.get(e.agent, {})) in tied]
    # a run of one of oracle-static's own entries that beats its re-run is another re-run
    # of that entry (T_static below), not a sign that the search measured other conditions
    beaten = static_oracle_beaten([e for e in entries if e not in same], actions, static)
    if beaten:
        report["static_oracle_beaten_by"] = beaten
        for b in beaten:
            lines.append(
                f"**oracle-static is not the best fixed configuration here**: `{b['agent']}` "
                f"played `{b['config']}` throughout and reached the target in "
                f"{b['time_s']} s against oracle-static's {b['oracle_static_s']} s (paired "
                f"t-test p = {b['p_value']:.3g}). The search ran under other conditions than "
                "this evaluation (e.g. another machine load), so h and C are not valid here; "
                "rerun the scenario on an otherwise idle machine."
            )
    if reruns:
        report["reruns"] = [r.to_dict() for r in reruns]
        lines += rerun_lines(reruns)
    for name, rows in (gone or {}).items():
        report.setdefault("departures", {})[name] = rows
        lines += departure_lines(name, rows)
    if static is not None and adaptive is not None:
        who = t_static_player(
            {e.agent: e.time_to_target_mean_s for e in entries},
            {e.agent: constant_config(actions.get(e.agent, {})) for e in entries},
            {e.agent: e.role for e in entries}, tied,
        )  # fmt: skip
        t_static = by_agent[who]
        other = None if who == static.agent else constant_config(actions[who])
        if other is not None:
            report["t_static"] = {
                "agent": t_static.agent, "config": other,
                "time_s": t_static.time_to_target_mean_s,
                "oracle_static_s": static.time_to_target_mean_s,
            }  # fmt: skip
            lines.append(
                f"T_static is `{t_static.agent}`'s run of `{other}`, one of oracle-static's "
                f"near-tied entries ({t_static.time_to_target_mean_s:.2f} s against "
                f"oracle-static's re-run, {static.time_to_target_mean_s:.2f} s): the best run "
                "of those entries on these seeds, the conservative choice (it can only lower "
                "h and C)."
            )
        h = headroom(t_static.time_to_target_s, adaptive.time_to_target_s)
        shown = has_headroom(h) and not beaten
        need = seeds_needed(h)
        report["headroom"] = {
            **asdict(h), "established": shown, "valid": not beaten, "seeds_needed": need,
        }  # fmt: skip
        report["captured"] = {}
        for e in entries:
            if e.role == "oracle":
                continue
            c = captured_fraction(
                t_static.time_to_target_s, adaptive.time_to_target_s, e.time_to_target_s
            )
            e.captured = c if shown else None
            report["captured"][e.agent] = asdict(c)
        if beaten:
            verdict = f"h = {h} **not valid** (oracle-static was beaten, above)"
        elif shown:
            verdict = f"headroom h = {h}"
        else:
            more = (
                f"; with this spread {need} seeds would establish it"
                if need is not None and need > h.n
                else "; more seeds would not establish it at this spread"
                if need is None
                else ""
            )
            verdict = (
                f"**no headroom**: h = {h} is below {HEADROOM_FACTOR:g}x its interval's "
                f"half-width, so agents are not ranked on the captured fraction{more}"
            )
        z = f"{h.z:.1f}" if math.isfinite(h.z) else "-"
        lines.append(
            f"Adaptation: {verdict} (h = {z} standard errors; the rule needs "
            f"{HEADROOM_FACTOR:g} x t(0.975, {h.n - 1}) = "
            f"{HEADROOM_FACTOR * t_critical(max(h.n, 2)):.1f}; T_static "
            f"{t_static.time_to_target_mean_s:.2f} s, oracle-adaptive "
            f"{adaptive.time_to_target_mean_s:.2f} s; paired jackknife t-intervals over "
            f"{h.n} seeds)."
        )
        if shown:
            captured = [e for e in entries if e.captured is not None]
            lines.append(
                "Captured fraction C = (T_static - T_agent) / (T_static - T_adaptive) "
                "[95% CI]: " + "; ".join(f"`{e.agent}` {e.captured}" for e in captured) + "."
            )
    learned = [e for e in entries if e.role == "learned"]
    for e in learned:
        cmp: dict[str, Any] = {}
        if static is not None:
            diff, p = paired_difference(e.time_to_target_s, static.time_to_target_s)
            cmp["minus_oracle_static_s"] = {**asdict(diff), "p_value": p}
            lines.append(
                f"`{e.agent}` - oracle-static: {diff} s per seed (paired t-test p = {p:.3g})."
            )
        if strongest is not None:
            ratio = strongest.time_to_target_mean_s / e.time_to_target_mean_s
            cmp["speedup_vs_strongest_baseline"] = ratio
            lines.append(f"`{e.agent}` vs `{strongest.agent}`: {ratio:.2f}x faster.")
        report.setdefault("learned", {})[e.agent] = cmp
    report["actions"] = {
        name: {
            c: {"config": v[0], "share": v[1], "decisions": v[2], "entropy_bits": v[3]}
            for c, v in table.items()
        }
        for name, table in actions.items()
    }
    conditions = sorted({c for table in actions.values() for c in table})
    if len(conditions) > 1:
        lines += [
            "",
            "Most played configuration per condition (share of its decisions; entropy of "
            "what was played there, bits):",
            "",
        ]
        lines.append("| agent | " + " | ".join(conditions) + " |")
        lines.append("|---|" + "---|" * len(conditions))
        for name, table in actions.items():
            cells = [
                f"{table[c][0]} ({table[c][1]:.0%}, {table[c][3]:.1f} b)" if c in table else "-"
                for c in conditions
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    path = out / f"headroom-{slug(scenario)}.json"
    path.write_text(json.dumps(report, indent=1, default=_json_number))
    return lines, report, path


def agent_metrics(key: str, e: LeaderboardEntry, report: dict[str, Any]) -> dict[str, float]:
    """An agent's captured fraction and the entropy of its play, per condition and overall."""
    out: dict[str, float] = {}
    if e.captured is not None:
        out[f"{key}/captured"] = e.captured.value
    table = report.get("actions", {}).get(e.agent, {})
    total = sum(v["decisions"] for v in table.values())
    if total:
        out[f"{key}/action_entropy_bits"] = (
            sum(v["entropy_bits"] * v["decisions"] for v in table.values()) / total
        )
    for cond, v in table.items():
        out[f"{key}/action_entropy_bits/{slug(cond)}"] = v["entropy_bits"]
    return out


def _json_number(x: Any) -> Any:
    """JSON for the odd values of a report (infinite interval ends as strings)."""
    return str(x)


def board_title(cfg: RunConfig, scenario: str, seeds: int) -> str:
    """A scenario table's title: workload, ranks, network, seeds, budget, target."""
    env = cfg.env_config
    return (
        f"{scenario}: {env.workload}, {env.world_size} ranks, {env.network_plan.label()}, "
        f"{seeds} seeds, target held-out loss {env.target_loss}, budget {env.time_budget_s} s"
    )


def write_tables(
    scenario: str,
    title: str,
    entries: list[LeaderboardEntry],
    out: Path,
    notes: list[str] = (),
) -> tuple[Path, Path]:
    """Write ``leaderboard-<scenario>.csv`` and ``.md`` (title, rows, notes); return both paths."""
    csv_path = out / f"leaderboard-{slug(scenario)}.csv"
    with csv_path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "scenario", "agent", "role", "seed", "time_to_target_s", "reached",
                "final_eval_loss", "final_eval_acc", "bytes_per_step", "decisions",
                "speedup_vs_ddp_default", "speedup_vs_autotune", "cost_wall_s",
                "cost_real_decisions",
            ]
        )  # fmt: skip
        for e in entries:
            for i, seed in enumerate(e.seeds):
                w.writerow(
                    [
                        scenario, e.agent, e.role, seed, e.time_to_target_s[i], e.reached[i],
                        e.final_eval_loss[i], e.final_eval_acc[i], e.bytes_per_step[i],
                        e.decisions[i], e.speedup.get("static:ddp-default", math.nan),
                        e.speedup.get("autotune", math.nan), e.cost_wall_s,
                        e.cost_real_decisions,
                    ]
                )  # fmt: skip
    md_path = out / f"leaderboard-{slug(scenario)}.md"
    lines = [f"**{title}**", "", "| " + " | ".join(COLUMNS) + " |"]
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(COLUMNS) - 1)) + "|")
    lines += ["| " + " | ".join(table_row(e)) + " |" for e in entries]
    lines += list(notes)
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


def read_leaderboard_csv(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``leaderboard-<scenario>.csv`` (one per agent and seed), numbers parsed."""
    rows = []
    with Path(path).open(newline="") as fh:
        for r in csv.DictReader(fh):
            out: dict[str, Any] = {}
            for k, v in r.items():
                if k in ("scenario", "agent", "role"):
                    out[k] = v
                elif k == "reached":
                    out[k] = v == "True"
                else:
                    out[k] = float(v)
            rows.append(out)
    return rows


def write_static_ranking(agent: Any, scenario: str, out: Path) -> Path | None:
    """The oracle's ranking of every menu entry (``static-entries-<scenario>.csv``)."""
    ranking = getattr(agent, "ranking", None)
    if not ranking:
        return None
    path = out / f"static-entries-{slug(scenario)}.csv"
    rows = [r.to_dict(json_safe=False) for r in ranking]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow(
                {
                    k: json.dumps(v) if isinstance(v, list | tuple | dict) else v
                    for k, v in r.items()
                }
            )
    return path


#: The columns of ``static-entries-<scenario>.csv`` whose cells are JSON.
_STATIC_JSON_COLUMNS = ("times_to_target_s", "episodes")


def read_static_ranking(path: str | Path) -> list[OracleEntry]:
    """The ranking in a ``static-entries-<scenario>.csv`` written by the leaderboard.

    Args:
        path: the CSV (``oracle-static``'s ranking of every menu entry, best first).

    Returns:
        Its rows as :class:`~commgym.agents.oracle.OracleEntry`, in the file's order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not such a CSV (a column missing, a cell that does not parse), or no row.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no static-entries CSV at {str(path)!r}")
    need = ("config", "mean_time_to_target_s", "seeds_reached", "final_eval_loss")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in (*need, *_STATIC_JSON_COLUMNS) if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(
                f"{str(path)!r} is not oracle-static's static-entries CSV: no column {missing}"
            )
        try:
            rows = [
                OracleEntry.from_dict({**r, **{c: json.loads(r[c]) for c in _STATIC_JSON_COLUMNS}})
                for r in reader
            ]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{str(path)!r}: a row does not parse ({err})") from err
    if not rows:
        raise ValueError(f"{str(path)!r} has no entry")
    return rows


def write_adaptive_schedules(agent: Any, scenario: str, out: Path) -> Path | None:
    """oracle-adaptive's schedule per seed, with every candidate tried per phase."""
    schedules = getattr(agent, "schedules", None)
    if not schedules:
        return None
    path = out / f"adaptive-schedules-{slug(scenario)}.json"
    data = {"base": agent.base, "seeds": [s.to_dict() for s in schedules.values()]}
    path.write_text(json.dumps(data, indent=1))
    return path
