"""Evaluation on real ranks: agents compared over the same seeds, baselines prepared, tables.

``commgym evaluate`` is :func:`evaluate`; ``commgym train`` ends with
:func:`compare_with_baselines` and :func:`sim_to_real_gap`, and the leaderboard builds its
scenarios from :func:`prepare_baseline` and :func:`compare`. Every episode is run by the one
rollout (:func:`~commgym.agents.rollout.rollout`) and comes back as its
:class:`~commgym.agents.rollout.Episode`; every evaluation episode is an MLflow child run
(explicit ``parent_run_id``) whose per-decision metrics come from
:class:`~commgym.experiments.tracking.TrackingWrapper`. What an agent cost before it was
evaluated is a :class:`TrainingCost`.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
from rich.table import Table

from commgym.agents.rollout import Episode, rollout
from commgym.experiments.config import RunConfig
from commgym.experiments.executors import LOCAL, Executor
from commgym.experiments.progress import console, phase
from commgym.experiments.reruns import Rerun, rerun_lines
from commgym.experiments.session import announce, make_env, parent_params, slug, start_ranks

__all__ = [
    "EpisodeCounter",
    "TrainingClock",
    "TrainingCost",
    "build_agent",
    "compare",
    "compare_with_baselines",
    "evaluate",
    "mean_pm",
    "prepare_baseline",
    "print_table",
    "return_label",
    "search_oracle",
    "sim_to_real_gap",
]


@dataclass
class TrainingCost:
    """What preparing an agent cost before it was evaluated (reported next to results).

    Attributes:
        real_decisions: real decisions spent: recorded for the surrogate, learned on real
            ranks, fine-tuned on real ranks, or tuned on (baselines).
        wall_s: wall time of all of it, seconds (collection, fitting, learning).
        parts: the same wall time by phase (``collect_s``, ``fit_s``, ``learn_s``,
            ``fine_tune_s``, ``tune_s``, ``search_s``), seconds.
    """

    real_decisions: int = 0
    wall_s: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)

    def add(self, part: str, seconds: float, real_decisions: int = 0) -> None:
        """Count one phase."""
        self.parts[part] = self.parts.get(part, 0.0) + seconds
        self.wall_s += seconds
        self.real_decisions += real_decisions


class TrainingClock:
    """A rollout's ``on_step`` that advances a progress bar by the episode's training seconds.

    Args:
        advance: the bar's advance function (:func:`~commgym.experiments.progress.phase`).
    """

    def __init__(self, advance: Callable[[float], None]) -> None:
        self.advance = advance
        #: training seconds of the episode shown so far
        self.done_s = 0.0

    def __call__(self, step: dict[str, Any]) -> None:  # noqa: D102 - a StepCallback
        t = float(step["info"].get("train_time_s", self.done_s))
        self.advance(max(t - self.done_s, 0.0))
        self.done_s = max(t, self.done_s)


class EpisodeCounter:
    """A learn or rollout callback that advances a progress bar by one per finished episode.

    Args:
        advance: the bar's advance function (:func:`~commgym.experiments.progress.phase`).
    """

    def __init__(self, advance: Callable[[float], None]) -> None:
        self.advance = advance

    def __call__(self, step: dict[str, Any]) -> None:  # noqa: D102 - a LearnCallback
        if step["terminated"] or step["truncated"]:
            self.advance(1)


def mean_pm(values: list[float], fmt: str) -> str:
    """``mean ± 95 % half-width``; just the mean for one seed (no interval exists)."""
    from commgym.experiments.plots import mean_ci

    mean, half, n = mean_ci(values)
    if not math.isfinite(mean):
        return "-"
    return f"{mean:{fmt}}" if n < 2 or not math.isfinite(half) else f"{mean:{fmt}} ± {half:{fmt}}"


def return_label(cfg: RunConfig) -> str:
    """What the episode return measures under the scenario's reward."""
    reward = cfg.env_config.reward
    return {
        "log_progress": "return: log-loss decrease in budget",
        "time_to_target": "return: -time to target / budget",
        "throughput": "return: samples/s/1000 summed",
    }.get(reward, f"return ({reward})")


