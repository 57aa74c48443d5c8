"""The benchmark commands a rank runs (:mod:`commgym.env.worker`'s benchmark mode).

Every benchmark that needs real ranks starts them the one way the env does
(:class:`~commgym.env.cluster.Cluster`, torchrun, the same worker) and sends one of these
commands; each rank answers with what it measured:

``allreduce_bench``  :func:`bench_allreduce`: plain fp32 all-reduces of given sizes
                     (``commgym bench netem``, the network tests).
``allgather_bench``  :func:`bench_allgather`: fp32 all-gathers of given total sizes (the
                     surrogate's alpha-beta prior, ``commgym bench collectives``).
``sync_bench``       :func:`bench_sync`: torch ``DistributedDataParallel`` against
                     :class:`~commgym.collectives.GradientSynchronizer`, interleaved round
                     by round on the same model, weights and batches (``commgym bench
                     sync``).

Measured regions hold no messaging: a command is received, run, and answered once.
"""

from __future__ import annotations

import copy
import gc
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from commgym.collectives import CommConfig, CompressionSpec, GradientSynchronizer
from commgym.env.measure import LinkProbe  # noqa: F401 - its old home, re-exported

__all__ = ["bench_allgather", "bench_allreduce", "bench_sync", "shard_batches", "timed_steps"]


