"""The ``commgym`` command line (typer).

``train``, ``evaluate``, ``replay``, ``collect``, ``fit-surrogate``, ``headroom-bound``,
``ui``, ``netem cleanup`` and the ``bench`` group. Conventions every command keeps:

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
  field of the table; ``evaluate``, ``replay``, ``collect`` and ``leaderboard`` name
  theirs. The command gets the values given as ``overrides`` and resolves one
  ``RunConfig``; the env runs from its ``env_config``;
* a command's own options (``--policy``, ``--steps``, ...) come from a table of the same
  ``CliField`` entries (:func:`~commgym.experiments.cli_options.own_options`), their type
  and default from the command's signature: no option is written out by hand. The
  ``bench`` group is :mod:`commgym.experiments.bench.commands`.

A command in another module reuses the env options (``ENV_OPTIONS``: ``--workload``,
``--world-size``, ``--network``, ``--network-strict/--drop-impairments``,
``--steps-per-decision``, ``--time-budget-s``) like this::

    from commgym.experiments.cli import app
    from commgym.experiments.cli_options import CONFIG_HELP, ENV_OPTIONS, config_command
    from commgym.experiments.cli_options import own_options
    from commgym.experiments.config import CliField

    @config_command(app, "my-command", *ENV_OPTIONS, "seed")
    @own_options({"config": CliField(CONFIG_HELP)})
    def my_command(config: str | None = None, *, overrides: dict[str, Any]) -> None:
        cfg = load_run_config(config or "default", overrides)  # cfg.env_config

and the module defining it is imported where ``app`` is run, so the command is registered.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import typer

from commgym.experiments.bench.commands import bench_app
from commgym.experiments.cli_checks import (
    check_outputs,
    check_policy,
    check_policy_file,
    check_tracking,
    check_writable_dir,
)
from commgym.experiments.cli_options import (
    CONFIG_HELP,
    ENV_OPTIONS,
    OneLineErrorGroup,
    RegistryHelpCommand,
    comma_list,
    config_command,
    fail,
    own_options,
)
from commgym.experiments.config import CliField
from commgym.experiments.records import record_option

__all__ = [
    "COLLECT_OPTIONS",
    "EVALUATE_OPTIONS",
    "EXECUTOR_OPTIONS",
    "REPLAY_OPTIONS",
    "RegistryHelpCommand",
    "app",
]


app = typer.Typer(
    cls=OneLineErrorGroup,
    name="commgym",
    help="Learned communication scheduling for data-parallel training.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(bench_app, name="bench")


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


results_app = typer.Typer(help="Recorded runs (folders written by --record).", no_args_is_help=True)
app.add_typer(results_app, name="results")


@results_app.command("index")
@own_options({"root": CliField("Records folder.", flag="--dir")})
def results_index(root: str = "experiments/results") -> None:
    """Write DIR/README.md: every record there, newest first, current or superseded."""
    from commgym.experiments.records import read_records, write_index

    if not Path(root).is_dir():
        fail(f"--dir {root!r} is not a folder")
    out = write_index(root)
    typer.echo(f"wrote {out} ({len(read_records(root))} records)")


#: Where a command's real episodes run (``--executor``, ``--ray-address``, ``--ray-envs``).
EXECUTOR_OPTIONS: tuple[str, ...] = ("executor", "ray_address", "ray_envs")

#: Options ``commgym evaluate`` takes from the config (the others are its own).
EVALUATE_OPTIONS: tuple[str, ...] = (
    "baselines", "episodes", "eval_seed", *ENV_OPTIONS, "env.probe_for_all",
    "tuning_decisions", "tracking_uri", "output_dir", *EXECUTOR_OPTIONS,
)  # fmt: skip


#: ``--config`` of the commands that start from a scenario.
_CONFIG = CliField(CONFIG_HELP)
#: ``--policy`` of ``evaluate`` and ``replay``.
_POLICY = CliField("Policy file saved by `commgym train`, or static:<preset>.")


def _output_dir(kwargs: dict[str, Any]) -> list[str]:
    """The folder ``--record`` keeps files of: ``--output-dir``, else the scenario's."""
    if "output_dir" in kwargs["overrides"]:
        return [kwargs["overrides"]["output_dir"]]
    from commgym.experiments.config import load_run_config

    try:
        return [load_run_config(kwargs.get("config") or "default").output_dir]
    except (ValueError, FileNotFoundError):
        return []


