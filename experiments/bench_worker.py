r"""Per-rank code of ``commgym bench sync`` (launched by torchrun, one process per rank).

Every rank builds the same seeded model and the same digits batches, then, for each
round, measures torch ``DistributedDataParallel`` for ``steps`` steps, our
:class:`~commgym.collectives.GradientSynchronizer` with ``none`` for ``steps`` steps, and
then every other compressor, each from the same initial weights. Configurations are
separated by ``torch.distributed.barrier`` (never inside the timed steps). Rank 0 writes
the raw measurements as JSON to ``--out``; :mod:`commgym.experiments.bench` reads and
summarises them.

Launch (what :func:`commgym.experiments.bench.run_sync_benchmark` runs)::

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m commgym.experiments.bench_worker --out /tmp/result.json --model mlp
"""

from __future__ import annotations

import copy
import datetime
import gc
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
import typer
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from commgym.collectives import CommConfig, CompressionSpec, GradientSynchronizer

__all__ = ["MODELS", "build_model", "digits_batches", "main", "measure"]

#: Hidden widths of the benchmark MLPs (input 64 = 8x8 digits, output 10 classes).
_HIDDEN: dict[str, tuple[int, ...]] = {
    "mlp": (1024, 1024),  # ~1.1M parameters, ~4.4 MB of fp32 gradient per step
    "wide": (3072, 3072),  # ~9.7M parameters, ~39 MB of fp32 gradient per step
}


def _mlp(hidden: tuple[int, ...]) -> Callable[[], nn.Module]:
    def factory() -> nn.Module:
        layers: list[nn.Module] = []
        width = 64
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 10))
        return nn.Sequential(*layers)

    return factory


#: Benchmark models by name: factories of freshly initialised (global-RNG) modules.
MODELS: dict[str, Callable[[], nn.Module]] = {name: _mlp(h) for name, h in _HIDDEN.items()}


def build_model(name: str, seed: int) -> nn.Module:
    """Build benchmark model ``name`` with weights drawn from ``seed`` (equal on all ranks).

    Args:
        name: a key of :data:`MODELS` (``"mlp"``: 64-1024-1024-10, ``"wide"``:
            64-3072-3072-10, about 9.7M parameters).
        seed: seed of the weight initialisation.

    Returns:
        An fp32 ``nn.Module`` on CPU mapping ``(batch, 64)`` to ``(batch, 10)`` logits.

    Raises:
        ValueError: unknown model name (the message lists the known ones).
    """
    if name not in MODELS:
        raise ValueError(f"unknown benchmark model {name!r}; known: {sorted(MODELS)}")
    torch.manual_seed(seed)
    return MODELS[name]()


