"""The recipe that learns a communication policy: ``commgym train``.

:func:`train` opens one MLflow parent run, starts the real ranks, learns a policy by
:func:`learn_agent` (record real decisions, fit the surrogate, learn on it, optionally
fine-tune on real ranks; or learn on real ranks), saves it, and hands it to the evaluation
(:mod:`commgym.experiments.evaluation`): compared with the baselines on real ranks over the
same seeds, and on the surrogate for the sim-to-real gap.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import yaml

from commgym.agents.rollout import Episode
from commgym.experiments.config import RunConfig
from commgym.experiments.evaluation import (
    TrainingCost,
    build_agent,
    compare_with_baselines,
    search_oracle,
    sim_to_real_gap,
)
from commgym.experiments.executors import LOCAL, Executor
from commgym.experiments.progress import console, phase
from commgym.experiments.session import announce, make_env, parent_params, start_ranks

__all__ = ["learn_agent", "train"]


def train(cfg: RunConfig, env: gym.Env | None = None) -> dict[str, list[Episode]]:
    """Train ``cfg.agent``, save the policy, compare it with the baselines on real ranks.

    With ``cfg.env_kind == "surrogate"`` the agent learns on ``commgym/Surrogate-v1``
    (fitted first from ``cfg.surrogate_decisions`` real decisions when ``cfg.surrogate``
    is unset), with ``"sim"`` on ``commgym/Sim-v1`` (calibrated first when
    ``cfg.calibration``'s file does not exist), and the sim-to-real gap is logged;
    evaluation always runs on real ranks.

    Args:
        cfg: the resolved run configuration.
        env: a real env of ``cfg.env_config`` whose ranks may already run (the caller
            keeps and closes it, e.g. to train several agents on the same ranks); default:
            one made here and closed at the end.

    Returns:
        Evaluation results by agent name (the trained agent first).

    Raises:
        FileNotFoundError: ``cfg.surrogate`` names a file that does not exist.
        ValueError: ``cfg.surrogate`` is not a surrogate model file of this version, or
            ``cfg.calibration`` is not a calibration of this scenario's setting and menu.
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
    check_calibration(cfg)
    from commgym.experiments.executors import open_executor

    with open_executor(cfg) as executor:
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        tracker = Tracker(cfg.tracking_uri, experiment=cfg.experiment)
        announce(tracker)
        owned = env is None
        env = make_env(cfg) if env is None else env
        surrogate = None
        try:
            with tracker.start_run(
                f"train-{cfg.agent}", tags={"commgym.command": "train"}
            ) as parent:
                (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
                parent.log_artifact(out / "config.yaml")
                parent.log_text(" ".join(sys.argv), "command_line.txt")
                start_ranks(cfg, env, executor)
                agent, _, surrogate = learn_agent(cfg, env, parent, out, executor=executor)
                results = compare_with_baselines(
                    cfg, env, f"{cfg.agent} (learned)", agent, tracker, parent, out, executor
                )
                if surrogate is not None:
                    learned = results[f"{cfg.agent} (learned)"]
                    sim_to_real_gap(cfg, surrogate, agent, learned, parent)
        finally:
            if owned:
                env.close()
            if surrogate is not None:
                surrogate.close()
    console.print(f"figures and CSVs: [bold]{out}/[/bold] (comparison.png, loss-curves.png, ...)")
    policy = out / "policy.zip"
    if policy.is_file():  # what to do with it (docs/replay.md)
        ec = cfg.env_config
        console.print(
            f"next: run [bold]{policy}[/bold] beside the static baselines with `commgym replay "
            f"--policy {policy} --workload {ec.workload} --world-size {ec.world_size}`, or "
            "steer your own torchrun job with it (CommScheduler: docs/replay.md)"
        )
    announce(tracker)
    return results


def learn_agent(
    cfg: RunConfig,
    env: gym.Env,
    parent: Any,
    out: Path,
    prefix: str = "",
    executor: Executor = LOCAL,
) -> tuple[Any, TrainingCost, gym.Env | None]:
    """Train ``cfg.agent`` as the scenario says, save its policy; the recipe of ``train``.

    On ``env_kind="surrogate"``: record ``cfg.surrogate_decisions`` real decisions (unless
    ``cfg.surrogate`` names a fitted model), fit the surrogate, learn ``cfg.timesteps``
    decisions on it, then fine-tune on real ranks for ``cfg.fine_tune_episodes`` episodes.
    On ``env_kind="sim"``: calibrate the simulator on real ranks (unless its calibration
    file exists), learn ``cfg.timesteps`` decisions in ``commgym/Sim-v1``, fine-tune as on
    the surrogate. On ``env_kind="real"``: learn ``cfg.timesteps`` real decisions.

    Args:
        cfg: the resolved run configuration.
        env: the real env (ranks started).
        parent: the MLflow run that receives the learning curve, CSV and policy.
        out: output folder (``policy.zip``, ``learning-decisions.csv`` on real ranks or
            ``learning-episodes.csv`` on the surrogate / simulator, surrogate files).
        prefix: prepended to the parameter and metric names logged to ``parent`` (a
            leaderboard trains one agent per scenario into one parent run).
        executor: where every real decision runs
            (:class:`~commgym.experiments.executors.Executor`): the recording
            (:meth:`~commgym.experiments.executors.Executor.record`), the learning on real
            ranks (:meth:`~commgym.experiments.executors.Executor.learning_env`: on Ray,
            SB3 agents through a :class:`~commgym.agents.ray_env.RayVecEnv` of
            ``cfg.ray_envs`` actors, other learners through one
            :class:`~commgym.agents.ray_env.RayEnv`) and the fine-tuning
            (:meth:`~commgym.experiments.executors.Executor.real_env`).

    Returns:
        ``(agent, cost, surrogate_env)``; ``surrogate_env`` is ``None`` on real ranks (the
        caller closes it).
    """
    from commgym.agents import AGENTS, OracleStaticAgent
    from commgym.experiments.tracking import TrackingWrapper

    cost = TrainingCost()
    surrogate = None
    cls = AGENTS.get(cfg.agent.split(":", 1)[0])
    real_only = cls is not None and cls.needs_real_env
    if real_only and cfg.env_kind != "real":
        console.print(f"{cfg.agent} learns by forking real episodes: it trains on real ranks")
    if cfg.env_kind == "sim" and not real_only:
        surrogate = _make_sim_env(cfg, parent, cost)
    elif cfg.env_kind == "surrogate" and not real_only:
        path = cfg.surrogate
        if not path:
            t0 = time.perf_counter()
            path = _collect_and_fit(cfg, env, parent, out, executor)
            cost.add("collect_and_fit_s", time.perf_counter() - t0, cfg.surrogate_decisions)
        surrogate = _make_surrogate_env(cfg, path)
    vec_env = None
    real_env: gym.Env = env
    # an agent that forks episodes (snapshot/restore) or searches as an oracle learns on
    # this process's ranks; the others on the executor's env actors
    local_only = cls is not None and (cls.needs_real_env or cls.oracle)
    if surrogate is None and not local_only:
        vec_env, real_env = executor.learning_env(env, cfg.env_config, cls)
    # the parent run holds the learning curve; per-decision metrics live in the
    # evaluation children (20,000 decisions x 14 metrics filled ~80 MB of mlflow.db)
    learn_on = surrogate if surrogate is not None else real_env
    if surrogate is not None and cfg.sim_randomize:
        from commgym.env.sim.randomize import RandomizedConditions

        # a new link trace every episode while learning: a policy that reacts to the link,
        # not to the clock. The wrapper rewrites its env's config at each reset, so it gets
        # a twin of the simulator; the gap and fine-tuning keep the scenario's own plan.
        twin = gym.make("commgym/Sim-v1", calibration=surrogate.unwrapped.calibration,
                        config=cfg.env_config)  # fmt: skip
        learn_on = RandomizedConditions(twin, **cfg.sim_randomize)
    # a simulator's (or surrogate's) hundreds of thousands of decisions: a row per episode
    rows = "episodes" if surrogate is not None else "decisions"
    learn_env = TrackingWrapper(learn_on, parent, prefix, log_decisions=False, rows=rows)
    try:
        extra = {} if vec_env is None else {"vec_env": vec_env}
        agent = build_agent(cfg.agent, learn_env, cfg, {**cfg.agent_hyperparams, **extra})
        params = parent_params(cfg, {f"agent.{k}": v for k, v in agent.hyperparams.items()})
        parent.log_params({prefix + k: v for k, v in params.items()})
        t0 = time.perf_counter()
        where = "real ranks"
        if surrogate is not None:
            where = "the simulator" if cfg.env_kind == "sim" else "the surrogate"
        # what an oracle learns is its search over the evaluation seeds (best-static's is
        # the same search on training seeds)
        searches = agent.oracle or isinstance(agent, OracleStaticAgent)
        if searches:
            search_oracle(cfg.agent, agent, cost, real=surrogate is None)
        if cfg.sim_warm_start and not searches:
            warm_start(cfg, agent, parent, prefix, sim=surrogate)
        if not searches and cfg.timesteps and agent.searches_when_learning:
            # its searches' size is theirs, not timesteps': each shows its own bar, in
            # episodes or link phases, with an estimate
            console.print(f"training {cfg.agent} on {where}: its searches, one bar each ...")
            agent.learn(cfg.timesteps, progress_bar=True)
        elif not searches and cfg.timesteps:  # 0: a warm start's clone as it is
            with phase(f"training {cfg.agent} on {where}", cfg.timesteps, unit="decisions") as adv:
                if vec_env is None:
                    agent.learn(cfg.timesteps, callback=lambda _: adv(1))
                else:  # the steps of every env actor, logged here as TrackingWrapper's own

                    def logged(step: dict[str, Any]) -> None:
                        learn_env.record(
                            step["action"], step["reward"], step["terminated"],
                            step["truncated"], step["info"], stream=step.get("env", 0),
                        )  # fmt: skip
                        adv(1)

                    agent.learn(cfg.timesteps, callback=logged)
    finally:
        if real_env is not env:
            real_env.close()
        if vec_env is not None:
            vec_env.close()
    learn_s = time.perf_counter() - t0
    if not searches:
        # a learner that runs its own episodes says how many real decisions they took
        spent = agent.preparation.decisions or cfg.timesteps
        cost.add("learn_s", learn_s, 0 if surrogate is not None else spent)
    curve = out / f"learning-{rows}.csv"
    learn_env.write_csv(curve)
    parent.log_artifact(curve)
    parent.log_metrics({f"{prefix}train/learn_s": learn_s}, step=cfg.timesteps)
    console.print(f"learned in {learn_s:.1f} s on {where}")
    if surrogate is not None and cfg.fine_tune_episodes:
        if not hasattr(agent, "fine_tune"):
            raise ValueError(
                f"fine_tune_episodes={cfg.fine_tune_episodes} needs an SB3 agent (ppo, "
                f"recurrent-ppo, a2c, dqn); {cfg.agent!r} has no fine-tuning"
            )
        ranks = executor.real_env(env, cfg.env_config)
        tuned = TrackingWrapper(ranks, parent, f"{prefix}fine_tune/", log_decisions=False)
        t0 = time.perf_counter()
        n = cfg.fine_tune_episodes
        try:
            with phase(f"fine-tuning {cfg.agent} on real ranks", n, unit="episodes") as adv:
                decisions = agent.fine_tune(
                    tuned,
                    n,
                    callback=lambda s: adv(1) if s["terminated"] or s["truncated"] else None,
                )
        finally:
            if ranks is not env:
                ranks.close()
        tune_s = time.perf_counter() - t0
        cost.add("fine_tune_s", tune_s, decisions)
        parent.log_metrics({f"{prefix}train/fine_tune_s": tune_s}, step=cfg.timesteps)
        console.print(f"fine-tuned on {n} real episodes ({decisions} decisions) in {tune_s:.1f} s")
    policy = agent.save(out / "policy.zip")
    parent.log_artifact(policy)
    console.print(f"policy saved to [bold]{policy}[/bold]")
    return agent, cost, surrogate


def warm_start(
    cfg: RunConfig, agent: Any, parent: Any, prefix: str = "", sim: gym.Env | None = None
) -> dict[str, float]:
    """Clone an expert into ``agent`` in the simulator before RL (``cfg.sim_warm_start``).

    Records ``episodes`` episodes of the expert on the agent's own learning env, fits the
    policy to them (:meth:`~commgym.agents.sb3.SB3Agent.warm_start`), prints and logs the
    fit (``train/bc_*`` metrics). The expert is the simulator's reactive oracle
    (:class:`~commgym.agents.imitation.SimScheduleExpert`, ``expert: oracle``) or the
    model-predictive agent (``expert: mpc``: built on ``sim`` from the run's calibration
    and ``expert_kwargs``, it learns the links' dwells there for ``expert_timesteps``
    decisions, then acts through :class:`~commgym.agents.imitation.AgentExpert`).

    Returns:
        The fit's figures (decisions, nll, accuracy, value_mse, episodes, skipped).

    Raises:
        ValueError: ``expert: mpc`` without the simulator env ``sim``.
    """
    from commgym.agents.imitation import AgentExpert, SimScheduleExpert

    w = dict(cfg.sim_warm_start or {})
    n = int(w.pop("episodes"))
    kind = w.pop("expert", "oracle")
    expert_kwargs = dict(w.pop("expert_kwargs", None) or {})
    expert_timesteps = int(w.pop("expert_timesteps", 300))
    t0 = time.perf_counter()
    if kind == "mpc":
        from commgym.experiments.calibrate_sim import calibration_path

        if sim is None:
            raise ValueError("expert: mpc plans in the simulator; no simulator env was given")
        calibration = str(calibration_path(cfg.calibration, cfg.env_config))
        mpc = build_agent("mpc", sim, cfg, {"calibration": calibration, **expert_kwargs})
        with phase(
            "mpc learning the links (the expert)", expert_timesteps, unit="decisions"
        ) as adv:
            mpc.learn(expert_timesteps, callback=lambda _: adv(1))
        expert: Any = AgentExpert(mpc)
        label = "the model-predictive agent"
    else:
        expert = SimScheduleExpert(opening=w.pop("opening", "best"))
        label = "the simulator's reactive oracle"
    rounds = 1 + int(w.get("dagger_rounds", 0))
    with phase(f"cloning {label}", n * rounds, unit="episodes") as adv:
        fit = agent.warm_start(expert, n, callback=lambda: adv(1), **w)
    fit["clone_s"] = time.perf_counter() - t0
    parent.log_metrics({f"{prefix}train/bc_{k}": float(v) for k, v in fit.items()}, step=0)
    console.print(
        f"cloned {int(fit['decisions'])} decisions of {n} expert episodes ({label}) in "
        f"{fit['clone_s']:.1f} s: the clone plays the expert's action on "
        f"{fit['accuracy']:.1%} of them"
        + (
            f" ({rounds - 1} DAgger rounds; before the last round's fit it played the "
            f"expert's action on {fit['dagger_agreement']:.1%} of its own decisions)"
            if rounds > 1
            else ""
        )
        + (f" ({expert.missed} episodes no schedule finishes)" if expert.missed else "")
    )
    return fit


def check_calibration(cfg: RunConfig) -> None:
    """Refuse, before any rank starts, a simulator calibration that cannot serve ``cfg``.

    Raises:
        FileNotFoundError: ``cfg.calibration`` is given and does not exist.
        ValueError: the file is not a calibration, or one of another workload setting,
            menu or target (:meth:`~commgym.env.sim.Calibration.check`); no file and no
            target loss to calibrate down to.
    """
    if cfg.env_kind != "sim":
        return
    from commgym.experiments.calibrate_sim import calibration_path

    path = calibration_path(cfg.calibration, cfg.env_config)
    if not path.is_file():
        if cfg.calibration:
            raise FileNotFoundError(
                f"calibration {cfg.calibration!r} not found: make one with `commgym "
                "calibrate-sim --config SCENARIO --out PATH`, or leave calibration unset to "
                "calibrate first"
            )
        if cfg.env_config.target_loss is None:
            raise ValueError(
                "--env sim calibrates the simulator down to the scenario's target loss, and "
                "this scenario has none: set env.target_loss (--target-loss) or give "
                "--calibration PATH"
            )
        return  # calibrated by learn_agent
    from commgym.env.sim import Calibration

    Calibration.load(path).check(cfg.env_config)


def _make_sim_env(cfg: RunConfig, run: Any, cost: TrainingCost) -> gym.Env:
    """``commgym/Sim-v1`` of ``cfg``, calibrated on real ranks first when its file is missing.

    The calibration's real seconds and decisions count in ``cost``.
    """
    import commgym.env  # noqa: F401 - registers the env
    from commgym.env.sim import Calibration
    from commgym.experiments.calibrate_sim import calibrate_sim, calibration_path

    path = calibration_path(cfg.calibration, cfg.env_config)
    if not path.is_file():
        t0 = time.perf_counter()
        # the calibration runs its own unshaped episodes on ranks of its own (the
        # scenario's links enter through the wire fit of the rates its plan can put in force)
        cal = calibrate_sim(cfg.env_config, path, progress=phase)
        cost.add("calibrate_s", time.perf_counter() - t0, int(cal.meta["real_decisions"]))
    cal = Calibration.load(path)
    run.log_artifact(str(path))
    meta = cal.meta
    console.print(
        f"simulator calibration {path}: {meta.get('real_decisions')} real decisions, "
        f"{float(meta.get('real_s', 0.0)):.0f} s on real ranks (`commgym bench sim` prints its "
        "fidelity gates)"
    )
    return gym.make("commgym/Sim-v1", calibration=cal, config=cfg.env_config)


def _make_surrogate_env(cfg: RunConfig, path: str | Path) -> gym.Env:
    import commgym.env  # noqa: F401 - registers the env

    return gym.make("commgym/Surrogate-v1", model_path=str(path), config=cfg.env_config)


def _collect_and_fit(
    cfg: RunConfig, env: gym.Env, run: Any, out: Path, executor: Executor = LOCAL
) -> Path:
    """Record ``cfg.surrogate_decisions`` real decisions, fit the surrogate; log both."""
    from commgym.experiments.collect import fit_surrogate

    with phase(
        "recording real decisions for the surrogate (sticky random exploration)",
        cfg.surrogate_decisions,
        unit="decisions",
    ) as adv:
        data, bench, collect_s = executor.record(
            env, cfg.env_config, out / "transitions.csv", cfg.surrogate_decisions, "sticky",
            cfg.seed, run=run, on_decisions=adv,
        )  # fmt: skip
    t0 = time.perf_counter()
    path = out / "surrogate.joblib"
    with phase("fitting the surrogate (alpha-beta prior + gradient boosting)"):
        fit_surrogate([data], path, bench=bench, menu=cfg.env_config.menu)
    run.log_artifact(path)
    console.print(
        f"recorded in {collect_s:.1f} s; surrogate fitted -> [bold]{path}[/bold] "
        f"(fitted {time.perf_counter() - t0:.1f} s)"
    )
    return path