@config_command(app, "train")  # every field of CLI_FIELDS
@record_option(_output_dir)
@own_options({"config": _CONFIG})
def train_cmd(config: str | None = None, *, overrides: dict[str, Any]) -> None:
    """Train an agent on real all-reduce runs, save the policy, compare it with the baselines."""
    from commgym.experiments.config import load_run_config

    try:
        cfg = load_run_config(config or "default", overrides)
        check_outputs(cfg)
    except (ValueError, FileNotFoundError) as err:
        fail(err)
    from commgym.experiments.train import train

    try:
        train(cfg)
    except (ValueError, FileNotFoundError) as err:
        fail(err)


@config_command(app, "evaluate", *EVALUATE_OPTIONS)
@record_option(_output_dir)
@own_options({"policy": _POLICY, "config": _CONFIG})
def evaluate_cmd(policy: str, config: str | None = None, *, overrides: dict[str, Any]) -> None:
    """Compare a saved policy with baselines over the same seeds (mean and 95% interval)."""
    from commgym.experiments.config import load_run_config

    try:
        cfg = load_run_config(config or "default", overrides)
        check_policy(policy, cfg)
        check_outputs(cfg)
    except (ValueError, FileNotFoundError) as err:
        fail(err)
    from commgym.experiments.evaluation import evaluate

    try:
        evaluate(cfg, policy)
    except (ValueError, FileNotFoundError) as err:
        fail(err)


#: Options of ``commgym ui``.
UI_OPTIONS = {
    "tracking_uri": CliField("Store to browse."),
    "port": CliField("Port on 127.0.0.1."),
    "workers": CliField(
        "Server worker processes. More than one puts uvicorn's supervisor in charge, "
        "which restarts workers that take over 5 s to answer: on a busy machine they never do.",
        min=1,
    ),
}


@app.command("ui")
@own_options(UI_OPTIONS)
def ui_cmd(tracking_uri: str | None = None, port: int = 5000, workers: int = 1) -> None:
    """Start the MLflow UI on 127.0.0.1 against the store the other commands use.

    Says when the server answers (its start takes from seconds to minutes on a busy
    machine) and prints the URL of the latest experiment's runs in the model-training
    view; the server's own log lines go to a file (``mlflow-ui.log`` beside a SQLite
    store), not the terminal. Ctrl-C, SIGTERM or SIGHUP stop the whole server
    (:mod:`commgym.experiments.tracking.ui`).
    """
    from commgym.experiments.tracking import default_tracking_uri
    from commgym.experiments.tracking.ui import port_free, serve_ui, ui_log_path

    uri = tracking_uri or default_tracking_uri()
    if not port_free(port):
        fail(f"port {port} on 127.0.0.1 is in use (another MLflow UI?); choose one with --port")
    log_path = ui_log_path(uri, port)
    try:
        check_writable_dir(log_path.parent, "folder of the UI's log")
    except ValueError as err:
        fail(err)
    try:
        rc = serve_ui(uri, port, workers, log_path)
    except RuntimeError as err:
        fail(err)
    raise typer.Exit(rc)


#: What ``commgym replay --policy`` accepts, named in its errors.
_REPLAY_POLICY_FORMS = (
    "a policy file saved by `commgym train` (e.g. commgym-out/policy.zip) or a static preset "
    "(static:ddp-default, static:fp16-dense, static:<menu entry> such as static:int8/4MB/H1)"
)


