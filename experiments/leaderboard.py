"""``commgym leaderboard``: scenario x agent x seed on real ranks, in one table per scenario.

Every scenario (a shipped or user YAML file, see :mod:`commgym.experiments.config`) is run
on its own real ranks (and emulated network). Each agent plays the same evaluation seeds;
learned agents load a saved policy or are trained first by the recipe of ``commgym train``
(:func:`~commgym.experiments.train.learn_agent`: record real decisions, fit the surrogate,
learn on it, optionally fine-tune on real ranks), with that cost reported; tuning baselines
tune first (cost reported); ``autotune`` tunes inside every episode (its tuning counts in
the measured time); ``oracle-static`` searches every menu entry on the evaluation seeds
(search cost reported apart: it is the upper bound of any static tuner, not a method a
user could run).

Time to target of a seed that never reached the target counts as the scenario's training
budget (a lower bound of the true time, so a mean over such seeds flatters the agent); the
``reached`` column says how many seeds did. Speed-ups are ratios of those means.

One MLflow parent run per leaderboard; every evaluation episode is a child run with the
scenario as a parameter; tables (CSV and Markdown) and figures are logged to the parent.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.table import Table

from commgym.agents.oracle import OracleEntry
from commgym.agents.oracle_adaptive import OracleAdaptiveAgent
from commgym.agents.rollout import Episode
from commgym.experiments.config import RunConfig, load_run_config
from commgym.experiments.evaluation import (
    TrainingCost,
    compare,
    mean_pm,
    prepare_baseline,
    sim_to_real_gap,
)
from commgym.experiments.executor import open_executor
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
from commgym.experiments.progress import console
from commgym.experiments.reruns import Rerun, departure_lines, departures, rerun_lines
from commgym.experiments.session import announce, check_network, make_env, slug, start_ranks
from commgym.experiments.train import learn_agent

__all__ = [
    "DEFAULT_AGENTS",
    "DEFAULT_SCENARIOS",
    "LeaderboardEntry",
    "read_leaderboard_csv",
    "read_static_ranking",
    "run_leaderboard",
    "scenario_name",
]

#: Scenarios of the README's leaderboard (shipped in ``experiments/configs``).
DEFAULT_SCENARIOS = ("default", "slow-link", "changing-link", "mixed-links")

#: Agents of the README's leaderboard: the learned policy against what a user would
#: otherwise run.
DEFAULT_AGENTS = (
    "ppo",
    "autotune",
    "oracle-static",
    "oracle-adaptive",
    "static:ddp-default",
    "static:fp16-dense",
    "bayesopt",
    "bandit",
    "accordion",
    "adacomm",
)

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


def _entry(
    scenario: str, name: str, role: str, eps: list[Episode], budget_s: float
) -> LeaderboardEntry:
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


def scenario_name(scenario: str | Path) -> str:
    """A scenario's label: the shipped name, or a YAML file's stem (``runs/my.yaml`` -> ``my``)."""
    p = Path(scenario)
    return p.stem if p.suffix in (".yaml", ".yml") else str(scenario)


def _role(name: str) -> str:
    from commgym.agents import AGENTS

    cls = AGENTS.get(name.split(":", 1)[0])
    if cls is not None and cls.oracle:
        return "oracle"
    if cls is not None and cls.learned:
        return "learned"
    return "baseline"


def _scenario_config(scenario: str, overrides: dict[str, Any]) -> RunConfig:
    cfg = load_run_config(scenario, overrides)
    if cfg.env.get("target_loss") is None:
        raise ValueError(
            f"scenario {scenario!r} has no env.target_loss: the leaderboard ranks agents by "
            "time to target, so every scenario needs one"
        )
    return cfg


def _learned(
    name: str,
    cfg: RunConfig,
    env: Any,
    parent: Any,
    out: Path,
    policy_dir: Path | None,
    prefix: str,
    executor: Any = None,
) -> tuple[Any, TrainingCost, Any]:
    """Load ``<policy_dir>/<agent>/policy.zip`` if it exists, else train by the recipe."""
    from commgym.agents import load_agent

    saved = None if policy_dir is None else policy_dir / slug(name) / "policy.zip"
    if saved is not None and saved.is_file():
        agent = load_agent(saved, env=env)
        cost = TrainingCost(wall_s=math.nan)
        record = saved.with_name("policy.cost.json")
        if record.is_file():
            cost = TrainingCost(**json.loads(record.read_text()))
        console.print(f"{name}: loaded {saved} (training cost as recorded: {cost.wall_s:.1f} s)")
        return agent, cost, None
    agent_out = out / slug(name)
    agent_out.mkdir(parents=True, exist_ok=True)
    agent, cost, surrogate = learn_agent(
        cfg, env, parent, agent_out, prefix=f"{prefix}/", executor=executor
    )
    (agent_out / "policy.cost.json").write_text(json.dumps(asdict(cost), indent=1))
    console.print(
        f"{name}: trained in {cost.wall_s:.1f} s with {cost.real_decisions} real decisions "
        f"({', '.join(f'{k} {v:.1f}' for k, v in cost.parts.items())})"
    )
    return agent, cost, surrogate


def _speedups(entries: list[LeaderboardEntry]) -> None:
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


def _row(e: LeaderboardEntry) -> list[str]:
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


def _static_oracle_beaten(
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
        table = actions.get(e.agent, {})
        played = {v[0] for v in table.values()}
        if e.role == "oracle" or len(played) != 1 or any(v[1] < 1.0 for v in table.values()):
            continue
        diff, p = paired_difference(e.time_to_target_s, static.time_to_target_s)
        if diff.value < 0 and p < 0.05:
            out.append(
                {
                    "agent": e.agent,
                    "config": played.pop(),
                    "time_s": mean_pm(e.time_to_target_s, ".2f"),
                    "oracle_static_s": mean_pm(static.time_to_target_s, ".2f"),
                    "p_value": p,
                }
            )
    return out


def _headroom(
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
    beaten = _static_oracle_beaten(entries, actions, static)
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
        h = headroom(static.time_to_target_s, adaptive.time_to_target_s)
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
                static.time_to_target_s, adaptive.time_to_target_s, e.time_to_target_s
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
            f"{HEADROOM_FACTOR * t_critical(max(h.n, 2)):.1f}; oracle-static "
            f"{static.time_to_target_mean_s:.2f} s, oracle-adaptive "
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


def _agent_metrics(key: str, e: LeaderboardEntry, report: dict[str, Any]) -> dict[str, float]:
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


def _title(cfg: RunConfig, scenario: str, seeds: int) -> str:
    env = cfg.env_config
    return (
        f"{scenario}: {env.workload}, {env.world_size} ranks, {env.network_plan.label()}, "
        f"{seeds} seeds, target held-out loss {env.target_loss}, budget {env.time_budget_s} s"
    )


def _write_tables(
    scenario: str,
    title: str,
    entries: list[LeaderboardEntry],
    out: Path,
    notes: list[str] = (),
) -> tuple[Path, Path]:
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
    lines += ["| " + " | ".join(_row(e)) + " |" for e in entries]
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


def _static_ranking(agent: Any, scenario: str, out: Path) -> Path | None:
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


def _adaptive_schedules(agent: Any, scenario: str, out: Path) -> Path | None:
    """oracle-adaptive's schedule per seed, with every candidate tried per phase."""
    schedules = getattr(agent, "schedules", None)
    if not schedules:
        return None
    path = out / f"adaptive-schedules-{slug(scenario)}.json"
    data = {"base": agent.base, "seeds": [s.to_dict() for s in schedules.values()]}
    path.write_text(json.dumps(data, indent=1))
    return path