def print_table(
    results: dict[str, list[Episode]], cfg: RunConfig, *, show_return: bool = True
) -> Table:
    """The comparison table (one row per agent: means over its seeds), printed and returned."""
    budget = cfg.env_config.time_budget_s
    target = cfg.env_config.target_loss
    goal = f", target held-out loss {target}" if target is not None else ", no target loss"
    seeds = max((len(v) for v in results.values()), default=0)
    stat = "mean ± 95% CI" if seeds > 1 else "one seed: no interval"
    table = Table(
        title=f"{cfg.env_config.workload}, {cfg.env_config.world_size} ranks, "
        f"{cfg.env_config.network_plan.label()}, {seeds} seed{'s' if seeds != 1 else ''}, "
        f"training budget {budget} s per episode{goal} ({stat})"
    )
    cols = ["agent", return_label(cfg), "final eval loss", "accuracy", "bytes/step"]
    cols += ["time to target s", "decisions"]
    if not show_return:
        cols.remove(return_label(cfg))
    for col in cols:
        table.add_column(col, justify="left" if col == "agent" else "right")
    for name, eps in results.items():
        acc = statistics.fmean(e.final_eval_acc for e in eps)
        ttt = [e.time_to_target_s for e in eps if e.time_to_target_s is not None]
        if target is None:
            reached = "no target"
        elif ttt:
            reached = f"{statistics.fmean(ttt):.2f} ({len(ttt)}/{len(eps)})"
        else:
            reached = f"not reached (0/{len(eps)})"
        ret = [mean_pm([e.episode_return for e in eps], ".3f")] if show_return else []
        table.add_row(
            name,
            *ret,
            mean_pm([e.final_eval_loss for e in eps], ".4f"),
            f"{acc:.3f}" if math.isfinite(acc) else "-",
            f"{statistics.fmean(e.bytes_per_step for e in eps):,.0f}",
            reached,
            f"{statistics.fmean(e.decisions for e in eps):.1f}",
        )
    console.print(table)
    return table


def _evaluation_phase(cfg: RunConfig, runs: int, what: str) -> Any:
    """Progress over ``runs`` episodes, counted in training seconds of the budget."""
    budget = float(cfg.env_config.time_budget_s)
    if budget > 0 and math.isfinite(budget):
        return phase(what, runs * budget, unit="s of training")
    return phase(what, runs, unit="episodes")


def _child_run(
    tracker: Any,
    parent_id: str | None,
    scenario: str | None,
    name: str,
    seed: int,
    tags: dict[str, str] | None = None,
) -> Any:
    """The MLflow child run of one evaluation episode."""
    extra = {} if scenario is None else {"scenario": scenario}
    return tracker.start_run(
        f"{scenario + '-' if scenario else ''}eval-{name}-seed{seed}",
        params={"agent": name, "seed": seed, **extra},
        tags={"commgym.role": "evaluation", **(tags or {})},
        parent_run_id=parent_id,
    )


def _log_episode(run: Any, wrapped: Any, res: Episode, csv: Path) -> None:
    """An evaluation episode's decisions CSV and outcome metrics, into its child run."""
    wrapped.write_csv(csv)
    run.log_artifact(csv)
    run.log_metrics(
        {
            "eval/return": res.episode_return,
            "eval/final_eval_loss": res.final_eval_loss,
            "eval/final_eval_acc": res.final_eval_acc,
            "eval/bytes_per_step": res.bytes_per_step,
            "eval/decisions": res.decisions,
            "eval/time_to_target_s": res.time_to_target_s,
        },
        step=0,
    )