#: Options ``commgym replay`` takes from the config (it starts from the dataclass defaults).
REPLAY_OPTIONS: tuple[str, ...] = (*ENV_OPTIONS, "env.target_loss", "seed", "baselines")


@config_command(app, "replay", *REPLAY_OPTIONS, defaults_from=None)
@own_options({"policy": _POLICY, "steps": CliField("Cap on training iterations per run.", min=1)})
def replay_cmd(policy: str, steps: int | None = None, *, overrides: dict[str, Any]) -> None:
    """Full training run with a saved policy and with the static baselines, side by side.

    Loading an SB3 policy file (a pickle) from an untrusted source can execute code.
    """
    from commgym.collectives import CommgymError
    from commgym.experiments.replay import replay, replay_config
    from commgym.experiments.session import check_network

    if not policy.startswith("static:"):
        try:
            check_policy_file(policy)
        except (ValueError, FileNotFoundError) as err:
            fail(f"{err}; --policy takes {_REPLAY_POLICY_FORMS}")
    if overrides.get("env.time_budget_s") is None:
        from commgym.agents.scheduler import policy_time_budget
        from commgym.experiments.progress import console

        # the observation's elapsed_frac is training time / budget: the policy acts as it
        # learned only under the budget it was trained with
        budget = policy_time_budget(policy)
        if budget is not None:
            overrides = {**overrides, "env.time_budget_s": budget}
            console.print(
                f"time budget {budget:g} s: the policy's training budget (--time-budget-s "
                "sets another)"
            )
    try:
        cfg = replay_config(overrides, steps=steps)
        if policy.startswith("static:"):
            check_policy(policy, cfg)
        check_network(cfg.env_config.network_plan, cfg.env_config.network_strict)
        replay(policy, cfg)
    except FileNotFoundError as err:
        fail(f"{err}; --policy takes {_REPLAY_POLICY_FORMS}")
    except (ValueError, RuntimeError, CommgymError) as err:
        fail(err)


#: Options ``commgym collect`` takes from the config (the others are its own).
COLLECT_OPTIONS: tuple[str, ...] = (*ENV_OPTIONS, "seed", "tracking_uri", *EXECUTOR_OPTIONS)


#: The collect command's own options (the seed is the config's ``seed``).
COLLECT_OWN_OPTIONS = {
    "config": CliField("Scenario whose env section is recorded (default: default)."),
    "decisions": CliField("Real decisions to record.", min=1),
    "policy": CliField("Exploration policy: sticky, random, grid."),
    "out": CliField("CSV or .parquet."),
    "bench": CliField("Also time collectives."),
    "fit": CliField("Also fit a surrogate, save it here."),
}


@config_command(app, "collect", *COLLECT_OPTIONS)
@own_options(COLLECT_OWN_OPTIONS)
def collect_cmd(
    config: str | None = None,
    decisions: int = 200,
    policy: str = "sticky",
    out: str = "commgym-out/transitions.csv",
    bench: bool = True,
    fit: str | None = None,
    *,
    overrides: dict[str, Any],
) -> None:
    """Record real decisions of a scenario (the surrogate's data), logged to MLflow.

    ``--seed`` (default 0) seeds the first episode and the exploration policy.
    """
    from commgym.experiments.collect import collect, fit_surrogate
    from commgym.experiments.config import load_run_config
    from commgym.experiments.executors import open_executor
    from commgym.experiments.session import check_network

    seed = overrides.get("seed", 0)
    try:
        cfg = load_run_config(config or "default", {**overrides, "env.seed": seed})
        check_network(cfg.env_config.network_plan, cfg.env_config.network_strict)
        with open_executor(cfg) as executor:
            res = collect(
                cfg.env_config, decisions=decisions, policy=policy, seed=seed, out=out,
                bench=bench, tracking_uri=cfg.tracking_uri, executor=executor,
            )  # fmt: skip
    except (ValueError, RuntimeError, FileNotFoundError) as err:
        fail(err)
    typer.echo(f"{res['decisions']} decisions in {res['seconds']:.1f} s -> {res['path']}")
    if fit:
        fit_surrogate([res["path"]], fit, bench=res["bench_path"], menu=cfg.env_config.menu)
        typer.echo(f"surrogate saved to {fit}")


