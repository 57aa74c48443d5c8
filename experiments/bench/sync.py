"""``commgym bench sync``: torch DDP vs :class:`GradientSynchronizer`, side by side.

One launch of ``world_size`` gloo ranks (a :class:`~commgym.env.cluster.Cluster` of
:mod:`commgym.env.worker` ranks, as the env starts them; over emulated links with
``network``) runs the worker's ``sync_bench`` command
(:func:`commgym.env.rank_bench.bench_sync`): interleaved step by step, torch
``DistributedDataParallel`` and our synchronizer with the same model (a ``WORKLOADS``
entry), initial weights, batches and bucket size, with ``none`` compression and with
every requested compressor; ours is built as the env's ranks and ``CommScheduler`` build
it (no per-step gradient norm or compression error: they measure those on a decision's
last step). The parent process summarises per-step medians, the ratio
ours/DDP of medians measured in the same run, the bytes on the wire and the compression
ratio. For ``none`` it takes the ratio ours/DDP per round (each round steps both on the
same batches, in turn), prints their median and spread and a distribution-free
confidence interval of that median, says whether the difference from DDP is inside that
noise, and gives a verdict for the target: median per-round ratio ``<= 1.03`` (goal
``<= 1.00``).

Run as ``commgym bench sync [options]`` or ``python -m commgym.experiments.bench sync
[options]`` (the same typer command).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from commgym.collectives import CommgymError, CompressionSpec, WorkerFailed
from commgym.collectives.checks import check_int
from commgym.experiments.bench import write_json

__all__ = ["GOAL_RATIO", "TARGET_RATIO", "median_interval", "run_sync_benchmark", "summarize"]

#: ours/DDP for ``none`` (median of the per-round ratios) that the benchmark must meet.
TARGET_RATIO = 1.03
#: Confidence of the interval of the median per-round ratio (when enough rounds allow it).
CONFIDENCE = 0.95
#: ours/DDP ratio we aim for.
GOAL_RATIO = 1.00
#: Samples per rank per step, seed of weights and data order, SGD learning rate.
BATCH_SIZE, SEED, LR = 64, 0, 0.01
#: Training FLOP/s per rank budgeted for the timeout (generous for 2 shared CPU cores).
_BUDGET_FLOPS = 1.5e9
#: Collective timeout of the benchmark's process group, seconds.
_PG_TIMEOUT_S = 300.0


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def median_interval(values: Sequence[float], level: float = CONFIDENCE) -> dict[str, Any]:
    """Distribution-free confidence interval of the median of ``values``.

    The order statistics ``[x_(j), x_(n+1-j)]`` cover the population median with
    probability ``1 - 2 P(Binomial(n, 1/2) <= j - 1)`` whatever the distribution (the
    sign-test interval); ``j`` is the largest index whose coverage reaches ``level``
    (with fewer than 6 values even ``[min, max]`` falls short: it is given with its
    coverage).

    Returns:
        ``low``, ``high``, ``coverage`` (of that interval), ``median``, ``min``, ``max``,
        ``q1``, ``q3`` (quartiles) and ``n``.
    """
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        nan = math.nan
        return {"low": nan, "high": nan, "coverage": 0.0, "median": nan, "min": nan,
                "max": nan, "q1": nan, "q3": nan, "n": 0}  # fmt: skip
    j, coverage = 1, 1.0 - 2.0 * 0.5**n
    for k in range(2, n // 2 + 1):  # [x_(k), x_(n+1-k)], k <= n + 1 - k
        cov = 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) * 0.5**n
        if cov < level:
            break
        j, coverage = k, cov
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if n >= 2 else xs * 3
    return {
        "low": xs[j - 1],
        "high": xs[n - j],
        "coverage": coverage,
        "median": statistics.median(xs),
        "min": xs[0],
        "max": xs[-1],
        "q1": q1,
        "q3": q3,
        "n": n,
    }


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """Turn rank 0's raw measurements into the benchmark's rows.

    Args:
        raw: rank 0's reply to ``sync_bench`` (:func:`commgym.env.rank_bench.bench_sync`).

    Returns:
        A dict with ``rows`` (one per configuration, DDP first: ``config``,
        ``median_step_ms`` (the mean over whole averaging rounds when ``sync_period > 1``),
        ``round_ms`` (per averaging round: ``sync_period`` steps), ``ratio_vs_ddp``,
        ``ratio_vs_none``, mean ``bytes_per_step``,
        ``compression_ratio``, mean ``compute_ms`` / ``comm_wait_ms`` / ``compress_ms`` and
        ``collectives`` per step for ours), ``ratio_none_vs_ddp`` (median of ours-``none``
        over median of DDP, all rounds), ``round_ratios_none_vs_ddp`` (the same per
        round), ``round_ratio`` (:func:`median_interval` of the per-round ratios),
        ``noise`` (``"inside"`` when that interval holds 1.0, else ``"ours slower"`` /
        ``"ours faster"``) and ``meets_target`` (median per-round ratio <=
        :data:`TARGET_RATIO`).
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
                "collectives": statistics.fmean(s.get("collectives", 0) for s in stats),
            }
        )
    ratio = med["none"] / med["ddp"]
    round_ratios = [
        center(o) / center(d) for o, d in zip(step_s["none"], step_s["ddp"], strict=True)
    ]
    interval = median_interval(round_ratios)
    if interval["low"] <= 1.0 <= interval["high"]:
        noise = "inside"
    else:
        noise = "ours slower" if interval["low"] > 1.0 else "ours faster"
    return {
        "rows": rows,
        "ratio_none_vs_ddp": ratio,
        "round_ratios_none_vs_ddp": round_ratios,
        "round_ratio": interval,
        "noise": noise,
        "target_ratio": TARGET_RATIO,
        "goal_ratio": GOAL_RATIO,
        "meets_target": interval["median"] <= TARGET_RATIO,
        "meets_goal": interval["median"] <= GOAL_RATIO,
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
            f"{meta['rounds']} rounds x {meta['steps']} steps (+{meta['warmup']} warm-up), "
            "interleaved step by step; ours as the env runs it (norm and error measured "
            "only on a decision's last step)"
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
    ci = summary["round_ratio"]
    rounds = ", ".join(f"{x:.3f}" for x in summary["round_ratios_none_vs_ddp"])
    verdict = "[green]PASS[/green]" if summary["meets_target"] else "[red]FAIL[/red]"
    goal = "met" if summary["meets_goal"] else "not met"
    noise = {
        "inside": "contains 1: the difference from DDP is inside the noise",
        "ours slower": "lies above 1: ours is slower than DDP beyond the noise",
        "ours faster": "lies below 1: ours is faster than DDP beyond the noise",
    }[summary["noise"]]
    console.print(
        f"ours/DDP (none) = {ci['median']:.3f}, the median of {ci['n']} per-round ratios "
        f"(spread: min {ci['min']:.3f}, quartiles {ci['q1']:.3f}-{ci['q3']:.3f}, max "
        f"{ci['max']:.3f}; per round: {rounds}); its {100 * ci['coverage']:.1f} % "
        f"interval [{ci['low']:.3f}, {ci['high']:.3f}] {noise}"
        + (" (fewer than 6 rounds give no 95 % interval)" if ci["n"] < 6 else "")
    )
    console.print(
        f"target <= {TARGET_RATIO:.2f}: {verdict}; goal <= {GOAL_RATIO:.2f}: {goal}  "
        f"(ratio of all-step medians {summary['ratio_none_vs_ddp']:.3f}; "
        f"max |w_DDP - w_ours| = {summary['max_param_diff_ddp_vs_none']:.1e})"
    )


def run_sync_benchmark(
    world_size: int = 2,
    steps: int = 30,
    warmup: int = 5,
    bucket_mb: float = 25.0,
    model: str = "mid-mlp",
    compressors: Sequence[str] = ("none",),
    rounds: int = 7,
    *,
    json_path: str | Path | None = None,
    timeout_s: float | None = None,
    console: Console | None = None,
    network: str | None = None,
    network_strict: bool = True,
    sync_period: int = 1,
) -> dict[str, Any]:
    """Run the DDP-vs-ours benchmark on one cluster of ranks and print its table.

    Starts a :class:`~commgym.env.cluster.Cluster` of ``world_size`` gloo ranks (one
    intra-op thread each), sends them the ``sync_bench`` command, takes rank 0's reply,
    prints a rich table (median step time, ratio vs DDP and vs ours-``none``, bytes per
    step, compression ratio, mean compute / comm-wait / compress time) and a one-line
    verdict for ``ours/DDP <= TARGET_RATIO`` with ``none``.

    Args:
        world_size: number of gloo ranks (>= 2); each uses one intra-op thread.
        steps: measured steps per configuration and round (>= 1).
        warmup: unmeasured warm-up steps per configuration and round (>= 0).
        bucket_mb: bucket size in MiB for both DDP (``bucket_cap_mb``) and ours (> 0).
        model: a ``WORKLOADS`` name: its model, loss and training data (``mid-mlp``: MLP
            64-1024-1024-10, 1.13 M parameters; ``wide-mlp``: 21.25 M).
        compressors: compression specs measured after DDP and ours-``none``
            (``none`` is always measured).
        rounds: interleaved repetitions; medians and ratios use all of them (>= 7 give
            a 95 % interval of the median per-round ratio).
        json_path: if given, the summary plus the raw measurements are written there.
        timeout_s: wall-clock limit of the whole launch in seconds; ``None`` derives one
            from the number of steps and the workload's FLOPs.
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
        WorkerFailed: a rank failed or the launch timed out (the ranks are killed); the
            message holds the ranks' output.
    """
    from commgym.env.workloads import get_workload

    try:
        workload = get_workload(model)
    except ValueError as err:
        raise ValueError(f"unknown benchmark model {model!r}: {err}") from None
    if world_size < 2 or steps < 1 or warmup < 0 or rounds < 1:
        raise ValueError(
            f"need world_size >= 2, steps >= 1, warmup >= 0, rounds >= 1; got "
            f"world_size={world_size}, steps={steps}, warmup={warmup}, rounds={rounds}"
        )
    if not (isinstance(bucket_mb, int | float) and math.isfinite(bucket_mb) and bucket_mb > 0):
        raise ValueError(f"bucket_mb must be a finite number > 0 (MiB), got {bucket_mb!r}")
    check_int("sync_period", sync_period, 1)
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
        step_s = 0.5 + workload.flops_per_sample() * BATCH_SIZE / _BUDGET_FLOPS
        timeout_s = 120.0 + n_steps * step_s * world_size / 2
    command = {
        "cmd": "sync_bench", "workload": model, "steps": steps, "warmup": warmup,
        "bucket_mb": float(bucket_mb), "compressors": specs, "rounds": rounds,
        "batch_size": BATCH_SIZE, "seed": SEED, "sync_period": sync_period, "lr": LR,
    }  # fmt: skip
    raw, effective, launched = _run_on_cluster(
        world_size, command, timeout_s, console, net_spec, network_strict
    )
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
        "command": launched,
        "torch_version": raw.get("torch_version"),
        "batch_size_per_rank": raw.get("batch_size"),
        "seed": raw.get("seed"),
    }
    summary = summarize(raw)
    _print_report(console, summary, meta)
    result = {**summary, "meta": meta, "raw": raw}
    write_json(result, json_path, console)
    return result


