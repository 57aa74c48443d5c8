"""The ``commgym`` command line (typer).

Sub-commands grow with the project; today: ``commgym bench sync`` (the collectives
benchmark against torch DDP) and ``commgym bench kernels`` (compression-kernel
throughput against a device copy).
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="commgym",
    help="Learned communication scheduling for data-parallel training.",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = typer.Typer(help="Benchmarks (measured side by side in one run).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("sync")
def bench_sync(
    world_size: int = typer.Option(2, "--world-size", min=2, help="Number of gloo ranks."),
    steps: int = typer.Option(30, "--steps", min=3, help="Measured steps per configuration."),
    warmup: int = typer.Option(5, "--warmup", min=0, help="Unmeasured warm-up steps."),
    bucket_mb: float = typer.Option(
        25.0, "--bucket-mb", help="Bucket size in MiB for both DDP and commgym."
    ),
    model: str = typer.Option(
        "mlp", "--model", help="Benchmark model: 'mlp' (digits-sized) or 'wide' (~10M params)."
    ),
    compressors: str = typer.Option(
        "none,fp16,bf16,int8,int4,int2,topk:0.01,randomk:0.01,powersgd:4",
        "--compressors",
        help="Comma-separated compression specs to measure besides DDP.",
    ),
    rounds: int = typer.Option(
        3, "--rounds", min=1, help="Interleaved repetitions (ratios use all)."
    ),
    json_path: str | None = typer.Option(None, "--json", help="Also write results as JSON here."),
    timeout_s: float | None = typer.Option(
        None, "--timeout-s", help="Kill the ranks after this many seconds (default: from steps)."
    ),
    network: str | None = typer.Option(
        None,
        "--network",
        help="Shape every rank's link (e.g. 1gbit, 100mbit, ethernet-1g; needs root): one "
        "network namespace and torchrun agent per rank. Default: unshaped loopback.",
    ),
    network_strict: bool = typer.Option(
        True,
        "--network-strict/--drop-impairments",
        help="Without the kernel's netem, refuse (default) or drop delay/jitter/loss with a "
        "warning and keep the rate.",
    ),
    sync_period: int = typer.Option(
        1, "--sync-period", min=1, help="Local-SGD period of ours (reports time per round)."
    ),
) -> None:
    """Torch DDP vs GradientSynchronizer (same model, buckets, gloo ranks) and every compressor."""
    from commgym.collectives import WorkerFailed
    from commgym.experiments.bench import run_sync_benchmark

    try:
        run_sync_benchmark(
            world_size=world_size,
            steps=steps,
            warmup=warmup,
            bucket_mb=bucket_mb,
            model=model,
            compressors=[c.strip() for c in compressors.split(",") if c.strip()],
            rounds=rounds,
            json_path=json_path,
            timeout_s=timeout_s,
            network=network,
            network_strict=network_strict,
            sync_period=sync_period,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    except (PermissionError, RuntimeError) as exc:  # network emulation unavailable here
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    except WorkerFailed as exc:  # already printed with the ranks' output
        raise typer.Exit(code=1) from exc


@bench_app.command("kernels")
def bench_kernels(
    sizes_mb: str = typer.Option(
        "auto",
        "--sizes-mb",
        help="Comma-separated buffer sizes in MiB ('auto': 4.5,16 on CPU; 16,64,256 on CUDA).",
    ),
    repeats: int = typer.Option(10, "--repeats", min=1, help="Timed repetitions per measurement."),
    device: str = typer.Option(
        "auto", "--device", help="'auto' (cuda if available), 'cuda' or 'cpu'."
    ),
    threads: int = typer.Option(1, "--threads", min=1, help="torch intra-op threads on CPU."),
    compare_compile: bool = typer.Option(
        False, "--compare-compile", help="Also time torch.compile of the int8 quantiser (CPU)."
    ),
) -> None:
    """Time of each compression kernel next to a copy of the same buffer."""
    from commgym.experiments.bench_kernels import run_kernel_benchmark

    run_kernel_benchmark(
        sizes_mb=None
        if sizes_mb == "auto"
        else [float(s) for s in sizes_mb.split(",") if s.strip()],
        repeats=repeats,
        device=device,
        threads=threads,
        compare_compile=compare_compile,
    )


@bench_app.command("env")
def bench_env(
    workload: str = typer.Option("mlp-digits", "--workload", help="Workload name."),
    world_size: int = typer.Option(2, "--world-size", min=1, help="Number of gloo ranks."),
    steps_per_decision: int = typer.Option(
        10, "--steps-per-decision", min=1, help="Training iterations per env step."
    ),
    decisions: int = typer.Option(
        60, "--decisions", min=4, help="Env steps (the first 3 are warm-up)."
    ),
    actions: str = typer.Option(
        "cycle", "--actions", help="'cycle' (every menu entry in turn) or 'fixed' (DDP default)."
    ),
    json_path: str | None = typer.Option(None, "--json", help="Also write results as JSON here."),
) -> None:
    """Median env-step wall time vs the ranks' own training time (overhead ratio)."""
    from commgym.collectives import WorkerFailed
    from commgym.experiments.bench_env import run_env_benchmark

    try:
        run_env_benchmark(
            workload=workload,
            world_size=world_size,
            steps_per_decision=steps_per_decision,
            decisions=decisions,
            actions=actions,
            json_path=json_path,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    except WorkerFailed as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from exc


@bench_app.command("netem")
def bench_netem(
    profiles: str = typer.Option(
        "datacenter-25g,cloud-10g,ethernet-1g,wan-100m",
        "--profiles",
        help="Profiles or spec strings.",
    ),
    world_sizes: str = typer.Option("2,4", "--world-sizes", help="Comma-separated rank counts."),
    sizes_mb: str = typer.Option(
        "1,4,16,64", "--sizes-mb", help="Comma-separated buffer sizes in MiB."
    ),
    repeats: int = typer.Option(3, "--repeats", min=1),
    json_path: str | None = typer.Option(None, "--json", help="Also write the rows as JSON."),
) -> None:
    """All-reduce bus bandwidth per network profile and world size, vs the configured rate."""
    from commgym.experiments.bench_netem import run_netem_benchmark

    try:
        run_netem_benchmark(
            [p.strip() for p in profiles.split(",") if p.strip()],
            [int(w) for w in world_sizes.split(",") if w.strip()],
            [float(m) for m in sizes_mb.split(",") if m.strip()],
            repeats=repeats,
            json_path=json_path,
        )
    except (RuntimeError, ValueError, PermissionError) as err:
        _fail(err)


netem_app = typer.Typer(
    help="Emulated cluster network (Linux namespaces + tc).", no_args_is_help=True
)
app.add_typer(netem_app, name="netem")


@netem_app.command("cleanup")
def netem_cleanup() -> None:
    """Remove leftover namespaces/links of commgym networks whose owner process is gone."""
    from commgym.env.net import cleanup_leftovers

    removed = cleanup_leftovers()
    typer.echo(
        f"removed {len(removed)} leftover(s)" + (": " + ", ".join(removed) if removed else "")
    )


def _overrides(**kw: object) -> dict[str, object]:
    return {k.replace("__", "."): v for k, v in kw.items() if v is not None}


def _fail(err: Exception) -> None:
    typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@app.command("train")
def train_cmd(
    config: str | None = typer.Option(
        None, "--config", help="YAML scenario file, or a shipped name: 'default', 'smoke'."
    ),
    agent: str | None = typer.Option(
        None,
        "--agent",
        help="Agent name, e.g. ppo, a2c, dqn, bayesopt, bandit (default scenario: ppo).",
    ),
    workload: str | None = typer.Option(
        None,
        "--workload",
        help="mlp-digits, cnn-digits, charlm, wide-mlp (default scenario: mlp-digits).",
    ),
    world_size: int | None = typer.Option(
        None, "--world-size", min=1, help="Number of ranks (default scenario: 2)."
    ),
    timesteps: int | None = typer.Option(
        None, "--timesteps", min=1, help="Training decisions (default scenario: 20000)."
    ),
    network: str | None = typer.Option(
        None,
        "--network",
        help="Emulated network spec or profile, e.g. 100mbit, ethernet-1g (needs root).",
    ),
    seed: int | None = typer.Option(None, "--seed", help="Agent / training seed."),
    steps_per_decision: int | None = typer.Option(
        None,
        "--steps-per-decision",
        min=1,
        help="Training iterations per decision (default scenario: 10).",
    ),
    time_budget_s: float | None = typer.Option(
        None, "--time-budget-s", help="Training seconds per episode (default scenario: 2)."
    ),
    episodes: int | None = typer.Option(
        None, "--episodes", min=1, help="Evaluation seeds per agent (default scenario: 3)."
    ),
    baselines: str | None = typer.Option(
        None, "--baselines", help="Comma-separated agents to compare."
    ),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow tracking URI."),
    output_dir: str | None = typer.Option(
        None, "--output-dir", help="Folder for policy, plots, CSVs."
    ),
    env_kind: str | None = typer.Option(
        None, "--env", help="Learn on 'real' ranks or on the 'surrogate' (evaluation: real)."
    ),
    surrogate: str | None = typer.Option(
        None,
        "--surrogate",
        help="Surrogate model file (with --env surrogate; unset: collect and fit first).",
    ),
    surrogate_decisions: int | None = typer.Option(
        None,
        "--surrogate-decisions",
        min=1,
        help="Real decisions recorded to fit the surrogate (default scenario: 400).",
    ),
) -> None:
    """Train an agent on real all-reduce runs, save the policy, compare it with the baselines."""
    from commgym.experiments.config import load_run_config
    from commgym.experiments.train import train

    try:
        cfg = load_run_config(
            config or "default",
            _overrides(
                agent=agent,
                timesteps=timesteps,
                seed=seed,
                episodes=episodes,
                baselines=baselines,
                tracking_uri=tracking_uri,
                output_dir=output_dir,
                env_kind=env_kind,
                surrogate=surrogate,
                surrogate_decisions=surrogate_decisions,
                env__workload=workload,
                env__world_size=world_size,
                env__network=network,
                env__steps_per_decision=steps_per_decision,
                env__time_budget_s=time_budget_s,
            ),
        )
        train(cfg)
    except (ValueError, FileNotFoundError) as err:
        _fail(err)


@app.command("evaluate")
def evaluate_cmd(
    policy: str = typer.Option(
        ..., "--policy", help="Policy file saved by `commgym train`, or static:<preset>."
    ),
    baselines: str | None = typer.Option(
        None,
        "--baselines",
        help="Comma-separated agents, e.g. static:ddp-default,static:fp16-dense,bayesopt.",
    ),
    episodes: int | None = typer.Option(
        None, "--episodes", min=1, help="Evaluation seeds per agent."
    ),
    config: str | None = typer.Option(None, "--config", help="YAML scenario file or shipped name."),
    workload: str | None = typer.Option(None, "--workload"),
    world_size: int | None = typer.Option(None, "--world-size", min=1),
    time_budget_s: float | None = typer.Option(None, "--time-budget-s"),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri"),
    output_dir: str | None = typer.Option(None, "--output-dir"),
) -> None:
    """Compare a saved policy with baselines over the same seeds (mean and 95% interval)."""
    from commgym.experiments.config import load_run_config
    from commgym.experiments.train import evaluate

    try:
        cfg = load_run_config(
            config or "default",
            _overrides(
                baselines=baselines,
                episodes=episodes,
                tracking_uri=tracking_uri,
                output_dir=output_dir,
                env__workload=workload,
                env__world_size=world_size,
                env__time_budget_s=time_budget_s,
            ),
        )
    except (ValueError, FileNotFoundError) as err:
        _fail(err)
    try:
        evaluate(cfg, policy)
    except (ValueError, FileNotFoundError) as err:
        _fail(err)


@app.command("ui")
def ui_cmd(
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="Store to browse."),
    port: int = typer.Option(5000, "--port", help="Port on 127.0.0.1."),
) -> None:
    """Start the MLflow UI on 127.0.0.1 against the store the other commands use."""
    import subprocess
    import sys

    from commgym.experiments.tracking import default_tracking_uri

    uri = tracking_uri or default_tracking_uri()
    typer.echo(f"MLflow UI for {uri} on http://127.0.0.1:{port} (Ctrl-C to stop)")
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    raise typer.Exit(subprocess.call(cmd))