#: Options of ``commgym fit-surrogate``.
FIT_OPTIONS = {
    "data": CliField("Comma-separated transition files (CSV/Parquet)."),
    "out": CliField("Model file."),
    "bench": CliField("Samples JSON of bench collectives."),
    "holdout": CliField("Held-out transitions (MAPE, p90 error, Kendall tau per link rate)."),
    "config": CliField("Scenario the data was collected with (its action menu)."),
}


@app.command("fit-surrogate")
@own_options(FIT_OPTIONS)
def fit_surrogate_cmd(
    data: str,
    out: str = "commgym-out/surrogate.joblib",
    bench: str | None = None,
    holdout: str | None = None,
    config: str | None = None,
) -> None:
    """Fit the surrogate (alpha-beta prior + gradient boosting) on recorded transitions."""
    from commgym.env.surrogate import format_holdout_report, holdout_report, read_transitions
    from commgym.experiments.collect import fit_surrogate
    from commgym.experiments.config import load_run_config

    try:
        menu = load_run_config(config or "default").env.get("action_menu")
        model = fit_surrogate(comma_list(data), out, bench=bench, menu=menu)
    except (ValueError, FileNotFoundError) as err:
        fail(err)
    spread = ", ".join(f"{k} {v:.3f}" for k, v in model.residual_std.items())
    typer.echo(f"surrogate saved to {out}\nout-of-fold residual std: {spread}")
    if holdout:
        typer.echo(format_holdout_report(holdout_report(model, read_transitions(holdout))))


#: Options of ``commgym headroom-bound``.
BOUND_OPTIONS = {
    "conditions": CliField(
        "Comma-separated <condition>=<CSV> pairs: oracle-static's ranking with that "
        "condition held fixed (a leaderboard's static-entries-<scenario>.csv)."
    ),
    "shares": CliField(
        "Comma-separated shares of the conditions, in their order, summing to 1 "
        "(default: the mix where static play falls furthest behind)."
    ),
    "per_job": CliField("Conditions drawn once per job (profiles), not alternating inside one."),
}


def _parse_conditions(text: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in comma_list(text):
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"--conditions item {item!r} is not <condition>=<static-entries CSV>")
        if name.strip() in pairs:
            raise ValueError(f"--conditions names {name.strip()!r} twice")
        pairs[name.strip()] = path.strip()
    return pairs


def _parse_shares(text: str, names: list[str]) -> dict[str, float]:
    parts = comma_list(text)
    if len(parts) != len(names):
        raise ValueError(f"--shares {text!r} gives {len(parts)} shares for the conditions {names}")
    try:
        return {n: float(x) for n, x in zip(names, parts, strict=True)}
    except ValueError:
        raise ValueError(f"--shares {text!r} must be numbers, e.g. 0.67,0.33") from None


