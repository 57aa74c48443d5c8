"""The ``commgym bench`` command group: one command per benchmark module of this package.

Every option comes from a table of :class:`~commgym.experiments.config.CliField` entries
(:func:`~commgym.experiments.cli_options.own_options`): the env knobs are the config's own
entries (``CLI_FIELDS``), the rest each benchmark's. The benchmark modules are imported
when a command runs, so ``commgym --help`` loads none of them.
"""

from __future__ import annotations

import typer

from commgym.experiments.cli_options import RegistryHelpCommand, comma_list, fail, own_options
from commgym.experiments.config import CLI_FIELDS, CliField
from commgym.experiments.records import record_option

__all__ = ["bench_app"]

bench_app = typer.Typer(help="Benchmarks (measured side by side in one run).", no_args_is_help=True)

_JSON = CliField("Also write results as JSON here.", flag="--json")
_REPEATS = CliField("Timed repetitions per measurement.", min=1)
_SURROGATE_STEPS = CliField("Env steps to time.", min=100)

#: Options of ``commgym bench sync`` (types and defaults: :func:`bench_sync`'s signature).
SYNC_OPTIONS = {
    "world_size": CliField("Number of gloo ranks.", min=2),
    "steps": CliField("Measured steps per configuration.", min=3),
    "warmup": CliField("Unmeasured warm-up steps.", min=0),
    "bucket_mb": CliField("Bucket size in MiB for both DDP and commgym."),
    "model": CliField(
        "Benchmark model, a workload: {workloads} (mid-mlp: 1.13M params; wide-mlp: 21M)."
    ),
    "compressors": CliField("Comma-separated compression specs to measure besides DDP."),
    "rounds": CliField(
        "Interleaved repetitions (ratios use all; >= 7 give a 95 % interval).", min=1
    ),
    "json_path": _JSON,
    "timeout_s": CliField("Kill the ranks after this many seconds (default: from steps)."),
    "network": CLI_FIELDS["env.network"],
    "network_strict": CLI_FIELDS["env.network_strict"],
    "sync_period": CliField("Local-SGD period of ours (reports time per round).", min=1),
}