@app.command("replay")
def replay_cmd(
    policy: str = typer.Option(
        ..., "--policy", help="Policy file saved by `commgym train`, or static:<preset>."
    ),
    workload: str = typer.Option("mlp-digits", "--workload", help="Workload name."),
    world_size: int = typer.Option(2, "--world-size", min=1, help="Number of ranks."),
    network: str | None = typer.Option(
        None, "--network", help="Emulated network spec/profile (needs CAP_NET_ADMIN)."
    ),
    steps: int | None = typer.Option(
        None, "--steps", min=1, help="Cap on training iterations per run."
    ),
    time_budget_s: float = typer.Option(
        30.0, "--time-budget-s", help="Training seconds per run (truncates)."
    ),
    target_loss: float | None = typer.Option(
        None, "--target-loss", help="Held-out loss that ends a run (time-to-target)."
    ),
    steps_per_decision: int = typer.Option(
        10, "--steps-per-decision", min=1, help="Iterations per decision (as in training)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed shared by every agent's run."),
    baselines: str = typer.Option(
        "static:ddp-default,static:fp16-dense", "--baselines", help="Comma-separated agents."
    ),
) -> None:
    """Full training run with a saved policy and with the static baselines, side by side.

    Loading an SB3 policy file (a pickle) from an untrusted source can execute code.
    """
    from commgym.collectives import CommgymError
    from commgym.experiments.replay import replay

    try:
        replay(
            policy,
            workload=workload,
            world_size=world_size,
            network=network,
            steps=steps,
            time_budget_s=time_budget_s,
            target_loss=target_loss,
            steps_per_decision=steps_per_decision,
            seed=seed,
            baselines=[b.strip() for b in baselines.split(",") if b.strip()],
        )
    except (ValueError, FileNotFoundError, RuntimeError, CommgymError) as err:
        _fail(err)