@app.command("headroom-bound")
@own_options(BOUND_OPTIONS)
def headroom_bound_cmd(conditions: str, shares: str | None = None, per_job: bool = False) -> None:
    """Bound a scenario's headroom from its entries' times with each condition held fixed.

    The most any schedule could gain over the best static entry
    (:func:`commgym.experiments.headroom.switching_bound`), before building the scenario.
    """
    from commgym.experiments.headroom import switching_bound
    from commgym.experiments.leaderboard import read_static_ranking

    try:
        paths = _parse_conditions(conditions)
        names = list(paths)
        rankings = {n: read_static_ranking(p) for n, p in paths.items()}
        times = {n: {e.config: e.mean_time_to_target_s for e in r} for n, r in rankings.items()}
        mix = None if shares is None else _parse_shares(shares, names)
        bound = switching_bound(times, shares=mix, per_job=per_job)
    except (ValueError, FileNotFoundError) as err:
        fail(err)
    entries = bound.entries
    width = max(len(e) for e in entries)
    lines = ["time to target, s (oracle-static's mean over seeds; * fastest under the condition)"]
    lines.append(" ".join([f"{'entry':<{width}}", *(f"{n:>12}" for n in names)]))
    for e in entries:
        cells = [f"{times[n][e]:.2f}" + ("*" if bound.best_entries[n] == e else " ") for n in names]
        lines.append(" ".join([f"{e:<{width}}", *(f"{c:>12}" for c in cells)]))
    missed = sorted({e.config for r in rankings.values() for e in r if e.seeds_missed})
    if missed:
        lines.append(f"missed the target on some seed (counted at the budget): {', '.join(missed)}")
    model = "drawn once per job" if per_job else "alternating inside a job"
    where = "given" if shares is not None else "where static play falls furthest behind"
    mix_text = " / ".join(f"{n} {bound.shares[n]:.2f}" for n in names)
    best = ", ".join(f"{n} {bound.best_entries[n]}" for n in names)
    lines.append(
        f"h <= {bound.h:.3f}: conditions {model}, shares {mix_text} ({where}); best static "
        f"entry there {bound.static_entry}; fastest per condition: {best}"
    )
    typer.echo("\n".join(lines))


#: ``commgym pool``'s options.
POOL_OPTIONS = {
    "runs": CliField(
        "Comma-separated leaderboard --output-dir folders (or leaderboard-<scenario>.csv "
        "files), one per invocation of the same scenario and agents."
    ),
    "scenario": CliField("The scenario to read where a folder holds several.", show_default=False),
}


@app.command("pool")
@own_options(POOL_OPTIONS)
def pool_cmd(runs: str, scenario: str | None = None) -> None:
    """Report a leaderboard scenario run in several invocations: each, and pooled.

    Every (invocation, seed) pair is one paired unit of the pooled test
    (:mod:`commgym.experiments.pooling`); run the invocations on other seeds with
    ``--eval-seed``.
    """
    from commgym.experiments.pooling import pool, pool_lines, read_invocation

    try:
        report = pool([read_invocation(r, scenario) for r in comma_list(runs)])
    except (ValueError, FileNotFoundError) as err:
        fail(err)
    typer.echo("\n".join(pool_lines(report)))


#: Config options ``commgym leaderboard`` applies to every scenario it runs.
LEADERBOARD_OPTIONS: tuple[str, ...] = (
    "eval_seed",
    "timesteps",
    "surrogate_decisions",
    "fine_tune_episodes",
    "tuning_decisions",
    "env.steps_per_decision",
    "env.time_budget_s",
    "env.max_decisions",
    "env.network",
    "env.network_strict",
    "env.stragglers",
    "env.cross_traffic",
    "env.probe_for_all",
    "tracking_uri",
    *EXECUTOR_OPTIONS,
)


#: The leaderboard command's own options.
LEADERBOARD_OWN_OPTIONS = {
    "scenarios": CliField("Comma-separated scenario files or shipped names: {configs}."),
    "agents": CliField(
        "Comma-separated agents: {agents}; SB3 agents (ppo, recurrent-ppo, a2c, dqn) are "
        "trained first by each scenario's recipe unless --policy-dir holds their policy. "
        "NAME@RECIPE trains learned agent NAME by another run config on the same environment "
        "(a shipped name or YAML file, e.g. ppo@flaky-link-clock), in a row of its own."
    ),
    "seeds": CliField("Evaluation seeds per agent.", min=1),
    "policy_dir": CliField(
        "Folder with <scenario>/<agent>/policy.zip policies to load instead of "
        "training (ppo@clock: <scenario>/ppo_clock/): the --output-dir of an earlier "
        "leaderboard."
    ),
    "output_dir": CliField(
        "Folder for the tables, figures and each scenario's episodes "
        "(default: commgym-out/leaderboard in the current folder).",
        show_default=False,
    ),
}


