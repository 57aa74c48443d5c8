"""The benchmark commands a rank runs (:mod:`commgym.env.worker`'s benchmark mode).

Every benchmark that needs real ranks starts them the one way the env does
(:class:`~commgym.env.cluster.Cluster`, torchrun, the same worker) and sends one of these
commands; each rank answers with what it measured:

``allreduce_bench``  :func:`bench_allreduce`: plain fp32 all-reduces of given sizes
                     (``commgym bench netem``, the network tests).
``allgather_bench``  :func:`bench_allgather`: fp32 all-gathers of given total sizes (the
                     surrogate's alpha-beta prior, ``commgym bench collectives``).
``sync_bench``       :func:`bench_sync`: torch ``DistributedDataParallel`` against
                     :class:`~commgym.collectives.GradientSynchronizer`, interleaved step
                     by step on the same model, weights and batches (``commgym bench
                     sync``).

Measured regions hold no messaging: a command is received, run, and answered once.
"""

from __future__ import annotations

import copy
import gc
import math
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from commgym.collectives import CommConfig, CompressionSpec, GradientSynchronizer
from commgym.env.measure import LinkProbe  # noqa: F401 - its old home, re-exported

__all__ = [
    "bench_allgather",
    "bench_allreduce",
    "bench_sync",
    "interleaved_steps",
    "shard_batches",
]


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


class _Runner:
    """One configuration's replica, optimizer and step: torch DDP (``spec`` None) or ours."""

    def __init__(
        self,
        base: nn.Module,
        loss_fn: Any,
        bucket_mb: float,
        lr: float,
        spec: str | None,
        sync_period: int,
    ) -> None:
        self.model = copy.deepcopy(base)
        self.loss_fn = loss_fn
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.stats: list[tuple[Any, Any]] = []
        self.sync: GradientSynchronizer | None = None
        self.ddp: nn.Module | None = None
        if spec is None:
            from torch.nn.parallel import DistributedDataParallel

            self.ddp = DistributedDataParallel(self.model, bucket_cap_mb=bucket_mb)
        else:
            self.sync = GradientSynchronizer(
                self.model,
                CommConfig(spec, bucket_mb=bucket_mb, sync_period=sync_period),
                # as the env's ranks and CommScheduler run it: no per-step statistics
                # beyond the exchange (they ask for them on a decision's last step)
                error_every=0,
                grad_norm_every=0,
            )

    def step(self, x: torch.Tensor, y: torch.Tensor, keep: bool) -> None:
        opt, sync = self.opt, self.sync
        opt.zero_grad()
        if sync is None:
            assert self.ddp is not None
            self.loss_fn(self.ddp(x), y).backward()  # all-reduced by DDP's reducer
            opt.step()
            return
        self.loss_fn(self.model(x), y).backward()
        st = sync.synchronize()
        opt.step()
        avg = sync.after_optimizer_step()
        if keep:
            self.stats.append((st, avg))

    def close(self) -> list[dict[str, Any]]:
        """Remove ours' hooks; ours' per-measured-step statistics (none for DDP)."""
        if self.sync is None:
            self.ddp = None  # DDP's reducer goes with it
            return []
        self.sync.remove_hooks()
        return [
            {
                "bytes_sent": s.bytes_sent + a.bytes_sent,
                "averaged": a.averaged,
                "compute_s": s.compute_s,
                "comm_wait_s": s.comm_wait_s,
                "compress_s": s.compress_s,
                "collectives": s.collectives,
                "bucket_bytes": list(s.bucket_bytes),
            }
            for s, a in self.stats
        ]


def interleaved_steps(
    runners: list[_Runner],
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    warmup: int,
) -> list[list[float]]:
    """Every runner's step on every batch, interleaved step by step; each timed whole.

    Batch ``i`` is stepped by every runner in turn, the order rotated by one each batch
    (A B, B A, ... for two) so that neither goes first more often: a slow spell of the
    machine (this benchmark's main noise on a shared host, seconds long) falls on
    neighbouring steps of every configuration alike instead of on one configuration's
    block. Barriers separate the warm-up from the measured steps (never inside a timed
    step): a collective, so every rank of the default process group calls it.

    Returns:
        Per runner, the seconds of each measured step (``len(batches) - warmup``).
    """
    times: list[list[float]] = [[] for _ in runners]
    n = len(runners)
    gc.collect()
    dist.barrier()
    for i, (x, y) in enumerate(batches):
        if i == warmup:
            dist.barrier()
        keep = i >= warmup
        for k in range(n):
            j = (i + k) % n
            t0 = time.perf_counter()
            runners[j].step(x, y, keep)
            t1 = time.perf_counter()
            if keep:
                times[j].append(t1 - t0)
    dist.barrier()
    return times


def _max_abs_diff(a: nn.Module, b: nn.Module) -> float:
    with torch.no_grad():
        return max(
            float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True)
        )


def bench_sync(msg: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """DDP against ours on this rank, interleaved (every rank runs it; all get the result).

    For every round: DDP, ours with ``none`` and ours with each other spec of
    ``compressors`` (duplicates and ``none`` are measured once), each its own replica
    from the same initial weights, run ``warmup`` unmeasured and ``steps`` measured steps
    over the same batches, interleaved step by step (:func:`interleaved_steps`: batch
    ``i`` is stepped by every configuration in turn, the order rotated each batch). A step
    is ``zero_grad`` + forward + backward + (DDP's implicit all-reduce |
    ``synchronize()``) + ``optimizer.step()`` (+ ``after_optimizer_step()``), timed whole
    with ``time.perf_counter``; barriers only between the warm-up and the measured steps.

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
    for _ in range(rounds):
        # every configuration from the same initial weights and batches, stepped in turn
        runners = [
            _Runner(base, wl.loss_fn, bucket_mb, lr, spec, sync_period) for spec in [None, *specs]
        ]
        times = interleaved_steps(runners, batches, warmup)
        for c, runner, t in zip(configs, runners, times, strict=True):
            local[c].append(t)
            rows = runner.close()
            if c != "ddp":
                ours[c].append(rows)
        if sync_period == 1:
            max_diff = max(max_diff, _max_abs_diff(runners[0].model, runners[1].model))
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