def compare(
    cfg: RunConfig,
    env: gym.Env,
    agents: dict[str, Any],
    tracker: Any,
    parent_id: str | None,
    out: Path,
    scenario: str | None = None,
    executor: Executor = LOCAL,
) -> tuple[dict[str, list[Episode]], list[Path], list[Rerun]]:
    """Every agent on the same seeds on real ranks; returns the episodes, figures and re-runs.

    Each agent plays ``cfg.episodes`` episodes (seeds ``cfg.eval_seed + i``), **seed-major**:
    every agent on seed ``s`` before any on ``s + 1``, so drift of the machine over the
    evaluation lands on every agent alike and pairing by seed cancels it. Each episode is an
    MLflow child run of ``parent_id`` with its ``decisions-<agent>-seed<s>.csv``; then the
    timelines, ``comparison.png`` and ``loss-curves.png`` are drawn into ``out``.
    ``scenario`` (a leaderboard's scenario name) prefixes the child runs' names and is
    logged as their ``scenario`` parameter.

    The oracles are re-run, not trusted from their search (:mod:`commgym.experiments.reruns`):
    every entry near-tied in ``oracle-static``'s search (and per condition in the
    contextual oracle's) plays the seeds among the agents, and the oracle's episodes are the
    best re-run's; the report rows come back as the third value. ``oracle-adaptive``'s phase
    schedules are re-run by the oracle itself
    (:meth:`~commgym.agents.OracleAdaptiveAgent.for_seed`).

    The ``(player, seed)`` cells are played by ``executor``
    (:meth:`~commgym.experiments.executors.Executor.play`: here one after another, or in
    parallel on Ray's env actors, submitted seed-major) and logged here in the order they
    come back; each child run replays its episode's steps through the same
    :class:`~commgym.experiments.tracking.TrackingWrapper`, and one played on a Ray actor
    also gets the node and actor as tags (``commgym.ray_node``, ``commgym.ray_actor``).
    """
    from commgym.experiments.plots import (
        action_timeline_plot,
        comparison_plot,
        loss_curves_plot,
    )
    from commgym.experiments.reruns import RerunPlan
    from commgym.experiments.tracking import TrackingWrapper

    target = cfg.env_config.target_loss
    network = cfg.env_config.network_plan.label()
    seeds = [cfg.eval_seed + i for i in range(cfg.episodes)]
    plan = RerunPlan(agents, seeds, float(cfg.env_config.time_budget_s))
    players = {**agents, **plan.players(env)}
    cells = [(n, s) for s in seeds for n in players if (n, s) not in plan.skip]
    played: dict[tuple[str, int], Episode] = {}
    figures: list[Path] = []
    with _evaluation_phase(
        cfg, len(cells), f"evaluating {len(agents)} agents on real ranks"
    ) as adv:
        by_time = float(cfg.env_config.time_budget_s) > 0
        clock = TrainingClock(adv)
        for i, done in executor.play(
            env, cfg.env_config, cells, players, target, clock if by_time else None
        ):
            name, seed = cells[i]
            res = done.episode
            tags = {"commgym.ray_node": done.node_id, "commgym.ray_actor": done.actor}
            with _child_run(
                tracker, parent_id, scenario, name, seed, tags if done.node_id else None
            ) as run:
                wrapped = TrackingWrapper(env, run)
                for action, reward, terminated, truncated, info in done.transitions:
                    wrapped.record(action, reward, terminated, truncated, info)
                if not done.transitions:  # the actor died: the failure is the only step
                    wrapped.record(None, 0.0, True, False, dict(res.final_info or {}))
                _log_episode(run, wrapped, res, out / f"decisions-{slug(name)}-seed{seed}.csv")
            played[(name, seed)] = res
            # an episode that ended early (target, failure) finishes its share
            adv(float(cfg.env_config.time_budget_s) - clock.done_s if by_time else 1.0)
            clock.done_s = 0.0
    oracles, reruns = plan.fold(played)
    for name, agent in agents.items():
        counts = getattr(agent, "shield_counts", None)  # a shielded policy's vetoes
        if counts and counts["decisions"]:
            console.print(
                f"{name}: the shield (shield_regret_s {agent.shield_regret_s:g}) replaced "
                f"{counts['overrides']} of the {counts['decisions']} decisions it priced"
            )
    results = {
        name: oracles[name] if name in oracles else [played[(name, s)] for s in seeds]
        for name in agents
    }  # the caller's order
    for name, eps in results.items():
        if any(e.steps for e in eps):
            figures.append(
                action_timeline_plot(
                    {f"seed {e.seed}": e.rows for e in eps},
                    out / f"timeline-{slug(name)}.png",
                    title=f"{name}, {network}",
                    target_loss=target,
                )
            )
    panels: dict[str, dict[str, list[float]]] = {
        return_label(cfg): {n: [e.episode_return for e in r] for n, r in results.items()}
    }
    if target is not None:  # seeds that never reached the target are left out (n= says so)
        panels["time to target (s)"] = {
            n: [math.nan if e.time_to_target_s is None else e.time_to_target_s for e in r]
            for n, r in results.items()
        }
    panels["bytes per step (B)"] = {n: [e.bytes_per_step for e in r] for n, r in results.items()}
    figures.append(comparison_plot(panels, None, out / "comparison.png"))
    figures.append(
        loss_curves_plot(
            {n: [e.rows for e in r] for n, r in results.items()},
            out / "loss-curves.png",
            target_loss=target,
            title=f"held-out loss vs training time, {network}",
        )
    )
    return results, figures, reruns