@config_command(app, "leaderboard", *LEADERBOARD_OPTIONS)
@record_option(lambda kw: [kw["output_dir"]])
@own_options(LEADERBOARD_OWN_OPTIONS)
def leaderboard_cmd(
    scenarios: str = "default,slow-link,changing-link,mixed-links",
    agents: str = (
        "ppo,autotune,oracle-static,static:ddp-default,static:fp16-dense,bayesopt,bandit,"
        "accordion,adacomm"
    ),
    seeds: int = 3,
    policy_dir: str | None = None,
    output_dir: str = "commgym-out/leaderboard",
    *,
    overrides: dict[str, Any],
) -> None:
    """Scenario x agent x seed on real ranks: time to target against what users would run.

    The given config options apply to every scenario: ``--network``, ``--stragglers`` or
    ``--cross-traffic`` hold one condition fixed, the per-condition rankings that ``commgym
    headroom-bound`` reads.
    """
    from commgym.experiments.leaderboard import run_leaderboard

    overrides = dict(overrides)
    tracking_uri = overrides.pop("tracking_uri", None)
    where = {k: overrides.pop(k) for k in EXECUTOR_OPTIONS if k in overrides}
    try:
        check_writable_dir(output_dir, "--output-dir")
        check_tracking(tracking_uri)
        if policy_dir is not None and not Path(policy_dir).is_dir():
            raise ValueError(f"--policy-dir {policy_dir!r} is not a folder")
        run_leaderboard(
            comma_list(scenarios),
            comma_list(agents),
            seeds,
            output_dir=output_dir,
            tracking_uri=tracking_uri,
            policy_dir=policy_dir,
            overrides=overrides,
            **where,
        )
    except (ValueError, FileNotFoundError, PermissionError) as err:
        fail(err)


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


def _on_unraisable(unraisable: Any) -> None:
    """Deliver again a signal whose :class:`Terminated` a finaliser swallowed.

    Python runs a signal handler in the main thread at the next bytecode boundary, which
    can lie inside a ``__del__`` or a weakref callback (SQLAlchemy's, while MLflow's store
    is collected): what it raises there is only printed ("Exception ignored in ..."), and
    the command went on training with the signal spent (seen 2026-12-07: ``commgym train``
    ignored SIGTERM, then every later one). The signal is simulated again for the main
    thread (:func:`_thread.interrupt_main`) from another thread, once this hook has
    returned, so that its handler raises outside the finaliser (should it land in one
    again, this hook repeats).
    """
    if isinstance(unraisable.exc_value, Terminated):
        _received.clear()
        threading.Thread(
            target=_redeliver, args=(unraisable.exc_value.signum,), daemon=True
        ).start()
        return
    _previous_unraisablehook(unraisable)


_previous_unraisablehook = sys.unraisablehook


def _redeliver(signum: int) -> None:
    # raised at once, the handler would run inside the hook (Thread.start waits for the
    # thread), where it is swallowed again: the hook returns first
    time.sleep(0.05)
    _thread.interrupt_main(signum)


def install_signal_handlers() -> None:
    """Route SIGTERM and SIGHUP through Ctrl-C's cleanup (main thread only).

    A :class:`Terminated` raised inside a finaliser is delivered again
    (:func:`_on_unraisable`).
    """
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    sys.unraisablehook = _on_unraisable


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


# the simulator's commands (calibrate-sim, bench sim) live in their own module
from commgym.experiments.sim_cli import register as _register_sim  # noqa: E402

_register_sim(app)

if __name__ == "__main__":
    main()