@bench_app.command("collectives")
def bench_collectives_cmd(
    world_size: int = typer.Option(2, "--world-size", min=2, help="Number of gloo ranks."),
    sizes_kb: str = typer.Option("4,64,512,4096", "--sizes-kb", help="Comma-separated KiB."),
    repeats: int = typer.Option(5, "--repeats", min=1, help="Timed calls per size (median)."),
    json_path: str | None = typer.Option(
        None, "--json", help="Write the samples here (input of `commgym fit-surrogate`)."
    ),
) -> None:
    """Time all-reduce / all-gather on real ranks and fit the alpha-beta prior."""
    from commgym.experiments.bench_collectives import run_collectives_benchmark

    try:
        run_collectives_benchmark(
            world_size, [float(s) for s in sizes_kb.split(",") if s.strip()], repeats, json_path
        )
    except (ValueError, RuntimeError) as err:
        _fail(err)


@bench_app.command("surrogate")
def bench_surrogate_cmd(
    model: str = typer.Option(..., "--surrogate", help="Fitted surrogate model file."),
    steps: int = typer.Option(20000, "--steps", min=100, help="Env steps to time."),
) -> None:
    """Env steps per second of commgym/Surrogate-v0 on one core."""
    from commgym.experiments.bench_collectives import run_surrogate_benchmark

    try:
        run_surrogate_benchmark(model, steps)
    except (ValueError, FileNotFoundError) as err:
        _fail(err)