def _run_on_cluster(
    world_size: int,
    command: dict[str, Any],
    timeout_s: float,
    console: Console,
    net_spec: Any,
    network_strict: bool,
) -> tuple[dict[str, Any], str | None, list[str]]:
    """Start the ranks (and links), run ``command``, close everything; rank 0's reply.

    Returns:
        ``(reply of rank 0, the applied network spec or None, the launcher's argv)``.

    Raises:
        WorkerFailed: the ranks failed or did not finish within ``timeout_s`` (killed).
    """
    from commgym.env.cluster import Cluster, LaunchConfig

    deadline = time.monotonic() + timeout_s
    net = None
    if net_spec is not None:
        from commgym.env.net import EmulatedNetwork

        net = EmulatedNetwork(world_size, net_spec, strict=network_strict)
    where = "loopback" if net is None else f"namespaces shaped to {net.effective_spec}"
    launch = LaunchConfig(timeout_s=_PG_TIMEOUT_S, threads_per_rank=1)
    cluster = Cluster(world_size, launch, network=net, start_timeout_s=timeout_s)
    console.print(
        f"[dim]launching {world_size} ranks on {where}: -m torch.distributed.run ... "
        f"-m commgym.env.worker (timeout {timeout_s:.0f} s)[/dim]"
    )
    try:
        cluster.start()
        raw = cluster.command(command, timeout_s=max(deadline - time.monotonic(), 0.1))[0]
        return raw, None if net is None else str(net.effective_spec), cluster.launch_command
    except CommgymError as err:
        late = time.monotonic() >= deadline
        msg = (
            f"benchmark ranks did not finish within {timeout_s:.0f} s; killed them: {err}"
            if late
            else f"benchmark ranks failed: {err}"
        )
        console.print(f"error: {msg}", markup=False, highlight=False, style="red")
        raise WorkerFailed(msg) from None
    finally:  # Ctrl-C, a failed rank, or the end of a finished run
        cluster.close()
        if net is not None:
            net.close()