def build_agent(name: str, env: gym.Env, cfg: RunConfig, hyperparams: dict[str, Any]) -> Any:
    """``make_agent`` with the run's seed; an oracle also gets the evaluation seeds it searches.

    Args:
        name: agent name (``AGENTS`` key or ``static:<preset>``).
        env: the env it acts (and learns) in.
        cfg: the run configuration (``seed``, ``eval_seed``, ``episodes``).
        hyperparams: its own hyperparameters (``agent_kwargs`` or ``baseline_kwargs`` entry).
    """
    from commgym.agents import AGENTS, make_agent

    kwargs: dict[str, Any] = {"seed": cfg.seed, **hyperparams}
    cls = AGENTS.get(name.split(":", 1)[0])
    if cls is not None and cls.oracle:
        kwargs.setdefault("seeds", [cfg.eval_seed + i for i in range(cfg.episodes)])
    return make_agent(name, env, **kwargs)


def search_oracle(
    name: str, agent: Any, cost: TrainingCost, executor: Executor = LOCAL, *, real: bool = True
) -> None:
    """Run an oracle's exhaustive search under a progress bar; count it in ``cost``.

    Args:
        name: the oracle's name (``oracle-static``).
        agent: the oracle (``agent.oracle``, or ``best-static``), built by :func:`build_agent`.
        cost: receives ``search_s`` and the search's decisions (real ones if ``real``).
        executor: where its episodes run
            (:meth:`~commgym.experiments.executors.Executor.search`: ``oracle-static``'s
            (entry, seed) episodes in parallel on Ray's env actors; an oracle that forks
            episodes always on the agent's own env).
        real: the search ran on real ranks (not the surrogate).
    """
    from commgym.agents import OracleStaticAgent

    t0 = time.perf_counter()
    if isinstance(agent, OracleStaticAgent):
        episodes = len(agent.entries) * len(agent.seeds)
        seeds = "the evaluation seeds" if agent.oracle else f"training seeds {agent.seeds}"
        with phase(f"{name}: every menu entry on {seeds}", episodes, unit="episodes") as adv:
            executor.search(agent, adv)
        what = f"{len(agent.ranking)} entries"
    else:  # oracle-adaptive: forks at every phase boundary (how many depends on pruning)
        with phase(
            f"{name}: every menu entry at every phase boundary on the evaluation seeds",
            agent.planned_phases() or None,
            unit="phases",
        ) as adv:
            executor.search(agent, adv)
        what = "every phase boundary"
    seconds = time.perf_counter() - t0
    cost.add("search_s", seconds, int(agent.search_decisions) if real else 0)
    kind = "search cost, reported apart" if agent.oracle else "its tuning cost"
    console.print(
        f"{name} searched {what} in {seconds:.1f} s ({agent.search_decisions} decisions; {kind})"
    )