@app.command("collect")
def collect_cmd(
    config: str | None = typer.Option(
        None, "--config", help="Scenario whose env section is recorded (default: default)."
    ),
    workload: str | None = typer.Option(None, "--workload", help="Workload name."),
    world_size: int | None = typer.Option(None, "--world-size", min=1, help="Number of ranks."),
    network: str | None = typer.Option(None, "--network", help="Emulated network spec."),
    decisions: int = typer.Option(200, "--decisions", min=1, help="Real decisions to record."),
    policy: str = typer.Option(
        "sticky", "--policy", help="Exploration policy: sticky, random, grid."
    ),
    steps_per_decision: int | None = typer.Option(None, "--steps-per-decision", min=1),
    time_budget_s: float | None = typer.Option(None, "--time-budget-s"),
    seed: int = typer.Option(0, "--seed"),
    out: str = typer.Option("commgym-out/transitions.csv", "--out", help="CSV or .parquet."),
    bench: bool = typer.Option(True, "--bench/--no-bench", help="Also time collectives."),
    fit: str | None = typer.Option(None, "--fit", help="Also fit a surrogate, save it here."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri"),
) -> None:
    """Record real decisions of a scenario (the surrogate's data), logged to MLflow."""
    from commgym.experiments.collect import collect, fit_surrogate
    from commgym.experiments.config import load_run_config

    try:
        cfg = load_run_config(
            config or "default",
            _overrides(
                env__workload=workload,
                env__world_size=world_size,
                env__network=network,
                env__steps_per_decision=steps_per_decision,
                env__time_budget_s=time_budget_s,
            ),
        )
        res = collect(
            env_kwargs=cfg.env, decisions=decisions, policy=policy, seed=seed, out=out,
            bench=bench, tracking_uri=tracking_uri,
        )  # fmt: skip
    except (ValueError, RuntimeError, FileNotFoundError) as err:
        _fail(err)
    typer.echo(f"{res['decisions']} decisions in {res['seconds']:.1f} s -> {res['path']}")
    if fit:
        fit_surrogate([res["path"]], fit, bench=res["bench_path"], menu=cfg.env.get("action_menu"))
        typer.echo(f"surrogate saved to {fit}")


@app.command("fit-surrogate")
def fit_surrogate_cmd(
    data: str = typer.Option(..., "--data", help="Comma-separated transition files (CSV/Parquet)."),
    out: str = typer.Option("commgym-out/surrogate.joblib", "--out", help="Model file."),
    bench: str | None = typer.Option(None, "--bench", help="Samples JSON of bench collectives."),
    holdout: str | None = typer.Option(None, "--holdout", help="Held-out transitions (MAPE)."),
    config: str | None = typer.Option(
        None, "--config", help="Scenario the data was collected with (its action menu)."
    ),
) -> None:
    """Fit the surrogate (alpha-beta prior + gradient boosting) on recorded transitions."""
    from commgym.env.surrogate import read_transitions, step_time_mape, step_time_noise_floor
    from commgym.experiments.collect import fit_surrogate
    from commgym.experiments.config import load_run_config

    try:
        menu = load_run_config(config or "default").env.get("action_menu")
        files = [d.strip() for d in data.split(",") if d.strip()]
        model = fit_surrogate(files, out, bench=bench, menu=menu)
    except (ValueError, FileNotFoundError) as err:
        _fail(err)
    spread = ", ".join(f"{k} {v:.3f}" for k, v in model.residual_std.items())
    typer.echo(f"surrogate saved to {out}\nout-of-fold residual std: {spread}")
    if holdout:
        held = read_transitions(holdout)
        typer.echo(
            f"held-out step-time MAPE: {step_time_mape(model, held):.1f}% (noise floor: "
            f"{step_time_noise_floor(held):.1f}%, the held-out set's own per-configuration "
            "weighted medians)"
        )


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