def run_leaderboard(
    scenarios: list[str] | tuple[str, ...] = DEFAULT_SCENARIOS,
    agents: list[str] | tuple[str, ...] = DEFAULT_AGENTS,
    seeds: int = 3,
    *,
    output_dir: str | Path = "commgym-out/leaderboard",
    tracking_uri: str | None = None,
    experiment: str = "commgym-leaderboard",
    policy_dir: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    ray_envs: int | None = None,
) -> dict[str, list[LeaderboardEntry]]:
    """Run every scenario x agent x seed on real ranks; write tables and figures.

    Args:
        scenarios: scenario files or shipped names (each needs ``env.target_loss``).
        agents: agent names (``AGENTS`` keys or ``static:<preset>``); SB3 agents are the
            learned ones.
        seeds: evaluation seeds per agent (``eval_seed + i``), >= 1 (3 for intervals).
        output_dir: folder of the tables (``leaderboard-<scenario>.csv`` / ``.md``,
            ``leaderboard.md``), figures and each scenario's episodes (``<scenario>/``).
        tracking_uri: MLflow store (default: ``./mlflow.db`` or ``MLFLOW_TRACKING_URI``).
        experiment: MLflow experiment of the parent run.
        policy_dir: folder holding ``<scenario>/<agent>/policy.zip`` policies to load
            instead of training (with ``policy.cost.json`` beside each for its recorded
            training cost): the ``output_dir`` of an earlier leaderboard.
        overrides: run-config overrides applied to every scenario (``load_run_config``
            keys, e.g. ``{"timesteps": 5000, "env.time_budget_s": 10}``).
        executor: where the episodes run: ``"local"`` (here, one after another) or
            ``"ray"`` (each scenario's independent cells in parallel on env actors of a
            Ray cluster; :mod:`commgym.experiments.executor`).
        ray_address: the Ray cluster (``"auto"``, ``HOST:PORT``; ``None``:
            ``$RAY_ADDRESS`` or a local instance).
        ray_envs: env actors per scenario (``None``: as many as the cluster holds).

    Returns:
        Scenario -> entries in ``agents`` order.

    Raises:
        ValueError: an unknown scenario, agent or override; a scenario without a target.
        FileNotFoundError: a scenario file that does not exist.
    """
    from commgym.agents import make_agent  # noqa: F401 - fail on a broken install early

    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be an integer >= 1, got {seeds!r}")
    if not scenarios or not agents:
        raise ValueError("the leaderboard needs at least one scenario and one agent")
    learned = [a for a in agents if _role(a) == "learned"]
    base = {**(overrides or {}), "episodes": seeds, "baselines": []}
    # the scenario's own config: for its learned agent, else for a baseline (which has
    # no fine-tuning to give episodes to)
    ref = (
        {**base, "agent": learned[0]}
        if learned
        else {**{k: v for k, v in base.items() if k != "fine_tune_episodes"}, "agent": "random"}
    )
    # every scenario, agent name, static preset and network is checked before any rank starts
    configs: dict[str, RunConfig] = {}
    for s in scenarios:
        name = scenario_name(s)
        configs[name] = _scenario_config(s, ref)
        for a in agents:
            try:
                load_run_config(s, {**ref, "baselines": [a]})
            except ValueError as err:
                raise ValueError(f"scenario {name!r}: {err}") from None
        env = configs[name].env_config
        check_network(env.network_plan, env.network_strict, f"scenario {name!r}")
    if len(configs) != len(scenarios):
        raise ValueError(f"scenario names must be distinct, got {list(scenarios)}")
    files = dict(zip(configs, scenarios, strict=True))
    where = load_run_config(
        None, {"executor": executor, "ray_address": ray_address, "ray_envs": ray_envs}
    )
    with open_executor(where) as ray_executor:
        return _run(
            configs, files, agents, seeds, base, Path(output_dir), tracking_uri, experiment,
            policy_dir, scenarios, ray_executor,
        )  # fmt: skip


