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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from commgym.experiments.config import RunConfig

__all__ = ["EpisodeResult", "evaluate", "run_episode", "train"]

# Wide enough for the comparison table when output is piped or captured (no terminal).
console = Console(width=None if sys.stdout.isatty() else 160)


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
    env: gym.Env, agent: Any, seed: int, name: str, target_loss: float | None
) -> EpisodeResult:
    """Run one episode with ``agent.predict(obs, deterministic=True)``.

    Args:
        env: the (possibly wrapped) environment.
        agent: anything with the ``Agent.predict`` signature.
        seed: episode seed (identical for every compared agent).
        name: label of the agent.
        target_loss: held-out loss whose first crossing defines time-to-target.

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
                "comm_s": float(m["comm_s"]),
                "bandwidth_gbps": float(m["bytes_total"]) * 8 / float(m["comm_s"]) / 1e9
                if float(m["comm_s"]) > 0
                else 0.0,
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


def _ci95(values: list[float]) -> tuple[float, float]:
    """Mean and 95 % half-width over seeds (``plots.mean_ci``); half-width 0 for one seed."""
    from commgym.experiments.plots import mean_ci

    mean, half, n = mean_ci(values)
    return mean, (0.0 if n == 1 else half)


def _print_table(results: dict[str, list[EpisodeResult]], cfg: RunConfig) -> Table:
    budget = cfg.env.get("time_budget_s", "default")
    target = cfg.env.get("target_loss")
    goal = f", target held-out loss {target}" if target is not None else ""
    table = Table(
        title=f"{cfg.env.get('workload', 'mlp-digits')}, {cfg.env.get('world_size', 2)} ranks, "
        f"{cfg.episodes} seeds, training budget {budget} s per episode{goal} (mean ± 95% CI)"
    )
    for col in (
        "agent",
        _return_label(cfg),
        "final eval loss",
        "accuracy",
        "bytes/step",
        "time to target s",
        "decisions",
    ):
        table.add_column(col, justify="left" if col == "agent" else "right")
    for name, eps in results.items():
        ret = _ci95([e.episode_return for e in eps])
        loss = _ci95([e.final_eval_loss for e in eps])
        acc = _ci95([e.final_eval_acc for e in eps])
        ttt = [e.time_to_target_s for e in eps if e.time_to_target_s is not None]
        table.add_row(
            name,
            f"{ret[0]:.3f} ± {ret[1]:.3f}",
            f"{loss[0]:.4f} ± {loss[1]:.4f}",
            f"{acc[0]:.3f}" if math.isfinite(acc[0]) else "-",
            f"{statistics.fmean(e.bytes_per_step for e in eps):,.0f}",
            f"{statistics.fmean(ttt):.2f} ({len(ttt)}/{len(eps)})" if ttt else "not reached",
            f"{statistics.fmean(e.decisions for e in eps):.1f}",
        )
    console.print(table)
    return table


def _compare(
    cfg: RunConfig,
    env: gym.Env,
    agents: dict[str, Any],
    tracker: Any,
    parent_id: str | None,
    out: Path,
) -> tuple[dict[str, list[EpisodeResult]], Path]:
    from commgym.experiments.plots import action_timeline_plot, comparison_plot
    from commgym.experiments.tracking import TrackingWrapper

    target = cfg.env.get("target_loss")
    results: dict[str, list[EpisodeResult]] = {}
    for name, agent in agents.items():
        results[name] = []
        for i in range(cfg.episodes):
            seed = cfg.eval_seed + i
            with tracker.start_run(
                f"eval-{name}-seed{seed}",
                params={"agent": name, "seed": seed},
                tags={"commgym.role": "evaluation"},
                parent_run_id=parent_id,
            ) as run:
                wrapped = TrackingWrapper(env, run)
                res = run_episode(wrapped, agent, seed, name, target)
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
                    },
                    step=0,
                )
                if i == 0 and res.rows:
                    png = action_timeline_plot(
                        res.rows, out / f"timeline-{_slug(name)}.png", title=f"{name}, seed {seed}"
                    )
                    run.log_artifact(png)
                results[name].append(res)
    comp = comparison_plot(
        {n: [e.episode_return for e in r] for n, r in results.items()},
        _return_label(cfg),
        out / "comparison.png",
    )
    return results, comp


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

    console.print(f"MLflow tracking URI: [bold]{tracker.tracking_uri}[/bold]")
    console.print(
        f"open the UI with:    [bold]{ui_command(tracker.tracking_uri)}[/bold]  (or: commgym ui)"
    )


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
    from commgym.agents import make_agent
    from commgym.experiments.tracking import Tracker, TrackingWrapper

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
            if cfg.env_kind == "surrogate":
                path = cfg.surrogate or _collect_and_fit(cfg, env, parent, out)
                surrogate = _make_surrogate_env(cfg, path)
            learn_env = TrackingWrapper(surrogate if surrogate is not None else env, parent)
            agent = make_agent(cfg.agent, learn_env, seed=cfg.seed, **cfg.agent_kwargs)
            parent.log_params(
                _parent_params(cfg, {f"agent.{k}": v for k, v in agent.hyperparams.items()})
            )
            t0 = time.perf_counter()
            console.print(
                f"training [bold]{cfg.agent}[/bold] for {cfg.timesteps} decisions on "
                + ("the surrogate ..." if surrogate is not None else "real ranks ...")
            )
            agent.learn(cfg.timesteps, progress_bar=True)
            learn_s = time.perf_counter() - t0
            learn_env.write_csv(out / "learning-decisions.csv")
            parent.log_artifact(out / "learning-decisions.csv")
            policy = agent.save(out / "policy.zip")
            parent.log_artifact(policy)
            parent.log_metrics({"train/learn_s": learn_s}, step=cfg.timesteps)
            console.print(f"learned in {learn_s:.1f} s; policy saved to [bold]{policy}[/bold]")
            results = _compare_with_baselines(
                cfg, env, f"{cfg.agent} (learned)", agent, tracker, parent, out
            )
            if surrogate is not None:
                _sim_to_real(cfg, surrogate, agent, results[f"{cfg.agent} (learned)"], parent)
    finally:
        env.close()
        if surrogate is not None:
            surrogate.close()
    _announce(tracker)
    return results


def _make_surrogate_env(cfg: RunConfig, path: str | Path) -> gym.Env:
    import commgym.env  # noqa: F401 - registers the env

    return gym.make("commgym/Surrogate-v0", model_path=str(path), **cfg.env)


def _collect_and_fit(cfg: RunConfig, env: gym.Env, run: Any, out: Path) -> Path:
    """Record ``cfg.surrogate_decisions`` real decisions, fit the surrogate; log both."""
    from commgym.experiments.collect import fit_surrogate, record_dataset

    console.print(
        f"collecting {cfg.surrogate_decisions} real decisions for the surrogate "
        "(sticky random exploration) ..."
    )
    data, bench, collect_s = record_dataset(
        env, out / "transitions.csv", cfg.surrogate_decisions, "sticky", cfg.seed, run=run
    )
    t0 = time.perf_counter()
    path = out / "surrogate.joblib"
    fit_surrogate([data], path, bench=bench, menu=cfg.env.get("action_menu"))
    run.log_artifact(path)
    console.print(
        f"recorded in {collect_s:.1f} s; surrogate fitted -> [bold]{path}[/bold] "
        f"(fitted {time.perf_counter() - t0:.1f} s)"
    )
    return path


def _sim_to_real(
    cfg: RunConfig, surrogate: gym.Env, agent: Any, real: list[EpisodeResult], run: Any
) -> float:
    """Return on the surrogate minus return on real ranks, same policy and seeds.

    Logs ``sim2real/surrogate_return``, ``sim2real/real_return`` and ``sim2real/gap``.
    """
    target = cfg.env.get("target_loss")
    sim = [run_episode(surrogate, agent, r.seed, "surrogate", target).episode_return for r in real]
    sim_mean = statistics.fmean(sim)
    real_mean = statistics.fmean(r.episode_return for r in real)
    gap = sim_mean - real_mean
    run.log_metrics(
        {
            "sim2real/surrogate_return": sim_mean,
            "sim2real/real_return": real_mean,
            "sim2real/gap": gap,
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
        agents[b] = _baseline(b, env, cfg)
    results, comp = _compare(cfg, env, agents, tracker, parent.run_id, out)
    parent.log_artifact(comp)
    _print_table(results, cfg)
    _log_summary(parent, results)
    return results


def _baseline(name: str, env: gym.Env, cfg: RunConfig) -> Any:
    """Build a baseline agent; tuners (bayesopt, grid, bandit) tune first on the env."""
    from commgym.agents import make_agent

    agent = make_agent(name, env, seed=cfg.seed)
    if not name.startswith("static:") and name not in ("random",):
        t0 = time.perf_counter()
        agent.learn(max(cfg.timesteps // 2, 8))
        console.print(f"baseline {name} tuned for {time.perf_counter() - t0:.1f} s (tuning cost)")
    return agent


def _log_summary(run: Any, results: dict[str, list[EpisodeResult]]) -> None:
    for i, (name, eps) in enumerate(results.items()):
        mean, half = _ci95([e.episode_return for e in eps])
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
        ValueError: the policy was trained for a different action menu / observation layout.
    """
    from commgym.agents import load_agent
    from commgym.experiments.tracking import Tracker

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tracker = Tracker(cfg.tracking_uri, experiment=cfg.experiment)
    _announce(tracker)
    env = _make_env(cfg)
    try:
        agent = load_agent(policy, env=env)
        with tracker.start_run("evaluate", tags={"commgym.command": "evaluate"}) as parent:
            parent.log_params(_parent_params(cfg, {"policy": str(policy)}))
            parent.log_artifact(Path(policy))
            results = _compare_with_baselines(
                cfg, env, f"policy ({Path(policy).name})", agent, tracker, parent, out
            )
    finally:
        env.close()
    _announce(tracker)
    return results
