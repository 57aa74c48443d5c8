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
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    except WorkerFailed as exc:  # already printed with the ranks' output
        raise typer.Exit(code=1) from exc


@bench_app.command("kernels")
def bench_kernels(
    sizes_mb: str = typer.Option(
        "1,16,64,256", "--sizes-mb", help="Comma-separated buffer sizes in MiB."
    ),
    repeats: int = typer.Option(10, "--repeats", min=1, help="Timed repetitions per measurement."),
    device: str = typer.Option(
        "auto", "--device", help="'auto' (cuda if available), 'cuda' or 'cpu'."
    ),
) -> None:
    """Throughput of each compression kernel next to a device-to-device copy."""
    from commgym.experiments.bench_kernels import run_kernel_benchmark

    run_kernel_benchmark(
        sizes_mb=[float(s) for s in sizes_mb.split(",") if s.strip()],
        repeats=repeats,
        device=device,
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


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
