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

import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml
from rich.table import Table

from commgym.agents.oracle_adaptive import OracleAdaptiveAgent
from commgym.collectives.checks import check_int
from commgym.experiments.config import RunConfig, load_run_config
from commgym.experiments.evaluation import (
    TrainingCost,
    compare,
    prepare_baseline,
    sim_to_real_gap,
)
from commgym.experiments.executors import LOCAL, Executor, open_executor
from commgym.experiments.leaderboard_report import (
    COLUMNS,
    REFERENCES,
    LeaderboardEntry,
    add_speedups,
    agent_metrics,
    board_title,
    entry_of,
    headroom_report,
    read_leaderboard_csv,
    read_static_ranking,
    table_row,
    write_adaptive_schedules,
    write_static_ranking,
    write_tables,
)
from commgym.experiments.progress import console
from commgym.experiments.reruns import departures
from commgym.experiments.session import announce, check_network, make_env, slug, start_ranks
from commgym.experiments.train import learn_agent

__all__ = [
    "DEFAULT_AGENTS",
    "REFERENCES",
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


def scenario_name(scenario: str | Path) -> str:
    """A scenario's label: the shipped name, or a YAML file's stem (``runs/my.yaml`` -> ``my``)."""
    p = Path(scenario)
    return p.stem if p.suffix in (".yaml", ".yml") else str(scenario)


def _recipe(agent: str) -> tuple[str, str | None]:
    """``(agent name, recipe)`` of a leaderboard agent.

    ``ppo@flaky-link-clock`` -> ``("ppo", "flaky-link-clock")``; ``(agent, None)`` without ``@``.
    """
    name, at, recipe = agent.partition("@")
    return name, (recipe if at else None)


def _role(name: str) -> str:
    from commgym.agents import AGENTS

    cls = AGENTS.get(_recipe(name)[0].split(":", 1)[0])
    if cls is not None and cls.oracle:
        return "oracle"
    if cls is not None and cls.learned:
        return "learned"
    return "baseline"


def _scenario_config(scenario: str, overrides: dict[str, Any]) -> RunConfig:
    cfg = load_run_config(scenario, overrides)
    if cfg.env_config.target_loss is None:
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
    executor: Executor = LOCAL,
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
            learned ones. ``NAME@RECIPE`` trains learned agent ``NAME`` by another run config
            (a shipped name or YAML file, e.g. ``ppo@flaky-link-clock``) instead of the
            scenario's own: its ``env`` must be the scenario's, and the row is labelled
            ``NAME@<recipe's name>``, so that learners with different recipes share one
            invocation, seeds and oracles.
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
            Ray cluster; :mod:`commgym.experiments.executors`).
        ray_address: the Ray cluster (``"auto"``, ``HOST:PORT``; ``None``:
            ``$RAY_ADDRESS`` or a local instance).
        ray_envs: env actors per scenario (``None``: as many as the cluster holds).

    Returns:
        Scenario -> entries in ``agents`` order.

    Raises:
        ValueError: an unknown scenario, agent or override; a scenario without a target;
            a recipe for an agent that is not learned, or whose ``env`` differs from a
            scenario's; two agents with the same label.
        FileNotFoundError: a scenario or recipe file that does not exist.
    """
    from commgym.agents import make_agent  # noqa: F401 - fail on a broken install early

    check_int("seeds", seeds, 1)
    if not scenarios or not agents:
        raise ValueError("the leaderboard needs at least one scenario and one agent")
    agents, recipes = _labels(agents)
    learned = [_recipe(a)[0] for a in agents if _role(a) == "learned"]
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
                load_run_config(s, {**ref, "baselines": [_recipe(a)[0]]})
            except ValueError as err:
                raise ValueError(f"scenario {name!r}: {err}") from None
            if a in recipes:
                _check_recipe(a, recipes[a], base, name, configs[name])
        env = configs[name].env_config
        check_network(env.network_plan, env.network_strict, f"scenario {name!r}")
    if len(configs) != len(scenarios):
        raise ValueError(f"scenario names must be distinct, got {list(scenarios)}")
    files = dict(zip(configs, scenarios, strict=True))
    where = load_run_config(
        None, {"executor": executor, "ray_address": ray_address, "ray_envs": ray_envs}
    )
    with open_executor(where) as opened:
        return _run(
            configs, files, agents, recipes, seeds, base, Path(output_dir), tracking_uri,
            experiment, policy_dir, scenarios, opened,
        )  # fmt: skip


def _labels(agents: list[str] | tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """The leaderboard's row labels of ``agents`` and, per ``NAME@RECIPE`` label, its recipe.

    ``ppo@runs/clock.yaml`` is labelled ``ppo@clock`` (the recipe's name, as a scenario's).

    Raises:
        ValueError: an empty recipe, a recipe for an agent that is not learned, or two
            agents with the same label.
    """
    labels: list[str] = []
    recipes: dict[str, str] = {}
    for agent in agents:
        name, recipe = _recipe(agent)
        if recipe is None:
            labels.append(agent)
            continue
        if not recipe:
            raise ValueError(
                f"agent {agent!r}: name a run config after '@' (e.g. ppo@flaky-link-clock)"
            )
        if _role(name) != "learned":
            from commgym.agents import AGENTS

            learners = ", ".join(k for k, cls in AGENTS.items() if cls.learned)
            raise ValueError(
                f"agent {agent!r}: a recipe after '@' says how a learned agent is trained, and "
                f"{name!r} is not one (learned agents: {learners}); drop '@{recipe}'"
            )
        label = f"{name}@{scenario_name(recipe)}"
        labels.append(label)
        recipes[label] = recipe
    twice = sorted({a for a in labels if labels.count(a) > 1})
    if twice:
        raise ValueError(f"agents must be distinct, got {twice} more than once in {list(agents)}")
    return labels, recipes


def _check_recipe(
    label: str, recipe: str, base: dict[str, Any], scenario: str, cfg: RunConfig
) -> RunConfig:
    """``recipe``'s run config for ``label``'s agent, checked against ``scenario``'s.

    Raises:
        ValueError: the recipe's ``env`` differs from the scenario's (the fields named), or
            the recipe is not a valid run config for that agent.
        FileNotFoundError: no such recipe file.
    """
    try:
        rcfg = _scenario_config(recipe, {**base, "agent": _recipe(label)[0]})
    except ValueError as err:
        raise ValueError(f"agent {label!r}: recipe {recipe!r}: {err}") from None
    mine, theirs = rcfg.env_config.to_dict(), cfg.env_config.to_dict()
    differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    if differ:
        shown = "; ".join(
            f"env.{k}: {mine.get(k)!r} in the recipe, {theirs.get(k)!r} in the scenario"
            for k in differ
        )
        raise ValueError(
            f"agent {label!r}: recipe {recipe!r} trains for another environment than scenario "
            f"{scenario!r} ({shown}); a recipe may change how the agent learns, not the scenario"
        )
    return rcfg


def _run(
    configs: dict[str, RunConfig],
    files: dict[str, str],
    agents: list[str],
    recipes: dict[str, str],
    seeds: int,
    base: dict[str, Any],
    out: Path,
    tracking_uri: str | None,
    experiment: str,
    policy_dir: str | Path | None,
    scenarios: list[str] | tuple[str, ...],
    executor: Executor,
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
                    if name in recipes:
                        lcfg = _check_recipe(name, recipes[name], base, scenario, cfg)
                    elif _role(name) == "learned":
                        lcfg = _scenario_config(files[scenario], {**base, "agent": name})
                    if _role(name) == "learned":
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
                            write_static_ranking(agent, scenario, s_out),
                            write_adaptive_schedules(agent, scenario, s_out),
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
                executor.release(cfg.env_config)
            budget = float(cfg.env_config.time_budget_s)
            entries = []
            for name in agents:
                e = entry_of(scenario, name, _role(name), results[name], budget)
                c = costs[name]
                e.cost_wall_s, e.cost_real_decisions, e.cost_parts = (
                    c.wall_s, c.real_decisions, dict(c.parts)
                )  # fmt: skip
                entries.append(e)
            add_speedups(entries)
            notes, report, report_path = headroom_report(
                scenario, entries, results, out, reruns, gone
            )
            board[scenario] = entries
            title = board_title(cfg, scenario, seeds)
            table = Table(title=title)
            for col in COLUMNS:
                table.add_column(col, justify="left" if col == "agent" else "right")
            for e in entries:
                table.add_row(*table_row(e))
            console.print(table)
            for line in notes:
                console.print(line.replace("`", "").replace("**", ""))
            csv_path, md_path = write_tables(scenario, title, entries, out, notes)
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
                        **agent_metrics(key, e, report),
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