def prepare_baseline(
    name: str,
    env: gym.Env,
    cfg: RunConfig,
    prepared: dict[str, Any] | None = None,
    executor: Executor = LOCAL,
) -> tuple[Any, TrainingCost]:
    """Build a baseline agent; tuners (bayesopt, grid, bandit, ...) tune first on the env.

    A tuner gets ``cfg.resolved_tuning_decisions`` real decisions (by default as many as
    the learned agent saw on real ranks); their wall time is printed as its tuning cost.
    Agents that declare ``online = True`` (``autotune``: it tunes inside every episode, so
    its tuning already counts in the measured time) and static presets get no tuning
    phase; the oracles run their searches (``search_s``): ``oracle-static`` every entry on
    the evaluation seeds, ``oracle-adaptive`` every entry at every phase boundary (on top
    of ``oracle-static``'s search, shared when ``prepared`` holds a learned one). The
    executor decides where: on Ray the tuning runs on an env actor and ``oracle-static``'s
    (entry, seed) episodes in parallel on all of them (``oracle-adaptive`` forks episodes
    on this process's ranks).

    Args:
        name: the agent's name (registry name or ``static:<preset>``).
        env: the real env (ranks started).
        cfg: the run configuration.
        prepared: agents built before, by name (``oracle-adaptive`` reuses
            ``oracle-static``'s search from here).
        executor: where episodes run (:class:`~commgym.experiments.executors.Executor`).

    Returns:
        ``(agent, cost)``.
    """
    from commgym.agents import OracleStaticAgent

    cost = TrainingCost()
    base = name.split(":", 1)[0]
    # a variant (autotune:progress) takes its family's scenario settings, then its own
    hyper: dict[str, Any] = {
        **(cfg.baseline_kwargs.get(base, {}) if base != name else {}),
        **cfg.baseline_kwargs.get(name, {}),
    }
    if name == "oracle-adaptive":  # shares oracle-static's search over the same seeds
        seeds = [cfg.eval_seed + i for i in range(cfg.episodes)]
        shared = [a for a in (prepared or {}).values() if isinstance(a, OracleStaticAgent)]
        if shared and shared[0].seeds == seeds:
            hyper["static"] = shared[0]
    agent = build_agent(name, env, cfg, hyper)
    if agent.oracle or isinstance(agent, OracleStaticAgent):  # best-static searches as well
        search_oracle(name, agent, cost, executor)
    elif not name.startswith("static:") and name != "random" and not agent.online:
        n = cfg.resolved_tuning_decisions
        kwargs = {"seed": cfg.seed, **hyper}
        with phase(f"tuning baseline {name} {executor.where}", n, unit="decisions") as adv:
            agent, secs = executor.tune(name, agent, kwargs, n, adv)
        cost.add("tune_s", secs, n)
        console.print(
            f"baseline {name} tuned on {n} real decisions in {cost.wall_s:.1f} s "
            "(tuning cost; set with --tuning-decisions)"
        )
    return agent, cost


def compare_with_baselines(
    cfg: RunConfig,
    env: gym.Env,
    name: str,
    agent: Any,
    tracker: Any,
    parent: Any,
    out: Path,
    executor: Executor = LOCAL,
) -> dict[str, list[Episode]]:
    """Evaluate ``agent`` and ``cfg.baselines`` on the same seeds; log, plot and print."""
    agents = {name: agent}
    for b in cfg.baselines:
        agents[b], _ = prepare_baseline(b, env, cfg, agents, executor=executor)
    results, figures, reruns = compare(
        cfg, env, agents, tracker, parent.run_id, out, executor=executor
    )
    for fig in figures:
        parent.log_artifact(fig)
    print_table(results, cfg)
    for line in rerun_lines(reruns):
        console.print(line.replace("`", ""))
    _log_summary(parent, results)
    return results


def _log_summary(run: Any, results: dict[str, list[Episode]]) -> None:
    from commgym.experiments.plots import mean_ci

    for i, (name, eps) in enumerate(results.items()):
        mean, half, _ = mean_ci([e.episode_return for e in eps])
        run.log_metrics(
            {
                f"compare/{slug(name)}/return_mean": mean,
                f"compare/{slug(name)}/return_ci95": half,
                f"compare/{slug(name)}/final_eval_loss": statistics.fmean(
                    e.final_eval_loss for e in eps
                ),
            },
            step=i,
        )