def _run(
    configs: dict[str, RunConfig],
    files: dict[str, str],
    agents: list[str] | tuple[str, ...],
    seeds: int,
    base: dict[str, Any],
    out: Path,
    tracking_uri: str | None,
    experiment: str,
    policy_dir: str | Path | None,
    scenarios: list[str] | tuple[str, ...],
    executor: Any,
) -> dict[str, list[LeaderboardEntry]]:
    """:func:`run_leaderboard` once its input is validated (and its executor open)."""
    from commgym.experiments.plots import comparison_plot
    from commgym.experiments.tracking import Tracker, reproducibility_params

    out.mkdir(parents=True, exist_ok=True)
    policies = None if policy_dir is None else Path(policy_dir)
    tracker = Tracker(tracking_uri, experiment=experiment)
    announce(tracker)
    board: dict[str, list[LeaderboardEntry]] = {}
    markdown: list[str] = []
    figures: list[Path] = []
    with tracker.start_run("leaderboard", tags={"commgym.command": "leaderboard"}) as parent:
        parent.log_params(
            {
                "scenarios": ",".join(scenarios),
                "agents": ",".join(agents),
                "seeds": seeds,
                **reproducibility_params(),
            }
        )
        parent.log_text(" ".join(sys.argv), "command_line.txt")
        for scenario, cfg in configs.items():
            t_scenario = time.perf_counter()
            s_out = out / slug(scenario)
            s_out.mkdir(parents=True, exist_ok=True)
            (s_out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            parent.log_artifact(s_out / "config.yaml", artifact_path=slug(scenario))
            console.rule(f"scenario {scenario}")
            env = make_env(cfg)
            surrogates: list[Any] = []
            try:
                start_ranks(cfg, env, executor)
                built: dict[str, Any] = {}
                costs: dict[str, TrainingCost] = {}
                for name in agents:
                    if _role(name) == "learned":
                        lcfg = _scenario_config(files[scenario], {**base, "agent": name})
                        sub = None if policies is None else policies / slug(scenario)
                        agent, cost, sur = _learned(
                            name, lcfg, env, parent, s_out, sub,
                            f"{slug(scenario)}/{slug(name)}", executor,
                        )  # fmt: skip
                        if sur is not None:
                            surrogates.append((name, sur))
                    else:
                        agent, cost = prepare_baseline(name, env, cfg, built, executor=executor)
                        for path in (
                            _static_ranking(agent, scenario, s_out),
                            _adaptive_schedules(agent, scenario, s_out),
                        ):
                            if path is not None:
                                parent.log_artifact(path, artifact_path=slug(scenario))
                    built[name], costs[name] = agent, cost
                results, figs, reruns = compare(
                    cfg, env, built, tracker, parent.run_id, s_out, scenario, executor
                )
                gone = {
                    name: departures(agent, results[name])
                    for name, agent in built.items()
                    if isinstance(agent, OracleAdaptiveAgent)
                }
                for sname, sur in surrogates:
                    sim_to_real_gap(cfg, sur, built[sname], results[sname], parent,
                                 prefix=f"{slug(scenario)}/{slug(sname)}/")  # fmt: skip
            finally:
                env.close()
                for _, sur in surrogates:
                    sur.close()
                if executor is not None:
                    executor.release(cfg.env_config)
            budget = float(cfg.env_config.time_budget_s)
            entries = []
            for name in agents:
                e = _entry(scenario, name, _role(name), results[name], budget)
                c = costs[name]
                e.cost_wall_s, e.cost_real_decisions, e.cost_parts = (
                    c.wall_s, c.real_decisions, dict(c.parts)
                )  # fmt: skip
                entries.append(e)
            _speedups(entries)
            notes, report, report_path = _headroom(scenario, entries, results, out, reruns, gone)
            board[scenario] = entries
            title = _title(cfg, scenario, seeds)
            table = Table(title=title)
            for col in COLUMNS:
                table.add_column(col, justify="left" if col == "agent" else "right")
            for e in entries:
                table.add_row(*_row(e))
            console.print(table)
            for line in notes:
                console.print(line.replace("`", "").replace("**", ""))
            csv_path, md_path = _write_tables(scenario, title, entries, out, notes)
            markdown.append(md_path.read_text())
            panels = {
                "time to target (s; a miss counts as the budget)": {
                    e.agent: e.time_to_target_s for e in entries
                },
                "final eval loss (nats)": {e.agent: e.final_eval_loss for e in entries},
                "bytes per step (B)": {e.agent: e.bytes_per_step for e in entries},
            }
            bars = comparison_plot(panels, None, out / f"leaderboard-{slug(scenario)}.png")
            for path in (csv_path, md_path, report_path, bars, *figs):
                parent.log_artifact(path, artifact_path=slug(scenario))
            figures += [bars, *figs]
            for i, e in enumerate(entries):
                key = f"leaderboard/{slug(scenario)}/{slug(e.agent)}"
                parent.log_metrics(
                    {
                        f"{key}/time_to_target_mean_s": e.time_to_target_mean_s,
                        f"{key}/reached": sum(e.reached),
                        f"{key}/speedup_vs_ddp_default": e.speedup.get(
                            "static:ddp-default", math.nan
                        ),
                        f"{key}/speedup_vs_autotune": e.speedup.get("autotune", math.nan),
                        **_agent_metrics(key, e, report),
                    },
                    step=i,
                )
            if "headroom" in report:
                h = report["headroom"]
                parent.log_metrics(
                    {
                        f"leaderboard/{slug(scenario)}/headroom": h["value"],
                        f"leaderboard/{slug(scenario)}/headroom_low": h["low"],
                        f"leaderboard/{slug(scenario)}/headroom_high": h["high"],
                    },
                    step=0,
                )
            console.print(
                f"scenario {scenario} took {time.perf_counter() - t_scenario:.0f} s "
                f"(tables: {csv_path}, {md_path})"
            )
        summary = out / "leaderboard.md"
        summary.write_text("\n".join(markdown))
        parent.log_artifact(summary)
    console.print(f"leaderboard: [bold]{summary}[/bold]; figures and episodes under {out}/")
    announce(tracker)
    return board