def digits_batches(
    rank: int, world_size: int, batch_size: int, count: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's shard of ``count`` global batches of scikit-learn's bundled digits.

    The data set (1797 8x8 images, no download) is scaled to ``[0, 1]`` and shuffled with
    ``seed``; global batch ``i`` holds ``world_size * batch_size`` consecutive samples
    (wrapping around) of which rank ``r`` takes the ``r``-th slice.

    Args:
        rank: this rank.
        world_size: number of ranks.
        batch_size: samples per rank per step.
        count: number of batches.
        seed: seed of the shuffle (equal on all ranks).

    Returns:
        ``count`` pairs ``(x, y)``: ``x`` float32 ``(batch_size, 64)``, ``y`` int64
        ``(batch_size,)``, on CPU.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    x_all = torch.as_tensor(digits.data, dtype=torch.float32) / 16.0
    y_all = torch.as_tensor(digits.target, dtype=torch.int64)
    n = x_all.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    batches = []
    for i in range(count):
        start = (i * world_size + rank) * batch_size
        idx = perm[torch.arange(start, start + batch_size) % n]
        batches.append((x_all[idx].contiguous(), y_all[idx].contiguous()))
    return batches


def _median(values: list[float]) -> float:
    s = sorted(values)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


def _run_ddp(
    base: nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    warmup: int,
    bucket_mb: float,
    lr: float,
) -> tuple[list[float], nn.Module]:
    from torch.nn.parallel import DistributedDataParallel

    model = copy.deepcopy(base)
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    times: list[float] = []
    gc.collect()
    dist.barrier()
    for i, (x, y) in enumerate(batches):
        if i == warmup:
            dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()  # gradients all-reduced by DDP's reducer
        opt.step()
        t1 = time.perf_counter()
        if i >= warmup:
            times.append(t1 - t0)
    dist.barrier()
    del ddp
    return times, model


def _run_ours(
    *,
    base: nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    warmup: int,
    bucket_mb: float,
    lr: float,
    spec: str,
    sync_period: int = 1,
) -> tuple[list[float], list[dict[str, Any]], nn.Module]:
    model = copy.deepcopy(base)
    sync = GradientSynchronizer(
        model, CommConfig(spec, bucket_mb=bucket_mb, sync_period=sync_period), error_every=0
    )
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    times: list[float] = []
    stats = []
    gc.collect()
    dist.barrier()
    for i, (x, y) in enumerate(batches):
        if i == warmup:
            dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        st = sync.synchronize()
        opt.step()
        avg = sync.after_optimizer_step()
        t1 = time.perf_counter()
        if i >= warmup:
            times.append(t1 - t0)
            stats.append((st, avg))
    dist.barrier()
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


def measure(
    *,
    steps: int,
    warmup: int,
    bucket_mb: float,
    model: str,
    compressors: list[str],
    rounds: int,
    batch_size: int,
    seed: int,
    lr: float = 0.01,
    sync_period: int = 1,
) -> dict[str, Any]:
    """Run the interleaved measurement on this rank (process group already initialised).

    For every round: DDP, then ours with ``none``, then ours with each other spec of
    ``compressors`` (duplicates and ``none`` are measured once); each configuration
    starts from the same initial weights, runs ``warmup`` unmeasured and ``steps``
    measured steps over the same batches. A step is ``zero_grad`` + forward + backward +
    (DDP's implicit all-reduce | ``synchronize()``) + ``optimizer.step()`` (+
    ``after_optimizer_step()``), timed whole with ``time.perf_counter``.

    Args:
        steps: measured steps per configuration and round (>= 1).
        warmup: unmeasured steps before them (>= 0).
        bucket_mb: bucket size in MiB for DDP (``bucket_cap_mb``) and ours.
        model: a key of :data:`MODELS`.
        compressors: compression spec strings.
        rounds: interleaved repetitions (>= 1).
        batch_size: samples per rank per step.
        seed: seed of weights and data order.
        lr: SGD learning rate (momentum 0.9).
        sync_period: local-SGD period of ours (DDP always synchronises every step); with
            ``H > 1`` measure ``steps`` as a multiple of ``H`` so every round averages.

    Returns:
        On every rank, the gathered measurements: ``configs`` (ordered names),
        ``step_s[config]`` (per round, per step: seconds of the slowest rank),
        ``ours[config]`` (per round, per step: rank 0's ``StepStats`` fields),
        ``numel``, ``param_bytes``, ``max_param_diff_ddp_vs_none`` (largest absolute
        difference of the final weights of DDP and ours-``none`` over rounds; ~0 when both
        compute the same training).

    Raises:
        ValueError: bad arguments (unknown model or spec, non-positive counts).
    """
    if steps < 1 or warmup < 0 or rounds < 1 or batch_size < 1:
        raise ValueError(
            f"need steps >= 1, warmup >= 0, rounds >= 1, batch_size >= 1; got "
            f"steps={steps}, warmup={warmup}, rounds={rounds}, batch_size={batch_size}"
        )
    specs = ["none"]
    for c in compressors:
        s = str(CompressionSpec.parse(c))
        if s not in specs:
            specs.append(s)
    rank, world = dist.get_rank(), dist.get_world_size()
    base = build_model(model, seed)
    batches = digits_batches(rank, world, batch_size, warmup + steps, seed)
    configs = ["ddp", *specs]
    local: dict[str, list[list[float]]] = {c: [] for c in configs}
    ours: dict[str, list[list[dict[str, Any]]]] = {s: [] for s in specs}
    max_diff = 0.0
    for _ in range(rounds):
        times, ddp_model = _run_ddp(base, batches, warmup, bucket_mb, lr)
        local["ddp"].append(times)
        for spec in specs:
            times, rows, ours_model = _run_ours(
                base=base, batches=batches, warmup=warmup, bucket_mb=bucket_mb, lr=lr,
                spec=spec, sync_period=sync_period,
            )  # fmt: skip
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
    numel = sum(p.numel() for p in base.parameters())
    return {
        "configs": configs,
        "step_s": step_s,
        "ours": ours,
        "numel": numel,
        "param_bytes": sum(p.numel() * p.element_size() for p in base.parameters()),
        "max_param_diff_ddp_vs_none": max_diff if sync_period == 1 else None,
        "median_step_s_rank0": {c: _median([t for r in local[c] for t in r]) for c in configs},
    }


app = typer.Typer(add_completion=False, help=__doc__, pretty_exceptions_enable=False)


@app.command()
@record  # torchrun's failure summary then carries the rank's traceback
def main(
    *,
    out: str = typer.Option(..., "--out", help="JSON file rank 0 writes the results to."),
    steps: int = typer.Option(30, "--steps", min=1, help="Measured steps per configuration."),
    warmup: int = typer.Option(5, "--warmup", min=0, help="Unmeasured warm-up steps."),
    bucket_mb: float = typer.Option(25.0, "--bucket-mb", help="Bucket size in MiB."),
    model: str = typer.Option("mlp", "--model", help=f"One of {sorted(MODELS)}."),
    compressors: str = typer.Option("none", "--compressors", help="Comma-separated specs."),
    rounds: int = typer.Option(3, "--rounds", min=1, help="Interleaved repetitions."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Samples per rank per step."),
    seed: int = typer.Option(0, "--seed", help="Seed of weights and data order."),
    sync_period: int = typer.Option(1, "--sync-period", min=1, help="Local-SGD period of ours."),
    pg_timeout_s: float = typer.Option(300.0, "--pg-timeout-s", help="gloo collective timeout."),
) -> None:
    """Measure on this rank (torchrun sets RANK/WORLD_SIZE); rank 0 writes ``--out``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=pg_timeout_s))
    try:
        result = measure(
            steps=steps,
            warmup=warmup,
            bucket_mb=bucket_mb,
            model=model,
            compressors=[c.strip() for c in compressors.split(",") if c.strip()],
            rounds=rounds,
            batch_size=batch_size,
            seed=seed,
            sync_period=sync_period,
        )
        if dist.get_rank() == 0:
            result.update(
                sync_period=sync_period,
                world_size=dist.get_world_size(),
                torch_version=torch.__version__,
                num_threads=torch.get_num_threads(),
                batch_size=batch_size,
                seed=seed,
            )
            if not all(math.isfinite(v) for v in result["median_step_s_rank0"].values()):
                raise RuntimeError(f"non-finite step times: {result['median_step_s_rank0']}")
            dest = Path(out)
            tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(result))
            tmp.replace(dest)  # atomic: the parent never reads a half-written file
        dist.barrier()  # all ranks done before the group is torn down
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    app()