def sim_to_real_gap(
    cfg: RunConfig,
    surrogate: gym.Env,
    agent: Any,
    real: list[Episode],
    run: Any,
    prefix: str = "",
) -> float:
    """Return on the surrogate (or simulator) minus return on real ranks, same policy and seeds.

    Logs (under the surrogate's names for both) ``<prefix>sim2real/surrogate_return``,
    ``<prefix>sim2real/real_return`` and ``<prefix>sim2real/gap``. In the simulator it
    also prints and logs (``sim_fidelity.txt``) the fidelity gates ``commgym bench sim``
    kept beside the calibration, or that none were measured.
    """
    target = cfg.env_config.target_loss
    sim = [rollout(surrogate, agent, r.seed, target_loss=target).episode_return for r in real]
    sim_mean = statistics.fmean(sim)
    real_mean = statistics.fmean(r.episode_return for r in real)
    gap = sim_mean - real_mean
    run.log_metrics(
        {
            f"{prefix}sim2real/surrogate_return": sim_mean,
            f"{prefix}sim2real/real_return": real_mean,
            f"{prefix}sim2real/gap": gap,
        },
        step=0,
    )
    where = "simulator" if cfg.env_kind == "sim" else "surrogate"
    console.print(
        f"sim-to-real gap: {where} return {sim_mean:.3f} - real return {real_mean:.3f} "
        f"= {gap:+.3f} (same policy, seeds {[r.seed for r in real]})"
    )
    if cfg.env_kind == "sim":
        from commgym.experiments.calibrate_sim import calibration_path, fidelity_lines

        # the gap says how this policy transferred; the gates how the simulator ranks
        # every entry and reproduces the headroom (bench sim, kept beside the calibration)
        lines = fidelity_lines(calibration_path(cfg.calibration, cfg.env_config))
        for line in lines:
            console.print(line)
        run.log_text("\n".join(lines), f"{prefix.replace('/', '_')}sim_fidelity.txt")
    return gap


def evaluate(cfg: RunConfig, policy: str | Path) -> dict[str, list[Episode]]:
    """``commgym evaluate``: a saved policy against ``cfg.baselines`` over ``cfg.episodes`` seeds.

    Args:
        cfg: the resolved run configuration.
        policy: a policy file written by ``commgym train``, or a static preset such as
            ``static:int8/4MB/H1`` (the names ``--baselines`` takes).

    Raises:
        FileNotFoundError: the policy file does not exist.
        ValueError: the file is not a commgym policy, or it was trained for a different
            action menu / observation layout, or the preset is not on the menu (checked
            before anything is created).
    """
    from commgym.agents import load_agent, make_agent
    from commgym.agents.base import read_policy_json
    from commgym.agents.scheduler import is_policy_file
    from commgym.experiments.executors import open_executor
    from commgym.experiments.tracking import Tracker

    is_file = is_policy_file(policy)
    if is_file:
        read_policy_json(policy)  # missing or garbage files fail before anything is created
    env = make_env(cfg)  # starts no ranks yet
    try:
        # layout (or the preset's menu entry) checked before anything is created
        if is_file:
            agent, label = load_agent(policy, env=env), f"policy ({Path(policy).name})"
        else:  # a static preset, as `--baselines` takes it
            agent, label = make_agent(str(policy), env, seed=cfg.seed), f"policy ({policy})"
        with open_executor(cfg) as executor:
            out = Path(cfg.output_dir)
            out.mkdir(parents=True, exist_ok=True)
            tracker = Tracker(cfg.tracking_uri, experiment=cfg.experiment)
            announce(tracker)
            with tracker.start_run("evaluate", tags={"commgym.command": "evaluate"}) as parent:
                parent.log_params(parent_params(cfg, {"policy": str(policy)}))
                if is_file:
                    parent.log_artifact(Path(policy))
                start_ranks(cfg, env, executor)
                results = compare_with_baselines(
                    cfg, env, label, agent, tracker, parent, out, executor
                )
    finally:
        env.close()
    console.print(f"figures and CSVs: [bold]{out}/[/bold] (comparison.png, loss-curves.png, ...)")
    announce(tracker)
    return results