def bench_allreduce(msg: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Time fp32 all-reduces of ``msg["sizes_bytes"]`` (median of ``msg["repeats"]``).

    Used by ``commgym bench netem`` and the network tests: a barrier precedes each timed
    call so every rank starts together.
    """
    out = {}
    for size in msg["sizes_bytes"]:
        buf = torch.ones(max(1, int(size) // 4), dtype=torch.float32, device=device)
        dist.all_reduce(buf)  # warm-up (connections, allocations)
        times = []
        for _ in range(int(msg.get("repeats", 3))):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        out[str(int(size))] = statistics.median(times)
    return {"type": "bench", "seconds": out}


def bench_allgather(msg: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Time fp32 all-gathers whose *gathered* size is ``msg["sizes_bytes"]``.

    Each rank contributes ``size / world_size`` bytes; median of ``msg["repeats"]`` timed
    calls, each after a barrier (as :func:`bench_allreduce`).
    """
    world = dist.get_world_size()
    out = {}
    for size in msg["sizes_bytes"]:
        part = max(1, int(size) // 4 // world)
        buf = torch.ones(part, dtype=torch.float32, device=device)
        outs = [torch.empty_like(buf) for _ in range(world)]
        dist.all_gather(outs, buf)  # warm-up
        times = []
        for _ in range(int(msg.get("repeats", 3))):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_gather(outs, buf)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        out[str(int(size))] = statistics.median(times)
    return {"type": "bench", "seconds": out}


def shard_batches(
    workload: Any, rank: int, world_size: int, batch_size: int, count: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's shard of ``count`` global batches of the workload's training data.

    The training split is shuffled with ``seed`` (equal on every rank); global batch ``i``
    holds ``world_size * batch_size`` consecutive samples (wrapping around) of which rank
    ``r`` takes the ``r``-th slice. The batches :func:`bench_sync` times (public so that a
    script can time its own steps on the same data).

    Returns:
        ``count`` pairs ``(x, y)``: ``x`` of ``batch_size`` rows in the workload's input
        shape and dtype, ``y`` the ``batch_size`` labels.
    """
    data = workload.load_data()
    n = len(data.train_x)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    batches = []
    for i in range(count):
        start = (i * world_size + rank) * batch_size
        idx = perm[torch.arange(start, start + batch_size) % n]
        batches.append((data.train_x[idx].contiguous(), data.train_y[idx].contiguous()))
    return batches


def timed_steps(
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    warmup: int,
    step: Callable[[torch.Tensor, torch.Tensor], Any],
) -> tuple[list[float], list[Any]]:
    """``step(x, y)`` on every batch, each timed whole; the first ``warmup`` not kept.

    Barriers separate the configuration from the one before and the warm-up from the
    measured steps (never inside a timed step): a collective, so every rank of the default
    process group calls it. :func:`bench_sync`'s loop, public for scripts that time their
    own steps the same way.

    Returns:
        ``(seconds per measured step, what step returned for each)``.
    """
    times: list[float] = []
    outs: list[Any] = []
    gc.collect()
    dist.barrier()
    for i, (x, y) in enumerate(batches):
        if i == warmup:
            dist.barrier()
        t0 = time.perf_counter()
        out = step(x, y)
        t1 = time.perf_counter()
        if i >= warmup:
            times.append(t1 - t0)
            outs.append(out)
    dist.barrier()
    return times, outs


def _run_config(
    base: nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Any,
    warmup: int,
    bucket_mb: float,
    lr: float,
    spec: str | None,
    sync_period: int = 1,
) -> tuple[list[float], list[dict[str, Any]], nn.Module]:
    """One configuration from ``base``'s weights: torch DDP (``spec`` None) or ours.

    Returns:
        ``(seconds per measured step, ours' per-step statistics (none for DDP), the
        trained model)``.
    """
    model = copy.deepcopy(base)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if spec is None:
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)

        def ddp_step(x: torch.Tensor, y: torch.Tensor) -> None:
            opt.zero_grad()
            loss_fn(ddp(x), y).backward()  # gradients all-reduced by DDP's reducer
            opt.step()

        times, _ = timed_steps(batches, warmup, ddp_step)  # DDP's reducer goes with this frame
        return times, [], model
    sync = GradientSynchronizer(
        model, CommConfig(spec, bucket_mb=bucket_mb, sync_period=sync_period), error_every=0
    )

    def step(x: torch.Tensor, y: torch.Tensor) -> tuple[Any, Any]:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        st = sync.synchronize()
        opt.step()
        return st, sync.after_optimizer_step()

    times, stats = timed_steps(batches, warmup, step)
    sync.remove_hooks()
    rows = [
        {
            "bytes_sent": s.bytes_sent + a.bytes_sent,
            "averaged": a.averaged,
            "compute_s": s.compute_s,
            "comm_wait_s": s.comm_wait_s,
            "compress_s": s.compress_s,
            "collectives": s.collectives,
            "bucket_bytes": list(s.bucket_bytes),
        }
        for s, a in stats
    ]
    return times, rows, model


def _max_abs_diff(a: nn.Module, b: nn.Module) -> float:
    with torch.no_grad():
        return max(
            float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True)
        )


def bench_sync(msg: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """DDP against ours on this rank, interleaved (every rank runs it; all get the result).

    For every round: DDP, then ours with ``none``, then ours with each other spec of
    ``compressors`` (duplicates and ``none`` are measured once); each configuration
    starts from the same initial weights, runs ``warmup`` unmeasured and ``steps``
    measured steps over the same batches. A step is ``zero_grad`` + forward + backward +
    (DDP's implicit all-reduce | ``synchronize()``) + ``optimizer.step()`` (+
    ``after_optimizer_step()``), timed whole with ``time.perf_counter``. Configurations
    are separated by barriers, never inside the timed steps.

    Args:
        msg: the ``sync_bench`` command: ``workload`` (a ``WORKLOADS`` name; its model,
            loss and training data), ``steps`` (>= 1), ``warmup`` (>= 0), ``bucket_mb``,
            ``compressors`` (spec strings), ``rounds`` (>= 1), ``batch_size`` (samples
            per rank per step), ``seed`` (weights and data order), ``sync_period``
            (local-SGD period of ours; DDP synchronises every step) and ``lr`` (SGD with
            momentum 0.9).
        device: this rank's device (CPU: the benchmark runs on gloo ranks).

    Returns:
        ``configs`` (ordered names), ``step_s[config]`` (per round, per step: seconds of
        the slowest rank), ``ours[config]`` (per round, per step: this rank's
        ``StepStats`` fields), ``numel``, ``param_bytes``, ``max_param_diff_ddp_vs_none``
        (largest absolute difference of the final weights of DDP and ours-``none`` over
        rounds; ~0 when both compute the same training; ``None`` at ``sync_period > 1``),
        ``median_step_s_rank0`` and what ran (``sync_period``, ``world_size``,
        ``torch_version``, ``num_threads``, ``batch_size``, ``seed``).

    Raises:
        ValueError: bad counts or an unknown spec.
        RuntimeError: a non-finite step time.
    """
    from commgym.env.workloads import get_workload

    steps, warmup, rounds = int(msg["steps"]), int(msg["warmup"]), int(msg["rounds"])
    batch_size, seed, sync_period = int(msg["batch_size"]), int(msg["seed"]), msg["sync_period"]
    bucket_mb, lr = float(msg["bucket_mb"]), float(msg.get("lr", 0.01))
    if steps < 1 or warmup < 0 or rounds < 1 or batch_size < 1:
        raise ValueError(
            f"need steps >= 1, warmup >= 0, rounds >= 1, batch_size >= 1; got "
            f"steps={steps}, warmup={warmup}, rounds={rounds}, batch_size={batch_size}"
        )
    specs = ["none"]
    for c in msg["compressors"]:
        s = str(CompressionSpec.parse(c))
        if s not in specs:
            specs.append(s)
    rank, world = dist.get_rank(), dist.get_world_size()
    wl = get_workload(msg["workload"])
    torch.manual_seed(seed)
    base = wl.build_model().to(device)
    batches = shard_batches(wl, rank, world, batch_size, warmup + steps, seed)
    configs = ["ddp", *specs]
    local: dict[str, list[list[float]]] = {c: [] for c in configs}
    ours: dict[str, list[list[dict[str, Any]]]] = {s: [] for s in specs}
    max_diff = 0.0
    setup = (base, batches, wl.loss_fn, warmup, bucket_mb, lr)
    for _ in range(rounds):
        times, _, ddp_model = _run_config(*setup, None)
        local["ddp"].append(times)
        for spec in specs:
            times, rows, ours_model = _run_config(*setup, spec, sync_period)
            local[spec].append(times)
            ours[spec].append(rows)
            if spec == "none" and sync_period == 1:
                max_diff = max(max_diff, _max_abs_diff(ddp_model, ours_model))
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, local)
    step_s = {
        c: [[max(g[c][r][i] for g in gathered) for i in range(steps)] for r in range(rounds)]
        for c in configs
    }
    median_rank0 = {c: statistics.median([t for r in local[c] for t in r]) for c in configs}
    if not all(math.isfinite(v) for v in median_rank0.values()):
        raise RuntimeError(f"non-finite step times: {median_rank0}")
    return {
        "configs": configs,
        "step_s": step_s,
        "ours": ours,
        "numel": sum(p.numel() for p in base.parameters()),
        "param_bytes": sum(p.numel() * p.element_size() for p in base.parameters()),
        "max_param_diff_ddp_vs_none": max_diff if sync_period == 1 else None,
        "median_step_s_rank0": median_rank0,
        "sync_period": sync_period,
        "world_size": world,
        "torch_version": torch.__version__,
        "num_threads": torch.get_num_threads(),
        "batch_size": batch_size,
        "seed": seed,
    }
