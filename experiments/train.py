"""The main job: train a communication policy on real runs, compare it, log everything.

``commgym train`` = :func:`train` and ``commgym evaluate`` = :func:`evaluate`. Both open one
MLflow parent run; every evaluation episode is a nested child run (explicit
``parent_run_id``) whose per-decision metrics come from :class:`TrackingWrapper`.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import yaml
from rich.table import Table

from commgym.env.measure import effective_bandwidth_gbps
from commgym.env.net.plan import link_rate_gbps
from commgym.experiments.config import RunConfig
from commgym.experiments.progress import console, phase

__all__ = ["EpisodeResult", "evaluate", "run_episode", "train"]


@dataclass
class EpisodeResult:
    """Measured outcome of one evaluation episode."""

    agent: str
    seed: int
    episode_return: float
    decisions: int
    train_time_s: float
    final_eval_loss: float
    final_eval_acc: float
    bytes_per_step: float
    time_to_target_s: float | None
    reason: str | None
    rows: list[dict[str, Any]] = field(default_factory=list, repr=False)


def _make_env(cfg: RunConfig) -> gym.Env:
    import commgym.env  # noqa: F401 - registers the env

    return gym.make("commgym/AllReduce-v0", config=cfg.env_config)


def run_episode(
    env: gym.Env,
    agent: Any,
    seed: int,
    name: str,
    target_loss: float | None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> EpisodeResult:
    """Run one episode with ``agent.predict(obs, deterministic=True)``.

    Args:
        env: the (possibly wrapped) environment.
        agent: anything with the ``Agent.predict`` signature.
        seed: episode seed (identical for every compared agent).
        name: label of the agent.
        target_loss: held-out loss whose first crossing defines time-to-target.
        on_step: called with each step's ``info`` (progress display).

    Returns:
        The :class:`EpisodeResult` (failures end the episode with ``reason="failure"``).
    """
    obs, info = env.reset(seed=seed)
    state = None
    total, decisions, bytes_sum = 0.0, 0, 0.0
    loss, acc = float(info.get("eval_loss", math.nan)), float(info.get("eval_acc", math.nan))
    t_target: float | None = None
    reason = None
    rows: list[dict[str, Any]] = []
    train_time = 0.0
    done = False
    episode_start = np.array([True])
    while not done:
        action, state = agent.predict(
            obs, state=state, episode_start=episode_start, deterministic=True
        )
        episode_start = np.array([False])
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        if on_step is not None:
            on_step(info)
        total += float(reward)
        reason = info.get("reason")
        m = info.get("measured")
        if m is None:  # failure: nothing measured
            break
        decisions += 1
        train_time = float(info["train_time_s"])
        loss, acc = float(m["eval_loss"]), float(m["eval_acc"])
        bytes_sum += float(m["bytes_per_step"])
        if t_target is None and target_loss is not None and loss <= target_loss:
            t_target = train_time
        rows.append(
            {
                "decision": decisions,
                "train_time_s": train_time,
                "config": info["config"],
                "eval_loss": loss,
                "bytes_per_step": float(m["bytes_per_step"]),
                "bytes_total": float(m["bytes_total"]),
                "comm_s": float(m["comm_s"]),
                "comm_wait_s": float(m["comm_wait_s"]),
                "bandwidth_gbps": effective_bandwidth_gbps(m["bytes_total"], m["comm_s"]),
                "link_rate_gbps": link_rate_gbps(info.get("network"), unshaped=math.nan),
                "reward": float(reward),
            }
        )
    return EpisodeResult(
        agent=name,
        seed=seed,
        episode_return=total,
        decisions=decisions,
        train_time_s=train_time,
        final_eval_loss=loss,
        final_eval_acc=acc,
        bytes_per_step=bytes_sum / decisions if decisions else 0.0,
        time_to_target_s=t_target,
        reason=reason,
        rows=rows,
    )


def _mean_pm(values: list[float], fmt: str) -> str:
    """``mean ± 95 % half-width``; just the mean for one seed (no interval exists)."""
    from commgym.experiments.plots import mean_ci

    mean, half, n = mean_ci(values)
    if not math.isfinite(mean):
        return "-"
    return f"{mean:{fmt}}" if n < 2 else f"{mean:{fmt}} ± {half:{fmt}}"


def _print_table(
    results: dict[str, list[EpisodeResult]], cfg: RunConfig, *, show_return: bool = True
) -> Table:
    budget = cfg.env.get("time_budget_s", "default")
    target = cfg.env.get("target_loss")
    goal = f", target held-out loss {target}" if target is not None else ", no target loss"
    seeds = max((len(v) for v in results.values()), default=0)
    stat = "mean ± 95% CI" if seeds > 1 else "one seed: no interval"
    table = Table(
        title=f"{cfg.env.get('workload', 'mlp-digits')}, {cfg.env.get('world_size', 2)} ranks, "
        f"{cfg.env_config.network_plan.label()}, {seeds} seed{'s' if seeds != 1 else ''}, "
        f"training budget {budget} s per episode{goal} ({stat})"
    )
    cols = ["agent", _return_label(cfg), "final eval loss", "accuracy", "bytes/step"]
    cols += ["time to target s", "decisions"]
    if not show_return:
        cols.remove(_return_label(cfg))
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
        ret = [_mean_pm([e.episode_return for e in eps], ".3f")] if show_return else []
        table.add_row(
            name,
            *ret,
            _mean_pm([e.final_eval_loss for e in eps], ".4f"),
            f"{acc:.3f}" if math.isfinite(acc) else "-",
            f"{statistics.fmean(e.bytes_per_step for e in eps):,.0f}",
            reached,
            f"{statistics.fmean(e.decisions for e in eps):.1f}",
        )
    console.print(table)
    return table


def _evaluation_phase(cfg: RunConfig, runs: int, what: str) -> Any:
    """Progress over ``runs`` episodes, counted in training seconds of the budget."""
    budget = float(cfg.env.get("time_budget_s", 0) or 0)
    if budget > 0 and math.isfinite(budget):
        return phase(what, runs * budget, unit="s of training")
    return phase(what, runs, unit="episodes")


def _compare(
    cfg: RunConfig,
    env: gym.Env,
    agents: dict[str, Any],
    tracker: Any,
    parent_id: str | None,
    out: Path,
    scenario: str | None = None,
) -> tuple[dict[str, list[EpisodeResult]], list[Path]]:
    """Every agent on the same seeds on real ranks; returns results and the figures.

    ``scenario`` (a leaderboard's scenario name) prefixes the child runs' names and is
    logged as their ``scenario`` parameter.
    """
    from commgym.experiments.plots import (
        action_timeline_plot,
        comparison_plot,
        loss_curves_plot,
    )
    from commgym.experiments.tracking import TrackingWrapper

    target = cfg.env.get("target_loss")
    results: dict[str, list[EpisodeResult]] = {}
    figures: list[Path] = []
    runs = len(agents) * cfg.episodes
    with _evaluation_phase(cfg, runs, f"evaluating {len(agents)} agents on real ranks") as adv:
        by_time = float(cfg.env.get("time_budget_s", 0) or 0) > 0
        for name, agent in agents.items():
            results[name] = []
            for i in range(cfg.episodes):
                seed = cfg.eval_seed + i
                done_s = [0.0]

                def tick(info: dict[str, Any], done_s: list[float] = done_s) -> None:
                    if by_time:
                        t = float(info.get("train_time_s", done_s[0]))
                        adv(max(t - done_s[0], 0.0))
                        done_s[0] = max(t, done_s[0])

                extra = {} if scenario is None else {"scenario": scenario}
                with tracker.start_run(
                    f"{scenario + '-' if scenario else ''}eval-{name}-seed{seed}",
                    params={"agent": name, "seed": seed, **extra},
                    tags={"commgym.role": "evaluation"},
                    parent_run_id=parent_id,
                ) as run:
                    wrapped = TrackingWrapper(env, run)
                    res = run_episode(wrapped, agent, seed, name, target, on_step=tick)
                    csv = out / f"decisions-{_slug(name)}-seed{seed}.csv"
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
                    results[name].append(res)
                # an episode that ended early (target, failure) finishes its share
                adv(float(cfg.env["time_budget_s"]) - done_s[0] if by_time else 1.0)
    for name, eps in results.items():
        if any(e.rows for e in eps):
            figures.append(
                action_timeline_plot(
                    {f"seed {e.seed}": e.rows for e in eps},
                    out / f"timeline-{_slug(name)}.png",
                    title=f"{name}, {cfg.env_config.network_plan.label()}",
                    target_loss=target,
                )
            )
    panels: dict[str, dict[str, list[float]]] = {
        _return_label(cfg): {n: [e.episode_return for e in r] for n, r in results.items()}
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
            title=f"held-out loss vs training time, {cfg.env_config.network_plan.label()}",
        )
    )
    return results, figures


def _return_label(cfg: RunConfig) -> str:
    """What the episode return measures under the scenario's reward."""
    reward = cfg.env.get("reward", "log_progress")
    return {
        "log_progress": "return: log-loss decrease in budget",
        "time_to_target": "return: -time to target / budget",
        "throughput": "return: samples/s/1000 summed",
    }.get(reward, f"return ({reward})")


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _parent_params(cfg: RunConfig, extra: dict[str, Any]) -> dict[str, Any]:
    from commgym.experiments.tracking import reproducibility_params

    return {**cfg.to_dict(), **extra, **reproducibility_params()}


def _announce(tracker: Any) -> None:
    from commgym.experiments.tracking import ui_command

    if not tracker.enabled:
        console.print(f"MLflow tracking is off: {tracker.tracking_uri} could not be opened")
        return
    console.print(f"MLflow tracking URI: [bold]{tracker.tracking_uri}[/bold]")
    console.print(
        f"open the UI with:    [bold]{ui_command(tracker.tracking_uri)}[/bold]  (or: commgym ui)"
    )


def _start_ranks(cfg: RunConfig, env: gym.Env) -> None:
    """Launch the ranks (first reset) under a spinner; say what network they run on."""
    world, network = cfg.env_config.world_size, cfg.env_config.network
    where = "on an emulated network" if network is not None else "on loopback"
    with phase(f"starting {world} ranks with torchrun {where}"):
        env.reset(seed=cfg.seed)
    net = getattr(env.unwrapped, "network", None)
    if net is not None:
        d = net.describe()
        shaped = d["effective_spec"]
        note = "" if shaped == d["spec"] else f" (applied: {shaped}; the rest needs sch_netem)"
        console.print(
            f"network: emulated [bold]{d['spec']}[/bold]{note}, {d['world_size']} Linux network "
            f"namespaces ({d['name']}*) on one bridge, every link shaped with tc {d['backend']}"
        )
    elif network is None:
        console.print("network: loopback, unshaped (--network emulates one; needs root)")


def train(cfg: RunConfig) -> dict[str, list[EpisodeResult]]:
    """Train ``cfg.agent``, save the policy, compare it with the baselines on real ranks.

    With ``cfg.env_kind == "surrogate"`` the agent learns on ``commgym/Surrogate-v0``
    (fitted first from ``cfg.surrogate_decisions`` real decisions when ``cfg.surrogate``
    is unset) and the sim-to-real gap is logged; evaluation always runs on real ranks.

    Returns:
        Evaluation results by agent name (the trained agent first).

    Raises:
        FileNotFoundError: ``cfg.surrogate`` names a file that does not exist.
        ValueError: ``cfg.surrogate`` is not a surrogate model file of this version.
    """
    from commgym.experiments.tracking import Tracker

    if cfg.env_kind == "surrogate" and cfg.surrogate:
        if not Path(cfg.surrogate).is_file():
            raise FileNotFoundError(
                f"surrogate model {cfg.surrogate!r} not found: fit one with `commgym collect "
                "--fit PATH`, or leave surrogate unset to collect real decisions and fit first"
            )
        from commgym.env.surrogate import SurrogateModel

        SurrogateModel.load(cfg.surrogate)  # a wrong file fails here, before ranks start
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tracker = Tracker(cfg.tracking_uri, experiment=cfg.experiment)
    _announce(tracker)
    env = _make_env(cfg)
    surrogate = None
    try:
        with tracker.start_run(f"train-{cfg.agent}", tags={"commgym.command": "train"}) as parent:
            (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            parent.log_artifact(out / "config.yaml")
            parent.log_text(" ".join(sys.argv), "command_line.txt")
            _start_ranks(cfg, env)
            agent, _, surrogate = learn_agent(cfg, env, parent, out)
            results = _compare_with_baselines(
                cfg, env, f"{cfg.agent} (learned)", agent, tracker, parent, out
            )
            if surrogate is not None:
                _sim_to_real(cfg, surrogate, agent, results[f"{cfg.agent} (learned)"], parent)
    finally:
        env.close()
        if surrogate is not None:
            surrogate.close()
    console.print(f"figures and CSVs: [bold]{out}/[/bold] (comparison.png, loss-curves.png, ...)")
    _announce(tracker)
    return results


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


def learn_agent(
    cfg: RunConfig, env: gym.Env, parent: Any, out: Path, prefix: str = ""
) -> tuple[Any, TrainingCost, gym.Env | None]:
    """Train ``cfg.agent`` as the scenario says, save its policy; the recipe of ``train``.

    On ``env_kind="surrogate"``: record ``cfg.surrogate_decisions`` real decisions (unless
    ``cfg.surrogate`` names a fitted model), fit the surrogate, learn ``cfg.timesteps``
    decisions on it, then fine-tune on real ranks for ``cfg.fine_tune_episodes`` episodes.
    On ``env_kind="real"``: learn ``cfg.timesteps`` real decisions.

    Args:
        cfg: the resolved run configuration.
        env: the real env (ranks started).
        parent: the MLflow run that receives the learning curve, CSV and policy.
        out: output folder (``policy.zip``, ``learning-decisions.csv``, surrogate files).
        prefix: prepended to the parameter and metric names logged to ``parent`` (a
            leaderboard trains one agent per scenario into one parent run).

    Returns:
        ``(agent, cost, surrogate_env)``; ``surrogate_env`` is ``None`` on real ranks (the
        caller closes it).
    """
    from commgym.agents import make_agent
    from commgym.experiments.tracking import TrackingWrapper

    cost = TrainingCost()
    surrogate = None
    if cfg.env_kind == "surrogate":
        path = cfg.surrogate
        if not path:
            t0 = time.perf_counter()
            path = _collect_and_fit(cfg, env, parent, out)
            cost.add("collect_and_fit_s", time.perf_counter() - t0, cfg.surrogate_decisions)
        surrogate = _make_surrogate_env(cfg, path)
    # the parent run holds the learning curve; per-decision metrics live in the
    # evaluation children (20,000 decisions x 14 metrics filled ~80 MB of mlflow.db)
    learn_env = TrackingWrapper(
        surrogate if surrogate is not None else env, parent, prefix, log_decisions=False
    )
    agent = make_agent(cfg.agent, learn_env, seed=cfg.seed, **cfg.agent_kwargs)
    params = _parent_params(cfg, {f"agent.{k}": v for k, v in agent.hyperparams.items()})
    parent.log_params({prefix + k: v for k, v in params.items()})
    t0 = time.perf_counter()
    where = "the surrogate" if surrogate is not None else "real ranks"
    with phase(f"training {cfg.agent} on {where}", cfg.timesteps, unit="decisions") as adv:
        agent.learn(cfg.timesteps, callback=lambda _: adv(1))
    learn_s = time.perf_counter() - t0
    cost.add("learn_s", learn_s, 0 if surrogate is not None else cfg.timesteps)
    learn_env.write_csv(out / "learning-decisions.csv")
    parent.log_artifact(out / "learning-decisions.csv")
    parent.log_metrics({f"{prefix}train/learn_s": learn_s}, step=cfg.timesteps)
    console.print(f"learned in {learn_s:.1f} s on {where}")
    if surrogate is not None and cfg.fine_tune_episodes:
        if not hasattr(agent, "fine_tune"):
            raise ValueError(
                f"fine_tune_episodes={cfg.fine_tune_episodes} needs an SB3 agent (ppo, a2c, "
                f"dqn); {cfg.agent!r} has no fine-tuning"
            )
        real_env = TrackingWrapper(env, parent, f"{prefix}fine_tune/", log_decisions=False)
        t0 = time.perf_counter()
        n = cfg.fine_tune_episodes
        with phase(f"fine-tuning {cfg.agent} on real ranks", n, unit="episodes") as adv:
            decisions = agent.fine_tune(
                real_env,
                n,
                callback=lambda step: adv(1) if step["terminated"] or step["truncated"] else None,
            )
        tune_s = time.perf_counter() - t0
        cost.add("fine_tune_s", tune_s, decisions)
        parent.log_metrics({f"{prefix}train/fine_tune_s": tune_s}, step=cfg.timesteps)
        console.print(f"fine-tuned on {n} real episodes ({decisions} decisions) in {tune_s:.1f} s")
    policy = agent.save(out / "policy.zip")
    parent.log_artifact(policy)
    console.print(f"policy saved to [bold]{policy}[/bold]")
    return agent, cost, surrogate


def _make_surrogate_env(cfg: RunConfig, path: str | Path) -> gym.Env:
    import commgym.env  # noqa: F401 - registers the env

    return gym.make("commgym/Surrogate-v0", model_path=str(path), **cfg.env)


def _collect_and_fit(cfg: RunConfig, env: gym.Env, run: Any, out: Path) -> Path:
    """Record ``cfg.surrogate_decisions`` real decisions, fit the surrogate; log both."""
    from commgym.experiments.collect import fit_surrogate, record_dataset

    with phase(
        "recording real decisions for the surrogate (sticky random exploration)",
        cfg.surrogate_decisions,
        unit="decisions",
    ) as adv:
        data, bench, collect_s = record_dataset(
            env,
            out / "transitions.csv",
            cfg.surrogate_decisions,
            "sticky",
            cfg.seed,
            run=run,
            on_step=lambda: adv(1),
        )
    t0 = time.perf_counter()
    path = out / "surrogate.joblib"
    with phase("fitting the surrogate (alpha-beta prior + gradient boosting)"):
        fit_surrogate([data], path, bench=bench, menu=cfg.env.get("action_menu"))
    run.log_artifact(path)
    console.print(
        f"recorded in {collect_s:.1f} s; surrogate fitted -> [bold]{path}[/bold] "
        f"(fitted {time.perf_counter() - t0:.1f} s)"
    )
    return path


def _sim_to_real(
    cfg: RunConfig,
    surrogate: gym.Env,
    agent: Any,
    real: list[EpisodeResult],
    run: Any,
    prefix: str = "",
) -> float:
    """Return on the surrogate minus return on real ranks, same policy and seeds.

    Logs ``<prefix>sim2real/surrogate_return``, ``<prefix>sim2real/real_return`` and
    ``<prefix>sim2real/gap``.
    """
    target = cfg.env.get("target_loss")
    sim = [run_episode(surrogate, agent, r.seed, "surrogate", target).episode_return for r in real]
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
    console.print(
        f"sim-to-real gap: surrogate return {sim_mean:.3f} - real return {real_mean:.3f} "
        f"= {gap:+.3f} (same policy, seeds {[r.seed for r in real]})"
    )
    return gap


def _compare_with_baselines(
    cfg: RunConfig, env: gym.Env, name: str, agent: Any, tracker: Any, parent: Any, out: Path
) -> dict[str, list[EpisodeResult]]:
    """Evaluate ``agent`` and ``cfg.baselines`` on the same seeds; log, plot and print."""
    agents = {name: agent}
    for b in cfg.baselines:
        agents[b], _ = _baseline(b, env, cfg)
    results, figures = _compare(cfg, env, agents, tracker, parent.run_id, out)
    for fig in figures:
        parent.log_artifact(fig)
    _print_table(results, cfg)
    _log_summary(parent, results)
    return results


def _baseline(name: str, env: gym.Env, cfg: RunConfig) -> tuple[Any, TrainingCost]:
    """Build a baseline agent; tuners (bayesopt, grid, bandit, ...) tune first on the env.

    A tuner gets ``cfg.resolved_tuning_decisions`` real decisions (by default as many as
    the learned agent saw on real ranks); their wall time is printed as its tuning cost.
    Agents that declare ``online = True`` (``autotune``: it tunes inside every episode, so
    its tuning already counts in the measured time) and static presets get no tuning
    phase; ``oracle-static`` runs its exhaustive search (``search_s``).

    Returns:
        ``(agent, cost)``.
    """
    from commgym.agents import make_agent

    cost = TrainingCost()
    kwargs: dict[str, Any] = {"seed": cfg.seed, **cfg.baseline_kwargs.get(name, {})}
    cls = _agent_class(name)
    if cls is not None and cls.oracle:
        kwargs["seeds"] = [cfg.eval_seed + i for i in range(cfg.episodes)]
    agent = make_agent(name, env, **kwargs)
    if agent.oracle:
        t0 = time.perf_counter()
        with phase(f"{name}: every menu entry on the evaluation seeds"):
            agent.learn()
        cost.add("search_s", time.perf_counter() - t0, int(agent.search_decisions))
        console.print(
            f"{name} searched {len(agent.ranking)} entries in {cost.wall_s:.1f} s "
            f"({agent.search_decisions} real decisions; search cost, reported apart)"
        )
    elif not name.startswith("static:") and name != "random" and not agent.online:
        n = cfg.resolved_tuning_decisions
        t0 = time.perf_counter()
        with phase(f"tuning baseline {name} on real ranks", n, unit="decisions") as adv:
            agent.learn(n, callback=lambda _: adv(1))
        cost.add("tune_s", time.perf_counter() - t0, n)
        console.print(
            f"baseline {name} tuned on {n} real decisions in {cost.wall_s:.1f} s "
            "(tuning cost; set with --tuning-decisions)"
        )
    return agent, cost


def _agent_class(name: str) -> Any:
    from commgym.agents import AGENTS

    return AGENTS.get(name.split(":", 1)[0])


def _log_summary(run: Any, results: dict[str, list[EpisodeResult]]) -> None:
    from commgym.experiments.plots import mean_ci

    for i, (name, eps) in enumerate(results.items()):
        mean, half, _ = mean_ci([e.episode_return for e in eps])
        run.log_metrics(
            {
                f"compare/{_slug(name)}/return_mean": mean,
                f"compare/{_slug(name)}/return_ci95": half,
                f"compare/{_slug(name)}/final_eval_loss": statistics.fmean(
                    e.final_eval_loss for e in eps
                ),
            },
            step=i,
        )


def evaluate(cfg: RunConfig, policy: str | Path) -> dict[str, list[EpisodeResult]]:
    """Compare a saved policy with ``cfg.baselines`` over ``cfg.episodes`` seeds.

    Raises:
        FileNotFoundError: the policy file does not exist.
        ValueError: the file is not a commgym policy, or it was trained for a different
            action menu / observation layout (checked before anything is created).
    """
    from commgym.agents import load_agent
    from commgym.agents.base import read_policy_json
    from commgym.experiments.tracking import Tracker

    read_policy_json(policy)  # missing or garbage files fail before anything is created
    env = _make_env(cfg)  # starts no ranks yet
    try:
        agent = load_agent(policy, env=env)  # layout checked before anything is created
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        tracker = Tracker(cfg.tracking_uri, experiment=cfg.experiment)
        _announce(tracker)
        with tracker.start_run("evaluate", tags={"commgym.command": "evaluate"}) as parent:
            parent.log_params(_parent_params(cfg, {"policy": str(policy)}))
            parent.log_artifact(Path(policy))
            _start_ranks(cfg, env)
            results = _compare_with_baselines(
                cfg, env, f"policy ({Path(policy).name})", agent, tracker, parent, out
            )
    finally:
        env.close()
    console.print(f"figures and CSVs: [bold]{out}/[/bold] (comparison.png, loss-curves.png, ...)")
    _announce(tracker)
    return results
