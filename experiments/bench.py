"""``commgym bench sync``: torch DDP vs :class:`GradientSynchronizer`, side by side.

One launch of ``world_size`` gloo ranks (torchrun, :mod:`commgym.experiments.bench_worker`)
measures, interleaved round by round, torch ``DistributedDataParallel`` and our
synchronizer with the same model, initial weights, batches and bucket size, first with
``none`` compression and then with every requested compressor. The parent process
summarises per-step medians, the ratio ours/DDP of medians measured in the same run, the
bytes on the wire and the compression ratio, and prints a verdict for the target
``ours/DDP <= 1.05`` for ``none`` (goal ``<= 1.00``).

Run as ``commgym bench sync [options]`` or ``python -m commgym.experiments.bench sync
[options]`` (the same typer command).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from commgym.collectives import CompressionSpec, WorkerFailed

__all__ = ["TARGET_RATIO", "GOAL_RATIO", "run_sync_benchmark", "summarize", "worker_command"]

#: ours/DDP median step-time ratio for ``none`` that the benchmark must meet.
TARGET_RATIO = 1.05
#: ours/DDP ratio we aim for.
GOAL_RATIO = 1.00
#: Rough seconds per step and rank budgeted for the subprocess timeout (2 CPU cores).
_STEP_BUDGET_S = {"mlp": 0.5, "wide": 3.0}


def worker_command(
    world_size: int,
    out: Path,
    *,
    steps: int,
    warmup: int,
    bucket_mb: float,
    model: str,
    compressors: Sequence[str],
    rounds: int,
    sync_period: int = 1,
) -> list[str]:
    """The torchrun command line that runs the benchmark's ranks (loopback).

    Args:
        world_size: number of ranks (one process each, ``--standalone`` rendezvous on a
            free port).
        out: JSON file that rank 0 writes.
        steps: measured steps per configuration and round.
        warmup: unmeasured warm-up steps per configuration and round.
        bucket_mb: bucket size in MiB.
        model: benchmark model name.
        compressors: compression specs (``none`` first).
        rounds: interleaved repetitions.
        sync_period: local-SGD period of ours.

    Returns:
        ``argv`` for ``subprocess`` (``python -m torch.distributed.run ...``).
    """
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone", "--nproc-per-node", str(world_size),
        *worker_args(
            out, steps=steps, warmup=warmup, bucket_mb=bucket_mb, model=model,
            compressors=compressors, rounds=rounds, sync_period=sync_period,
        ),
    ]  # fmt: skip


def worker_args(
    out: Path,
    *,
    steps: int,
    warmup: int,
    bucket_mb: float,
    model: str,
    compressors: Sequence[str],
    rounds: int,
    sync_period: int,
) -> list[str]:
    """What torchrun runs on every rank: the benchmark worker module and its options."""
    return [
        "-m", "commgym.experiments.bench_worker",
        "--out", str(out),
        "--steps", str(steps),
        "--warmup", str(warmup),
        "--bucket-mb", repr(float(bucket_mb)),
        "--model", model,
        "--compressors", ",".join(compressors),
        "--rounds", str(rounds),
        "--sync-period", str(sync_period),
    ]  # fmt: skip


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the launcher's process group (torchrun and every rank), then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _excerpt(path: Path, head: int = 30, tail: int = 25) -> str:
    """The ranks' first Python traceback (if any) and the launcher's last lines."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "<no output>"
    marker = "Traceback (most recent call last)"
    first = next((i for i, ln in enumerate(lines) if marker in ln), None)
    if first is None or first >= len(lines) - tail:
        return "\n".join(lines[-tail - head :]) or "<no output>"
    cut = min(first + head, len(lines) - tail)
    skipped = len(lines) - tail - cut
    middle = [f"... ({skipped} lines) ..."] if skipped > 0 else []
    return "\n".join(lines[first:cut] + middle + lines[-tail:])


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """Turn rank 0's raw measurements into the benchmark's rows.

    Args:
        raw: the JSON written by :mod:`commgym.experiments.bench_worker`.

    Returns:
        A dict with ``rows`` (one per configuration, DDP first: ``config``,
        ``median_step_ms`` (the mean over whole averaging rounds when ``sync_period > 1``),
        ``round_ms`` (per averaging round: ``sync_period`` steps), ``ratio_vs_ddp``,
        ``ratio_vs_none``, mean ``bytes_per_step``,
        ``compression_ratio``, mean ``compute_ms`` / ``comm_wait_ms`` / ``compress_ms`` for
        ours), ``ratio_none_vs_ddp`` (median of ours-``none`` over median of DDP, all
        rounds), ``round_ratios_none_vs_ddp`` (the same per round) and ``meets_target``.
    """
    step_s = raw["step_s"]
    period = int(raw.get("sync_period", 1))
    # H > 1: one step in H also averages, so the mean over whole rounds is the figure
    # (the median would hide the averaging step); H = 1: the median step
    center = _median if period == 1 else statistics.fmean
    med = {c: center([t for rnd in step_s[c] for t in rnd]) for c in raw["configs"]}
    ddp_bytes = int(raw["param_bytes"])
    none_rows = [s for rnd in raw["ours"]["none"] for s in rnd]
    none_bytes = statistics.fmean([s["bytes_sent"] for s in none_rows])
    rows: list[dict[str, Any]] = [
        {
            "config": "torch DDP",
            "spec": "ddp",
            "median_step_ms": 1e3 * med["ddp"],
            "round_ms": 1e3 * med["ddp"] * period,
            "ratio_vs_ddp": 1.0,
            "ratio_vs_none": med["ddp"] / med["none"],
            "bytes_per_step": ddp_bytes,
            "compression_ratio": none_bytes / ddp_bytes,
            "compute_ms": None,
            "comm_wait_ms": None,
            "compress_ms": None,
        }
    ]
    for spec in raw["configs"][1:]:
        stats = [s for rnd in raw["ours"][spec] for s in rnd]
        nbytes = statistics.fmean([s["bytes_sent"] for s in stats])
        rows.append(
            {
                "config": f"ours {spec}" + (f" H={period}" if period > 1 else ""),
                "spec": spec,
                "median_step_ms": 1e3 * med[spec],
                "round_ms": 1e3 * med[spec] * period,
                "ratio_vs_ddp": med[spec] / med["ddp"],
                "ratio_vs_none": med[spec] / med["none"],
                "bytes_per_step": nbytes,
                "compression_ratio": none_bytes / nbytes if nbytes else math.inf,
                "compute_ms": 1e3 * statistics.fmean(s["compute_s"] for s in stats),
                "comm_wait_ms": 1e3 * statistics.fmean(s["comm_wait_s"] for s in stats),
                "compress_ms": 1e3 * statistics.fmean(s["compress_s"] for s in stats),
            }
        )
    ratio = med["none"] / med["ddp"]
    round_ratios = [
        center(o) / center(d) for o, d in zip(step_s["none"], step_s["ddp"], strict=True)
    ]
    return {
        "rows": rows,
        "ratio_none_vs_ddp": ratio,
        "round_ratios_none_vs_ddp": round_ratios,
        "target_ratio": TARGET_RATIO,
        "goal_ratio": GOAL_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
        "meets_goal": ratio <= GOAL_RATIO,
        "max_param_diff_ddp_vs_none": raw["max_param_diff_ddp_vs_none"],
        "numel": raw["numel"],
        "sync_period": period,
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print_report(console: Console, summary: dict[str, Any], meta: dict[str, Any]) -> None:
    period = summary.get("sync_period", 1)
    network = meta.get("network") or "loopback (unshaped)"
    table = Table(
        title=(
            f"bench sync: {meta['model']} ({summary['numel'] / 1e6:.2f}M params), "
            f"{meta['world_size']} gloo ranks on {network}, bucket {meta['bucket_mb']:g} MiB, "
            f"{meta['rounds']} rounds x {meta['steps']} steps (+{meta['warmup']} warm-up)"
            + (f", ours at sync period {period} (DDP every step)" if period > 1 else "")
        ),
    )
    step_col = "median step ms" if period == 1 else f"ms per round of {period} steps"
    for name in ("config", step_col, "ratio vs DDP", "ratio vs ours-none",
                 "bytes/step", "compression ratio", "compute ms", "comm wait ms",
                 "compress ms"):  # fmt: skip
        table.add_column(name, justify="left" if name == "config" else "right", no_wrap=True)
    for r in summary["rows"]:
        table.add_row(
            r["config"],
            _fmt(r["median_step_ms"] if period == 1 else r["round_ms"], ".2f"),
            _fmt(r["ratio_vs_ddp"], ".3f"),
            _fmt(r["ratio_vs_none"], ".3f"),
            f"{r['bytes_per_step']:,.0f}",
            _fmt(r["compression_ratio"], ".1f") + "x",
            _fmt(r["compute_ms"], ".2f"),
            _fmt(r["comm_wait_ms"], ".2f"),
            _fmt(r["compress_ms"], ".2f"),
        )
    console.print(table)
    if period > 1:
        return  # DDP synchronises every step: no like-for-like target
    ratio = summary["ratio_none_vs_ddp"]
    rounds = ", ".join(f"{x:.3f}" for x in summary["round_ratios_none_vs_ddp"])
    verdict = "[green]PASS[/green]" if summary["meets_target"] else "[red]FAIL[/red]"
    goal = "met" if summary["meets_goal"] else "not met"
    console.print(
        f"ours/DDP (none) = {ratio:.3f}  target <= {TARGET_RATIO:.2f}: {verdict}; "
        f"goal <= {GOAL_RATIO:.2f}: {goal}  (per round: {rounds}; "
        f"max |w_DDP - w_ours| = {summary['max_param_diff_ddp_vs_none']:.1e})"
    )


def run_sync_benchmark(
    world_size: int = 2,
    steps: int = 30,
    warmup: int = 5,
    bucket_mb: float = 25.0,
    model: str = "mlp",
    compressors: Sequence[str] = ("none",),
    rounds: int = 3,
    *,
    json_path: str | Path | None = None,
    timeout_s: float | None = None,
    console: Console | None = None,
    network: str | None = None,
    network_strict: bool = True,
    sync_period: int = 1,
) -> dict[str, Any]:
    """Run the DDP-vs-ours benchmark in one torchrun launch and print its table.

    Launches ``python -m torch.distributed.run --standalone --nproc-per-node
    world_size -m commgym.experiments.bench_worker ...`` in its own process group, reads
    the JSON that rank 0 writes to a temporary file, prints a rich table (median step
    time, ratio vs DDP and vs ours-``none``, bytes per step, compression ratio, mean
    compute / comm-wait / compress time) and a one-line verdict for ``ours/DDP <=
    TARGET_RATIO`` with ``none``.

    Args:
        world_size: number of gloo ranks (>= 2); each uses one intra-op thread.
        steps: measured steps per configuration and round (>= 1).
        warmup: unmeasured warm-up steps per configuration and round (>= 0).
        bucket_mb: bucket size in MiB for both DDP (``bucket_cap_mb``) and ours (> 0).
        model: ``"mlp"`` (64-1024-1024-10) or ``"wide"`` (~9.7M parameters).
        compressors: compression specs measured after DDP and ours-``none``
            (``none`` is always measured).
        rounds: interleaved repetitions; medians and ratios use all of them.
        json_path: if given, the summary plus the raw measurements are written there.
        timeout_s: wall-clock limit of the whole launch in seconds; ``None`` derives one
            from the number of steps.
        console: rich console to print to (default: stdout, at least 150 columns wide).
        network: ``None`` (unshaped loopback) or a network spec / profile (e.g.
            ``"1gbit"``): every rank then runs in its own network namespace with ``tc``
            shaping its link, one torchrun agent per namespace (needs root, see
            :class:`commgym.env.net.EmulatedNetwork`); DDP and ours share the links.
        network_strict: with ``False`` delay/jitter/loss the kernel cannot emulate
            (no ``sch_netem``) are dropped with a warning instead of raising.
        sync_period: local-SGD period of ours; ``H > 1`` reports time per averaging
            round (``H`` steps, compressed averaging included); ``steps`` is rounded up
            to a multiple of ``H``.

    Returns:
        The summary (see :func:`summarize`) with ``meta`` (arguments, command line,
        versions) and ``raw`` (per-step measurements).

    Raises:
        ValueError: invalid arguments (unknown model or compression spec, bad counts).
        WorkerFailed: a rank failed, the launch timed out (the process group is
            killed), or no result was written; the message holds the launcher's output.
    """
    from commgym.experiments.bench_worker import MODELS

    if model not in MODELS:
        raise ValueError(f"unknown benchmark model {model!r}; known: {sorted(MODELS)}")
    if world_size < 2 or steps < 1 or warmup < 0 or rounds < 1:
        raise ValueError(
            f"need world_size >= 2, steps >= 1, warmup >= 0, rounds >= 1; got "
            f"world_size={world_size}, steps={steps}, warmup={warmup}, rounds={rounds}"
        )
    if not (isinstance(bucket_mb, int | float) and math.isfinite(bucket_mb) and bucket_mb > 0):
        raise ValueError(f"bucket_mb must be a finite number > 0 (MiB), got {bucket_mb!r}")
    if isinstance(sync_period, bool) or not isinstance(sync_period, int) or sync_period < 1:
        raise ValueError(f"sync_period must be an integer >= 1, got {sync_period!r}")
    steps = -(-steps // sync_period) * sync_period
    warmup = -(-warmup // sync_period) * sync_period  # measured steps start a round
    net_spec = None
    if network is not None:
        from commgym.env.net import NetworkSpec

        net_spec = NetworkSpec.parse(network)  # ValueError names the valid forms
    specs = list(dict.fromkeys(str(CompressionSpec.parse(c)) for c in ["none", *compressors]))
    if console is None:
        console = Console()
        if not console.is_terminal or console.width < 150:
            console = Console(width=150)
    if timeout_s is None:
        n_steps = rounds * (len(specs) + 1) * (steps + warmup)
        timeout_s = 120.0 + n_steps * _STEP_BUDGET_S[model] * world_size / 2

    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="commgym-bench-"))
        out = Path(tmp) / "result.json"
        log = Path(tmp) / "torchrun.log"
        args = worker_args(
            out, steps=steps, warmup=warmup, bucket_mb=bucket_mb, model=model,
            compressors=specs, rounds=rounds, sync_period=sync_period,
        )  # fmt: skip
        # TMPDIR: torchrun's own temp folders go away with ours
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TMPDIR=tmp)
        if net_spec is None:
            launches = [
                (
                    worker_command(
                        world_size, out, steps=steps, warmup=warmup, bucket_mb=bucket_mb,
                        model=model, compressors=specs, rounds=rounds, sync_period=sync_period,
                    ),
                    env,
                )
            ]  # fmt: skip
            where = "loopback"
        else:
            from commgym.env.net import EmulatedNetwork

            net = stack.enter_context(EmulatedNetwork(world_size, net_spec, strict=network_strict))
            launches = net.torchrun_commands(args, env)
            where = f"namespaces shaped to {net.effective_spec}"
        cmd = launches[0][0]
        console.print(
            f"[dim]launching {world_size} ranks on {where}: {' '.join(cmd[1:5])} ... "
            f"(timeout {timeout_s:.0f} s)[/dim]"
        )
        rc = _run_launches(launches, log, timeout_s, console)
        if rc != 0 or not out.exists():
            reason = f"exit status {rc}" if rc != 0 else "no result file written"
            msg = f"benchmark ranks failed ({reason}). Last output:\n{_excerpt(log)}"
            console.print(f"error: {msg}", markup=False, highlight=False, style="red")
            raise WorkerFailed(msg)
        raw = json.loads(out.read_text())
        effective = str(net.effective_spec) if net_spec is not None else None

    meta = {
        "network": effective,
        "sync_period": sync_period,
        "world_size": world_size,
        "steps": steps,
        "warmup": warmup,
        "bucket_mb": float(bucket_mb),
        "model": model,
        "compressors": specs,
        "rounds": rounds,
        "command": cmd,
        "torch_version": raw.get("torch_version"),
        "batch_size_per_rank": raw.get("batch_size"),
        "seed": raw.get("seed"),
    }
    summary = summarize(raw)
    _print_report(console, summary, meta)
    result = {**summary, "meta": meta, "raw": raw}
    write_json(result, json_path, console)
    return result