@bench_app.command("sync", cls=RegistryHelpCommand)
@record_option()
@own_options(SYNC_OPTIONS)
def bench_sync(
    world_size: int = 2,
    steps: int = 30,
    warmup: int = 5,
    bucket_mb: float = 25.0,
    model: str = "mid-mlp",
    compressors: str = "none,fp16,bf16,int8,int4,int2,topk:0.01,randomk:0.01,powersgd:4",
    rounds: int = 7,
    json_path: str | None = None,
    timeout_s: float | None = None,
    network: str | None = None,
    network_strict: bool = True,
    sync_period: int = 1,
) -> None:
    """Torch DDP vs GradientSynchronizer (same model, buckets, gloo ranks) and every compressor."""
    from commgym.collectives import WorkerFailed
    from commgym.env.net import NetworkPlan
    from commgym.experiments.bench.sync import run_sync_benchmark
    from commgym.experiments.session import check_network

    try:
        check_network(NetworkPlan.parse(network), network_strict)
    except ValueError as exc:
        fail(exc)
    try:
        run_sync_benchmark(
            world_size=world_size,
            steps=steps,
            warmup=warmup,
            bucket_mb=bucket_mb,
            model=model,
            compressors=comma_list(compressors),
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


#: Options of ``commgym bench kernels``.
KERNELS_OPTIONS = {
    "sizes_mb": CliField(
        "Comma-separated buffer sizes in MiB ('auto': 4.5,16 on CPU; 16,64,256 on CUDA)."
    ),
    "repeats": _REPEATS,
    "device": CliField("'auto' (cuda if available), 'cuda' or 'cpu'."),
    "threads": CliField("torch intra-op threads on CPU.", min=1),
    "compare_compile": CliField(
        "Also time torch.compile of the int8 quantiser (CPU).", flag="--compare-compile"
    ),
}


@bench_app.command("kernels")
@record_option()
@own_options(KERNELS_OPTIONS)
def bench_kernels(
    sizes_mb: str = "auto",
    repeats: int = 10,
    device: str = "auto",
    threads: int = 1,
    compare_compile: bool = False,
) -> None:
    """Time of each compression kernel next to a copy of the same buffer."""
    from commgym.experiments.bench.kernels import run_kernel_benchmark

    run_kernel_benchmark(
        sizes_mb=None if sizes_mb == "auto" else comma_list(sizes_mb, float),
        repeats=repeats,
        device=device,
        threads=threads,
        compare_compile=compare_compile,
    )


#: Options of ``commgym bench env`` (the env knobs are the config's own entries).
ENV_BENCH_OPTIONS = {
    "workload": CLI_FIELDS["env.workload"],
    "world_size": CLI_FIELDS["env.world_size"],
    "steps_per_decision": CLI_FIELDS["env.steps_per_decision"],
    "decisions": CliField("Env steps (the first 3 are warm-up).", min=4),
    "actions": CliField("'cycle' (every menu entry in turn) or 'fixed' (DDP default)."),
    "json_path": _JSON,
    "network": CLI_FIELDS["env.network"],
    "network_strict": CLI_FIELDS["env.network_strict"],
}


@bench_app.command("env", cls=RegistryHelpCommand)
@record_option()
@own_options(ENV_BENCH_OPTIONS)
def bench_env(
    workload: str = "mlp-digits",
    world_size: int = 2,
    steps_per_decision: int = 10,
    decisions: int = 60,
    actions: str = "cycle",
    json_path: str | None = None,
    network: str | None = None,
    network_strict: bool = True,
) -> None:
    """Median env-step wall time vs the ranks' own training time (overhead ratio)."""
    from commgym.collectives import WorkerFailed
    from commgym.env.net import NetworkPlan
    from commgym.experiments.bench.env import run_env_benchmark
    from commgym.experiments.session import check_network

    try:
        check_network(NetworkPlan.parse(network), network_strict)
    except ValueError as exc:
        fail(exc)
    try:
        run_env_benchmark(
            workload=workload,
            world_size=world_size,
            steps_per_decision=steps_per_decision,
            decisions=decisions,
            actions=actions,
            json_path=json_path,
            network=network,
            network_strict=network_strict,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    except (PermissionError, RuntimeError) as exc:  # network emulation unavailable here
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    except WorkerFailed as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from exc


#: Options of ``commgym bench netem``.
NETEM_OPTIONS = {
    "profiles": CliField("Profiles or spec strings."),
    "world_sizes": CliField("Comma-separated rank counts."),
    "sizes_mb": CliField("Comma-separated buffer sizes in MiB."),
    "repeats": _REPEATS,
    "json_path": CliField("Also write the rows as JSON.", flag="--json"),
}


@bench_app.command("netem")
@record_option()
@own_options(NETEM_OPTIONS)
def bench_netem(
    profiles: str = "datacenter-25g,cloud-10g,ethernet-1g,wan-100m",
    world_sizes: str = "2,4",
    sizes_mb: str = "1,4,16,64",
    repeats: int = 3,
    json_path: str | None = None,
) -> None:
    """All-reduce bus bandwidth per network profile and world size, vs the configured rate."""
    from commgym.experiments.bench.netem import run_netem_benchmark

    try:
        run_netem_benchmark(
            comma_list(profiles),
            comma_list(world_sizes, int),
            comma_list(sizes_mb, float),
            repeats=repeats,
            json_path=json_path,
        )
    except (RuntimeError, ValueError, PermissionError) as err:
        fail(err)


#: Options of ``commgym bench collectives``.
COLLECTIVES_OPTIONS = {
    "world_size": CliField("Number of gloo ranks.", min=2),
    "sizes_kb": CliField("Comma-separated KiB."),
    "repeats": CliField("Timed calls per size (median).", min=1),
    "json_path": CliField(
        "Write the samples here (input of `commgym fit-surrogate`).", flag="--json"
    ),
}


@bench_app.command("collectives")
@record_option()
@own_options(COLLECTIVES_OPTIONS)
def bench_collectives_cmd(
    world_size: int = 2,
    sizes_kb: str = "4,64,512,4096",
    repeats: int = 5,
    json_path: str | None = None,
) -> None:
    """Time all-reduce / all-gather on real ranks and fit the alpha-beta prior."""
    from commgym.experiments.bench.collectives import run_collectives_benchmark

    try:
        run_collectives_benchmark(world_size, comma_list(sizes_kb, float), repeats, json_path)
    except (ValueError, RuntimeError) as err:
        fail(err)


#: Options of ``commgym bench surrogate``.
SURROGATE_OPTIONS = {
    "model": CliField("Fitted surrogate model file.", flag="--surrogate"),
    "steps": _SURROGATE_STEPS,
}


@bench_app.command("surrogate")
@record_option()
@own_options(SURROGATE_OPTIONS)
def bench_surrogate_cmd(model: str, steps: int = 20000) -> None:
    """Env steps per second of commgym/Surrogate-v1 on one core."""
    from commgym.experiments.bench.surrogate import run_surrogate_benchmark

    try:
        run_surrogate_benchmark(model, steps)
    except (ValueError, FileNotFoundError) as err:
        fail(err)


#: Options of ``commgym bench surrogate-holdout``.
HOLDOUT_OPTIONS = {
    "data": CliField("Comma-separated transition files (CSV/Parquet)."),
    "bench": CliField("The collection's .bench.json (alpha-beta prior samples)."),
    "config": CliField("Scenario the data was collected with (its action menu)."),
    "holdout_rate": CliField("Link rate held out entirely, Gbit/s (repeatable)."),
    "holdout_every": CliField("Hold out every this many episodes (0: none).", min=0),
    "holdout_configs": CliField("Fraction of configurations held out, in [0, 1)."),
    "holdout_data": CliField("Comma-separated transition files of other runs."),
    "seed": CliField("Seed of the held-out configurations."),
    "steps": _SURROGATE_STEPS,
}


@bench_app.command("surrogate-holdout")
@record_option()
@own_options(HOLDOUT_OPTIONS)
def bench_surrogate_holdout_cmd(
    data: str,
    bench: str | None = None,
    config: str | None = None,
    holdout_rate: list[float] | None = None,
    holdout_every: int = 0,
    holdout_configs: float = 0.0,
    holdout_data: str = "",
    seed: int = 0,
    steps: int = 20000,
) -> None:
    """Held-out accuracy of the surrogate (rates, seeds, configurations) and its speed."""
    from commgym.experiments.bench.surrogate_holdout import run_surrogate_holdout_benchmark
    from commgym.experiments.config import load_run_config

    try:
        menu = load_run_config(config or "default").env.get("action_menu")
        run_surrogate_holdout_benchmark(
            comma_list(data), bench=bench, menu=menu, holdout_rates_gbps=holdout_rate or [],
            holdout_every=holdout_every, holdout_configs_frac=holdout_configs,
            holdout_data=comma_list(holdout_data), seed=seed, steps=steps,
        )  # fmt: skip
    except (ValueError, FileNotFoundError) as err:
        fail(err)


#: Options of ``commgym bench executor``.
EXECUTOR_OPTIONS = {
    "config": CliField("Scenario: a YAML file or a shipped name ({configs})."),
    "episodes": CliField("Timed episodes per setting.", min=1),
    "actors": CliField("Comma-separated env actor counts to measure on Ray."),
    "agent": CliField("Agent of every episode (a deterministic one: alike across settings)."),
    "json_path": _JSON,
}


@bench_app.command("executor", cls=RegistryHelpCommand)
@record_option()
@own_options(EXECUTOR_OPTIONS)
def bench_executor_cmd(
    config: str = "default",
    episodes: int = 8,
    actors: str = "1,2",
    agent: str = "static:ddp-default",
    json_path: str | None = None,
) -> None:
    """Episodes per minute, local vs env actors on a local Ray instance; the driver's overhead.

    Needs the commgym[ray] extra.
    """
    from commgym.experiments.bench.executor import run_executor_benchmark

    try:
        counts = tuple(comma_list(actors, int))
        if not counts or min(counts) < 1:
            raise ValueError(f"--actors takes counts >= 1, got {actors!r}")
        run_executor_benchmark(config, episodes, counts, agent, json_path)
    except (ValueError, FileNotFoundError, ModuleNotFoundError) as err:
        fail(err)
