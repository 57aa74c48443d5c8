"""The ``commgym`` command line (typer).

``train``, ``evaluate``, ``replay``, ``collect``, ``fit-surrogate``, ``ui``, ``netem
cleanup`` and the ``bench`` group. Conventions every command keeps:

* bad input (an unknown name, a missing or garbage policy file, an output folder that
  cannot be written, an unreachable tracking server) is one ``error: ...`` line on
  stderr and exit status 2, before any rank, run, store or output folder is created;
* SIGTERM and SIGHUP are handled like Ctrl-C: the same cleanup runs (ranks killed,
  emulated network removed, the MLflow run marked ``KILLED``) and the exit status is
  ``128 + signal``;
* option help that lists names (agents, workloads, shipped scenarios) is generated
  from the registries when help is shown;
* options of config fields are generated, not written here: ``CLI_FIELDS`` in
  :mod:`commgym.experiments.config` holds each field's flag, help and bound, the type is
  the field's annotation (:mod:`commgym.experiments.cli_options`). ``train`` takes every
  field of the table; ``evaluate``, ``replay`` and ``collect`` name theirs. The command
  gets the values given as ``overrides`` and resolves one ``RunConfig``; the env runs
  from its ``env_config``.

A command in another module reuses the env options (``ENV_OPTIONS``: ``--workload``,
``--world-size``, ``--network``, ``--network-strict/--drop-impairments``,
``--steps-per-decision``, ``--time-budget-s``) like this::

    from commgym.experiments.cli import app
    from commgym.experiments.cli_options import CONFIG_HELP, ENV_OPTIONS, config_command

    @config_command(app, "leaderboard", *ENV_OPTIONS, "seed")
    def leaderboard_cmd(
        config: str | None = typer.Option(None, "--config", help=CONFIG_HELP),
        *,
        overrides: dict[str, Any],
    ) -> None:
        cfg = load_run_config(config or "default", overrides)  # cfg.env_config

and this module imports that one at its end (``import commgym.experiments.leaderboard``),
so the command is registered whenever ``app`` is.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import typer

from commgym.experiments.cli_options import (
    CONFIG_HELP,
    ENV_OPTIONS,
    RegistryHelpCommand,
    config_command,
)

__all__ = ["COLLECT_OPTIONS", "EVALUATE_OPTIONS", "REPLAY_OPTIONS", "RegistryHelpCommand", "app"]


app = typer.Typer(
    name="commgym",
    help="Learned communication scheduling for data-parallel training.",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = typer.Typer(help="Benchmarks (measured side by side in one run).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("sync", cls=RegistryHelpCommand)
def bench_sync(
    world_size: int = typer.Option(2, "--world-size", min=2, help="Number of gloo ranks."),
    steps: int = typer.Option(30, "--steps", min=3, help="Measured steps per configuration."),
    warmup: int = typer.Option(5, "--warmup", min=0, help="Unmeasured warm-up steps."),
    bucket_mb: float = typer.Option(
        25.0, "--bucket-mb", help="Bucket size in MiB for both DDP and commgym."
    ),
    model: str = typer.Option(
        "mid-mlp",
        "--model",
        help="Benchmark model, a workload: {workloads} (mid-mlp: 1.13M params; wide-mlp: 21M).",
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
    from commgym.experiments.bench.sync import run_sync_benchmark

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
    from commgym.experiments.bench.kernels import run_kernel_benchmark

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
    from commgym.experiments.bench.env import run_env_benchmark

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
    from commgym.experiments.bench.netem import run_netem_benchmark

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


def _fail(err: Exception | str) -> None:
    """One ``error:`` line on stderr, exit status 2."""
    text = " ".join(str(err).split())  # one line, whatever the exception's text holds
    typer.secho(f"error: {text}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _check_writable_dir(path: str | os.PathLike[str], what: str) -> None:
    """Fail unless ``path`` is, or can be created as, a writable folder (leaves nothing).

    Raises:
        ValueError: a component is a file, or the nearest existing folder is not writable.
    """
    p = Path(path).expanduser().absolute()
    probe = p
    try:
        while not probe.exists():
            probe = probe.parent
    except OSError as err:  # an ancestor cannot be searched
        raise ValueError(f"{what} {str(path)!r} is not writable ({err.strerror})") from None
    if not probe.is_dir():
        raise ValueError(f"{what} {str(path)!r} cannot be created: {probe} is a file, not a folder")
    # a real probe, created and removed at once: permission bits say nothing for root,
    # and pseudo file systems (/proc) refuse folders whatever they say
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".commgym-probe-", dir=probe))
    except OSError as err:
        raise ValueError(
            f"{what} {str(path)!r} is not writable ({probe}: {err.strerror or err})"
        ) from None


def _check_tracking(uri: str | None) -> None:
    """Fail when the tracking store named by ``uri`` (or the default) cannot be used.

    An ``http(s)://`` server must answer its health probe within 3 s; a SQLite store's
    folder must be writable. Nothing is created. (Library users of ``Tracker`` keep its
    degrade-to-no-op behaviour; on the command line the user asked for that store.)
    """
    from commgym.experiments.tracking.store import (
        default_tracking_uri,
        is_remote,
        probe_server,
    )

    uri = uri or default_tracking_uri()
    if is_remote(uri):
        err = probe_server(uri, 3.0)
        if err is not None:
            raise ValueError(
                f"MLflow tracking server {uri} is unreachable ({err}); start it, or omit "
                "--tracking-uri / MLFLOW_TRACKING_URI to log to ./mlflow.db"
            )
    elif uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :].split("?", 1)[0])
        if db.exists() and not os.access(db, os.W_OK):
            raise ValueError(f"MLflow store {db} is not writable")
        _check_writable_dir(db.parent, "folder of the MLflow store")


def _check_policy_file(policy: str) -> None:
    """Fail unless ``policy`` is a commgym policy zip (reads only its JSON member)."""
    from commgym.agents.base import read_policy_json

    read_policy_json(policy)


def _check_outputs(cfg: Any) -> None:
    """Validate where a train/evaluate run will write, before it writes anything."""
    _check_writable_dir(cfg.output_dir, "--output-dir")
    _check_tracking(cfg.tracking_uri)


#: Options ``commgym evaluate`` takes from the config (the others are its own).
EVALUATE_OPTIONS: tuple[str, ...] = (
    "baselines", "episodes", *ENV_OPTIONS, "tuning_decisions", "tracking_uri", "output_dir",
)  # fmt: skip


@config_command(app, "train")  # every field of CLI_FIELDS
def train_cmd(
    config: str | None = typer.Option(None, "--config", help=CONFIG_HELP),
    *,
    overrides: dict[str, Any],
) -> None:
    """Train an agent on real all-reduce runs, save the policy, compare it with the baselines."""
    from commgym.experiments.config import load_run_config

    try:
        cfg = load_run_config(config or "default", overrides)
        _check_outputs(cfg)
    except (ValueError, FileNotFoundError) as err:
        _fail(err)
    from commgym.experiments.train import train

    try:
        train(cfg)
    except (ValueError, FileNotFoundError) as err:
        _fail(err)


@config_command(app, "evaluate", *EVALUATE_OPTIONS)
def evaluate_cmd(
    policy: str = typer.Option(
        ..., "--policy", help="Policy file saved by `commgym train`, or static:<preset>."
    ),
    config: str | None = typer.Option(None, "--config", help=CONFIG_HELP),
    *,
    overrides: dict[str, Any],
) -> None:
    """Compare a saved policy with baselines over the same seeds (mean and 95% interval)."""
    from commgym.experiments.config import load_run_config

    try:
        cfg = load_run_config(config or "default", overrides)
        _check_policy_file(policy)
        _check_outputs(cfg)
    except (ValueError, FileNotFoundError) as err:
        _fail(err)
    from commgym.experiments.evaluation import evaluate

    try:
        evaluate(cfg, policy)
    except (ValueError, FileNotFoundError) as err:
        _fail(err)


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _stop_group(proc: Any, timeout_s: float = 10.0) -> None:
    """SIGTERM the server's process group (uvicorn and its workers), SIGKILL if it lingers."""
    import subprocess

    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue


@app.command("ui")
def ui_cmd(
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="Store to browse."),
    port: int = typer.Option(5000, "--port", help="Port on 127.0.0.1."),
    workers: int = typer.Option(
        1,
        "--workers",
        min=1,
        help="Server worker processes. More than one puts uvicorn's supervisor in charge, "
        "which restarts workers that take over 5 s to answer: on a busy machine they never do.",
    ),
) -> None:
    """Start the MLflow UI on 127.0.0.1 against the store the other commands use.

    Says when the server answers (its start takes from seconds to minutes on a busy
    machine), keeps request logging off the terminal, and stops the whole server on
    Ctrl-C, SIGTERM or SIGHUP.
    """
    import subprocess
    import time
    import urllib.request

    from commgym.experiments.progress import console, phase
    from commgym.experiments.tracking import default_tracking_uri

    uri = tracking_uri or default_tracking_uri()
    if not _port_free(port):
        _fail(f"port {port} on 127.0.0.1 is in use (another MLflow UI?); choose one with --port")
    cmd = [
        sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
        "--uvicorn-opts", "--no-access-log",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    # own process group: stopping it reaches uvicorn's workers, not only the launcher
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        with phase(f"starting the MLflow UI for {uri}"):
            while proc.poll() is None:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    time.sleep(0.5)
        if proc.poll() is not None:
            _fail(f"the MLflow UI exited with status {proc.returncode} before answering")
        console.print(f"MLflow UI ready: [bold]{url}[/bold]  (Ctrl-C to stop)")
        rc = proc.wait()
    finally:
        _stop_group(proc)
    raise typer.Exit(rc)


#: What ``commgym replay --policy`` accepts, named in its errors.
_REPLAY_POLICY_FORMS = (
    "a policy file saved by `commgym train` (e.g. commgym-out/policy.zip) or a static preset "
    "(static:ddp-default, static:fp16-dense, static:<menu entry> such as static:int8/4MB/H1)"
)


#: Options ``commgym replay`` takes from the config (it starts from the dataclass defaults).
REPLAY_OPTIONS: tuple[str, ...] = (*ENV_OPTIONS, "env.target_loss", "seed", "baselines")


@config_command(app, "replay", *REPLAY_OPTIONS, defaults_from=None)
def replay_cmd(
    policy: str = typer.Option(
        ..., "--policy", help="Policy file saved by `commgym train`, or static:<preset>."
    ),
    steps: int | None = typer.Option(
        None, "--steps", min=1, help="Cap on training iterations per run."
    ),
    *,
    overrides: dict[str, Any],
) -> None:
    """Full training run with a saved policy and with the static baselines, side by side.

    Loading an SB3 policy file (a pickle) from an untrusted source can execute code.
    """
    from commgym.collectives import CommgymError
    from commgym.experiments.replay import replay, replay_config

    if not policy.startswith("static:"):
        try:
            _check_policy_file(policy)
        except (ValueError, FileNotFoundError) as err:
            _fail(f"{err}; --policy takes {_REPLAY_POLICY_FORMS}")
    try:
        replay(policy, replay_config(overrides, steps=steps))
    except FileNotFoundError as err:
        _fail(f"{err}; --policy takes {_REPLAY_POLICY_FORMS}")
    except (ValueError, RuntimeError, CommgymError) as err:
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
    from commgym.experiments.bench.collectives import run_collectives_benchmark

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
    from commgym.experiments.bench.surrogate import run_surrogate_benchmark

    try:
        run_surrogate_benchmark(model, steps)
    except (ValueError, FileNotFoundError) as err:
        _fail(err)


@bench_app.command("surrogate-holdout")
def bench_surrogate_holdout_cmd(
    data: str = typer.Option(..., "--data", help="Comma-separated transition files."),
    bench: str | None = typer.Option(None, "--bench", help="The collection's .bench.json."),
    config: str | None = typer.Option(
        None, "--config", help="Scenario the data was collected with (its action menu)."
    ),
    holdout_rate: list[float] | None = typer.Option(  # noqa: B008 - typer's form
        None, "--holdout-rate", help="Link rate held out entirely, Gbit/s (repeatable)."
    ),
    holdout_every: int = typer.Option(
        0, "--holdout-every", min=0, help="Hold out every this many episodes (0: none)."
    ),
    holdout_configs: float = typer.Option(
        0.0, "--holdout-configs", help="Fraction of configurations held out, in [0, 1)."
    ),
    holdout_data: str = typer.Option(
        "", "--holdout-data", help="Comma-separated transition files of other runs."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the held-out configurations."),
    steps: int = typer.Option(20000, "--steps", min=100, help="Env steps to time."),
) -> None:
    """Held-out accuracy of the surrogate (rates, seeds, configurations) and its speed."""
    from commgym.experiments.bench.surrogate_holdout import run_surrogate_holdout_benchmark
    from commgym.experiments.config import load_run_config

    try:
        menu = load_run_config(config or "default").env.get("action_menu")
        run_surrogate_holdout_benchmark(
            [d for d in data.split(",") if d], bench=bench, menu=menu,
            holdout_rates_gbps=holdout_rate or [], holdout_every=holdout_every,
            holdout_configs_frac=holdout_configs,
            holdout_data=[d for d in holdout_data.split(",") if d], seed=seed, steps=steps,
        )  # fmt: skip
    except (ValueError, FileNotFoundError) as err:
        _fail(err)


#: Options ``commgym collect`` takes from the config (the others are its own).
COLLECT_OPTIONS: tuple[str, ...] = (*ENV_OPTIONS, "tracking_uri")


@config_command(app, "collect", *COLLECT_OPTIONS)
def collect_cmd(
    config: str | None = typer.Option(
        None, "--config", help="Scenario whose env section is recorded (default: default)."
    ),
    decisions: int = typer.Option(200, "--decisions", min=1, help="Real decisions to record."),
    policy: str = typer.Option(
        "sticky", "--policy", help="Exploration policy: sticky, random, grid."
    ),
    seed: int = typer.Option(
        0, "--seed", help="Seed of the first episode and of the exploration policy."
    ),
    out: str = typer.Option("commgym-out/transitions.csv", "--out", help="CSV or .parquet."),
    bench: bool = typer.Option(True, "--bench/--no-bench", help="Also time collectives."),
    fit: str | None = typer.Option(None, "--fit", help="Also fit a surrogate, save it here."),
    *,
    overrides: dict[str, Any],
) -> None:
    """Record real decisions of a scenario (the surrogate's data), logged to MLflow."""
    from commgym.experiments.collect import collect, fit_surrogate
    from commgym.experiments.config import load_run_config

    try:
        cfg = load_run_config(config or "default", {**overrides, "env.seed": seed})
        res = collect(
            cfg.env_config, decisions=decisions, policy=policy, seed=seed, out=out,
            bench=bench, tracking_uri=cfg.tracking_uri,
        )  # fmt: skip
    except (ValueError, RuntimeError, FileNotFoundError) as err:
        _fail(err)
    typer.echo(f"{res['decisions']} decisions in {res['seconds']:.1f} s -> {res['path']}")
    if fit:
        fit_surrogate([res["path"]], fit, bench=res["bench_path"], menu=cfg.env_config.menu)
        typer.echo(f"surrogate saved to {fit}")


@app.command("fit-surrogate")
def fit_surrogate_cmd(
    data: str = typer.Option(..., "--data", help="Comma-separated transition files (CSV/Parquet)."),
    out: str = typer.Option("commgym-out/surrogate.joblib", "--out", help="Model file."),
    bench: str | None = typer.Option(None, "--bench", help="Samples JSON of bench collectives."),
    holdout: str | None = typer.Option(
        None, "--holdout", help="Held-out transitions (MAPE, p90 error, Kendall tau per link rate)."
    ),
    config: str | None = typer.Option(
        None, "--config", help="Scenario the data was collected with (its action menu)."
    ),
) -> None:
    """Fit the surrogate (alpha-beta prior + gradient boosting) on recorded transitions."""
    from commgym.env.surrogate import format_holdout_report, holdout_report, read_transitions
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
        typer.echo(format_holdout_report(holdout_report(model, read_transitions(holdout))))


#: Config options ``commgym leaderboard`` applies to every scenario it runs.
LEADERBOARD_OPTIONS: tuple[str, ...] = (
    "timesteps",
    "surrogate_decisions",
    "fine_tune_episodes",
    "tuning_decisions",
    "env.time_budget_s",
    "env.max_decisions",
    "env.network_strict",
    "tracking_uri",
)


@config_command(app, "leaderboard", *LEADERBOARD_OPTIONS)
def leaderboard_cmd(
    scenarios: str = typer.Option(
        "default,slow-link,changing-link,mixed-links",
        "--scenarios",
        help="Comma-separated scenario files or shipped names: {configs}.",
    ),
    agents: str = typer.Option(
        "ppo,autotune,oracle-static,static:ddp-default,static:fp16-dense,bayesopt,bandit,"
        "accordion,adacomm",
        "--agents",
        help="Comma-separated agents: {agents}; SB3 agents (ppo, a2c, dqn) are trained first "
        "by each scenario's recipe unless --policy-dir holds their policy.",
    ),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Evaluation seeds per agent."),
    policy_dir: str | None = typer.Option(
        None,
        "--policy-dir",
        help="Folder with <scenario>/<agent>/policy.zip policies to load instead of "
        "training: the --output-dir of an earlier leaderboard.",
    ),
    output_dir: str = typer.Option(
        "commgym-out/leaderboard", "--output-dir", help="Folder for tables, figures, episodes."
    ),
    *,
    overrides: dict[str, Any],
) -> None:
    """Scenario x agent x seed on real ranks: time to target against what users would run.

    The given config options apply to every scenario.
    """
    from commgym.experiments.leaderboard import run_leaderboard

    overrides = dict(overrides)
    tracking_uri = overrides.pop("tracking_uri", None)
    try:
        _check_writable_dir(output_dir, "--output-dir")
        _check_tracking(tracking_uri)
        if policy_dir is not None and not Path(policy_dir).is_dir():
            raise ValueError(f"--policy-dir {policy_dir!r} is not a folder")
        run_leaderboard(
            [x.strip() for x in scenarios.split(",") if x.strip()],
            [x.strip() for x in agents.split(",") if x.strip()],
            seeds,
            output_dir=output_dir,
            tracking_uri=tracking_uri,
            policy_dir=policy_dir,
            overrides=overrides,
        )
    except (ValueError, FileNotFoundError, PermissionError) as err:
        _fail(err)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread so that Ctrl-C's cleanup runs.

    A subclass of ``KeyboardInterrupt`` on purpose: every ``finally`` / ``with`` that
    handles Ctrl-C (rank teardown, network removal, MLflow run marked ``KILLED``, the UI
    server stopped) handles it the same way, and ``except Exception`` does not swallow it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_received: list[int] = []


def _on_signal(signum: int, frame: Any) -> None:
    if _received:  # cleanup is running: a second signal must not cut it short
        return
    _received.append(signum)
    raise Terminated(signum)


def install_signal_handlers() -> None:
    """Route SIGTERM and SIGHUP through Ctrl-C's cleanup (main thread only)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)


def main() -> None:
    """Console-script entry point.

    Exit status: 0 success, 1 failure, 2 bad input, 130 Ctrl-C, ``128 + n`` after
    signal ``n`` (143 for SIGTERM).
    """
    install_signal_handlers()
    try:
        app()
    except SystemExit:
        if _received:
            name = signal.Signals(_received[0]).name
            print(
                f"commgym: stopped by {name}, cleaned up as on Ctrl-C",
                file=sys.stderr,
            )
            raise SystemExit(128 + _received[0]) from None
        raise


if __name__ == "__main__":
    main()