def _run_launches(
    launches: list[tuple[list[str], dict[str, str]]],
    log: Path,
    timeout_s: float,
    console: Console,
) -> int:
    """Start every launcher (own process group each), wait for all; kill all on failure.

    Returns:
        The first non-zero exit status, else 0.

    Raises:
        WorkerFailed: the launch did not finish within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    procs: list[subprocess.Popen[bytes]] = []
    with log.open("wb") as log_f:
        try:
            for cmd, env in launches:
                procs.append(
                    subprocess.Popen(
                        cmd, stdout=log_f, stderr=subprocess.STDOUT, env=env,
                        start_new_session=True,
                    )
                )  # fmt: skip
            rc = 0
            for proc in procs:
                code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                if code != 0:
                    rc = rc or code
                    break  # one rank failed: the others would wait for it
            return rc
        except subprocess.TimeoutExpired:
            for proc in procs:
                _kill_group(proc)
            msg = (
                f"benchmark ranks did not finish within {timeout_s:.0f} s; killed the "
                f"launchers' process groups. Last output:\n{_excerpt(log)}"
            )
            console.print(f"[red]error:[/red] {msg}", markup=False, highlight=False)
            raise WorkerFailed(msg) from None
        finally:  # Ctrl-C, a failed rank, or stragglers of a finished launch
            for proc in procs:
                _kill_group(proc)


def write_json(result: dict[str, Any], json_path: str | Path | None, console: Console) -> None:
    """Write a benchmark result as JSON (parents created) when ``json_path`` is given."""
    if json_path is None:
        return
    path = Path(json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=float))
    console.print(f"[dim]wrote {path}[/dim]")


if __name__ == "__main__":
    from commgym.experiments.cli import bench_app

    bench_app(prog_name="python -m commgym.experiments.bench")
