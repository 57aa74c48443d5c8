"""``commgym bench kernels``: compression-kernel throughput next to a device copy.

For each buffer size, one run measures on the same device:

* a plain device-to-device copy of the fp32 buffer (``dst.copy_(src)``), the bandwidth
  ceiling every kernel is compared against;
* every fused kernel of :mod:`commgym.collectives.kernels.triton_kernels` (CUDA only);
* the same operation as the torch-op chain of
  :mod:`commgym.collectives.kernels.reference`.

Throughput is *algorithmic* bytes read + written per call divided by the median time:
the bytes a single fused pass must move (e.g. quantise: read ``x`` and ``residual``,
write ``residual``, codes and scales), not what an implementation actually moves, so a
kernel that makes extra passes shows a lower ratio to copy. GPU times come from CUDA
events around each call (one synchronisation after all repeats, outside the measured
calls); CPU times from ``time.perf_counter``.

Targets on a GPU: quantise/dequantise >= 0.5x copy throughput at >= 16 MiB, and >= 3x
faster than the torch-op chain. On CPU the fused kernels are the numba ones of
:mod:`commgym.collectives.kernels.cpu_kernels` (one intra-op thread by default, as each
rank of a CPU job has), and the targets are times relative to copying the same buffer
(:data:`CPU_TARGETS`); buffer sizes are capped at :data:`CPU_MAX_MB` (the reference's top-k
takes seconds beyond). On CPU each timed kernel call is paired with a copy timed right
before it, and the time relative to copy is the median of those per-pair ratios, so a
shared machine's load, which changes from one second to the next, cancels out of the
ratio. ``compare_compile`` also measures ``torch.compile`` (Inductor's C++
code) of the reference int8 quantiser, with its compile time, as the alternative to numba.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from commgym.collectives import kernels
from commgym.collectives.kernels import reference

__all__ = [
    "COPY_RATIO_TARGET",
    "CPU_MAX_MB",
    "CPU_TARGETS",
    "DENSITY",
    "SPEEDUP_TARGET",
    "run_kernel_benchmark",
]

#: Fused quantise/dequantise throughput as a fraction of copy throughput (>= 16 MiB).
COPY_RATIO_TARGET = 0.5
#: Speed-up of the fused kernels over the torch-op chain.
SPEEDUP_TARGET = 3.0
#: Largest buffer measured on CPU (the reference's top-k takes seconds beyond this).
CPU_MAX_MB = 16.0
#: Density of the top-k / random-k measurements.
DENSITY = 0.01
#: CPU targets: kernel-name prefix -> (target, goal) for time / time of copying the buffer.
CPU_TARGETS: dict[str, tuple[float, float]] = {
    "quantize int8": (2.0, 1.6),  # the traffic floor: read x, r; write r, codes ~1.6x
    "quantize int4": (8.0, 4.0),
    "dequantize": (4.0, 4.0),
    "topk": (5.0, 3.0),
    "randomk 0.01 gather": (10.0, 10.0),
}

_MiB = 1 << 20


def _timer(device: torch.device) -> Callable[[Callable[[], Any], int], list[float]]:
    """A function ``measure(fn, repeats) -> seconds per call`` for ``device``."""
    if device.type == "cuda":

        def measure(fn: Callable[[], Any], repeats: int) -> list[float]:
            fn()  # warm-up: JIT compilation, allocator
            torch.cuda.synchronize(device)
            events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(repeats)
            ]
            for start, end in events:
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize(device)
            return [start.elapsed_time(end) / 1e3 for start, end in events]

        return measure

    def measure_cpu(fn: Callable[[], Any], repeats: int) -> list[float]:
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return times

    return measure_cpu


def _paired_cpu(
    fn: Callable[[], Any], copy: Callable[[], Any], repeats: int
) -> tuple[list[float], list[float]]:
    """``repeats`` pairs (copy, then ``fn``), each call timed: ``(fn seconds, copy seconds)``."""
    fn()
    copy()
    times, copies = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        copy()
        t1 = time.perf_counter()
        fn()
        t2 = time.perf_counter()
        copies.append(t1 - t0)
        times.append(t2 - t1)
    return times, copies


def _cases(n: int, device: torch.device, impl) -> list[tuple[str, int, Callable[[], Any]]]:
    """``(name, algorithmic bytes, call)`` for every operation, using module ``impl``."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(n, generator=gen).to(device)
    residual = torch.zeros(n, device=device)
    out = torch.zeros(n, device=device)
    k = reference.topk_k(n, DENSITY)
    nch = reference.num_chunks(n)
    cases: list[tuple[str, int, Callable[[], Any]]] = []
    for bits in (8, 4, 2):
        nbytes = reference.packed_nbytes(n, bits)
        codes = torch.empty(nbytes, dtype=torch.uint8, device=device)
        scales = torch.empty(nch, dtype=torch.float32, device=device)
        # read x, residual; write residual, codes, scales
        q_bytes = 12 * n + nbytes + 4 * nch
        cases.append(
            (
                f"quantize int{bits} +EF",
                q_bytes,
                lambda b=bits, c=codes, s=scales: impl.quantize_ef(
                    x, residual, b, out_codes=c, out_scales=s
                ),
            )
        )
        reference.quantize_ef(x, None, bits, out_codes=codes, out_scales=scales)
        # read codes, scales, out; write out
        cases.append(
            (
                f"dequantize int{bits} +acc",
                8 * n + nbytes + 4 * nch,
                lambda b=bits, c=codes, s=scales: impl.dequantize_accumulate(c, s, b, out),
            )
        )
    idx, _ = reference.randomk_indices(n, k, 1, device)
    values = torch.randn(k, generator=gen).to(device)
    # top-k: read x, residual; write residual, k values + k int32 indices
    cases.append((f"topk {DENSITY:g} +EF", 12 * n + 8 * k, lambda: impl.topk_ef(x, residual, k)))
    # random-k indices: write k int64 indices and k int64 stratum sizes
    cases.append(
        (f"randomk {DENSITY:g} indices", 16 * k, lambda: impl.randomk_indices(n, k, 1, device))
    )
    # random-k gather: read x, residual, k indices; write residual, k values
    cases.append(
        (
            f"randomk {DENSITY:g} gather +EF",
            12 * n + 12 * k,
            lambda: impl.randomk_gather_ef(x, residual, idx),
        )
    )
    # random-k scatter: write out; read k values and k indices
    cases.append(
        (
            f"randomk {DENSITY:g} scatter",
            4 * n + 12 * k,
            lambda: impl.randomk_scatter(values, idx, out),
        )
    )
    return cases


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False")
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', got {device!r}")
    return dev


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def run_kernel_benchmark(
    sizes_mb: Sequence[float] | None = None,
    repeats: int = 10,
    device: str = "auto",
    *,
    threads: int = 1,
    compare_compile: bool = False,
    console: Console | None = None,
) -> dict[str, Any]:
    """Measure every compression kernel against a device copy and the torch-op chain.

    Args:
        sizes_mb: fp32 buffer sizes in MiB (> 0); ``None``: 4.5 and 16 on CPU (a 1.1 M
            parameter MLP's bucket and a larger one), 16, 64 and 256 on CUDA. On CPU sizes
            above :data:`CPU_MAX_MB` are skipped (and the output says so).
        repeats: timed calls per measurement (>= 1); the median is reported. Each
            measurement is preceded by one untimed warm-up call (Triton JIT compile).
        device: ``"auto"`` (CUDA when available), ``"cuda"`` or ``"cpu"``.
        threads: torch intra-op threads on CPU (>= 1); the numba kernels use one.
        compare_compile: also time ``torch.compile`` of the reference int8 quantiser (CPU
            only; the first compile takes tens of seconds on 2 cores).
        console: rich console to print to (default: stdout, at least 120 columns).

    Returns:
        ``{"device", "fused_available", "skipped_mb", "rows"}`` where each row holds
        ``size_mb``, ``kernel``, ``bytes``, ``copy_gbps`` and, per implementation
        (``fused`` / ``reference``), median seconds ``*_s``, ``*_gbps`` and
        ``*_vs_copy``, plus ``speedup`` (reference time / fused time) when both ran.

    Raises:
        ValueError: bad sizes, repeats or device (including ``cuda`` without a GPU).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    dev = _resolve_device(device)
    if sizes_mb is None:
        sizes_mb = (4.5, 16) if dev.type == "cpu" else (16, 64, 256)
    sizes = [float(s) for s in sizes_mb]
    if not sizes or any(not (s > 0) for s in sizes):
        raise ValueError(f"sizes_mb must be non-empty and > 0 MiB, got {list(sizes_mb)!r}")
    if dev.type == "cpu":
        torch.set_num_threads(threads)
    if console is None:
        console = Console()
        if not console.is_terminal or console.width < 120:
            console = Console(width=120)

    probe = torch.empty(0, device=dev)
    fused = kernels.backend_for(probe)
    if fused is reference:
        fused = None
    elif dev.type == "cpu":
        kernels.warmup("cpu")  # numba compiles (or loads its cache) outside the timings
    skipped = [s for s in sizes if dev.type == "cpu" and s > CPU_MAX_MB]
    sizes = [s for s in sizes if s not in skipped]

    if dev.type == "cpu":
        console.print(
            "[bold yellow]CPU run: the fused kernels are the numba ones "
            f"({'available' if fused is not None else 'NOT available: pip install numba'}); "
            "the Triton kernels and the GPU targets need a CUDA device.[/]"
        )
        if skipped:
            console.print(
                f"[yellow]Sizes above {CPU_MAX_MB:g} MiB are skipped on CPU: "
                f"{', '.join(f'{s:g}' for s in skipped)} MiB.[/]"
            )
    elif fused is None:
        console.print(
            "[bold yellow]Triton is not importable: CUDA runs the reference only "
            "(pip install commgym[kernels]).[/]"
        )
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    console.print(
        f"[dim]device {name}, torch {torch.__version__}, {repeats} timed calls per "
        f"measurement (median), density {DENSITY:g} for top-k / random-k[/]"
    )

    measure = _timer(dev)
    rows: list[dict[str, Any]] = []
    rows_compile: list[dict[str, Any]] = []
    for size in sizes:
        n = max(1, int(size * _MiB) // 4)
        src = torch.randn(n, device=dev)
        dst = torch.empty_like(src)
        copy_s = statistics.median(measure(lambda s=src, d=dst: d.copy_(s), repeats))
        copy_gbps = _gbps(8 * n, copy_s)
        if compare_compile and dev.type == "cpu":
            rows_compile.append(_measure_compiled_quantize(n, measure, repeats, copy_s, size))
        impls = [("reference", reference)] + ([("fused", fused)] if fused is not None else [])
        per_impl = {label: _cases(n, dev, mod) for label, mod in impls}
        for i, (kernel, nbytes, _) in enumerate(per_impl["reference"]):
            row: dict[str, Any] = {
                "size_mb": size,
                "kernel": kernel,
                "bytes": nbytes,
                "copy_gbps": copy_gbps,
                "copy_s": copy_s,
            }
            for label, cases in per_impl.items():
                if dev.type == "cpu":
                    times, copies = _paired_cpu(
                        cases[i][2], lambda s=src, d=dst: d.copy_(s), repeats
                    )
                    sec = statistics.median(times)
                    vs_copy = statistics.median(t / c for t, c in zip(times, copies, strict=True))
                else:
                    sec = statistics.median(measure(cases[i][2], repeats))
                    vs_copy = sec / copy_s
                row[f"{label}_s"] = sec
                row[f"{label}_gbps"] = _gbps(nbytes, sec)
                row[f"{label}_vs_copy"] = row[f"{label}_gbps"] / copy_gbps
                row[f"{label}_time_vs_copy"] = vs_copy
            if "fused_s" in row:
                row["speedup"] = row["reference_s"] / row["fused_s"]
            rows.append(row)
        del per_impl, src, dst
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    _print_table(console, rows, fused is not None, dev)
    if dev.type == "cpu":
        _print_cpu_verdict(console, rows, fused is not None)
        if rows_compile:
            _print_compile(console, rows_compile, rows)
    else:
        _print_verdict(console, rows, fused is not None)
    return {
        "device": str(dev),
        "threads": torch.get_num_threads() if dev.type == "cpu" else None,
        "fused_available": fused is not None,
        "skipped_mb": skipped,
        "rows": rows,
        "compile_rows": rows_compile,
    }


def _measure_compiled_quantize(
    n: int, measure: Callable[[Callable[[], Any], int], list[float]], repeats: int,
    copy_s: float, size: float,
) -> dict[str, Any]:  # fmt: skip
    """``torch.compile`` of the reference int8 quantiser + EF: compile time and run time."""

    def quantize(x, r, codes, scales):
        reference.quantize_ef(x, r, 8, out_codes=codes, out_scales=scales)

    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    r = torch.zeros(n)
    codes = torch.empty(reference.packed_nbytes(n, 8), dtype=torch.uint8)
    scales = torch.empty(reference.num_chunks(n))
    compiled = torch.compile(quantize, dynamic=False)
    t0 = time.perf_counter()
    compiled(x, r, codes, scales)
    compile_s = time.perf_counter() - t0
    sec = statistics.median(measure(lambda: compiled(x, r, codes, scales), repeats))
    return {"size_mb": size, "compile_s": compile_s, "compiled_s": sec, "copy_s": copy_s}


def _print_compile(
    console: Console, rows_compile: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> None:
    table = Table(title="int8 quantise + EF: torch.compile (Inductor C++) vs numba vs torch ops")
    for col in ("MiB", "compile s", "compiled ms", "compiled/copy", "numba/copy", "ops/copy"):
        table.add_column(col, justify="right")
    for rc in rows_compile:
        match = [
            r for r in rows if r["size_mb"] == rc["size_mb"] and r["kernel"] == "quantize int8 +EF"
        ]
        fused = match[0].get("fused_time_vs_copy") if match else None
        ops = match[0].get("reference_time_vs_copy") if match else None
        table.add_row(
            f"{rc['size_mb']:g}",
            f"{rc['compile_s']:.1f}",
            f"{rc['compiled_s'] * 1e3:.3f}",
            f"{rc['compiled_s'] / rc['copy_s']:.1f}",
            "-" if fused is None else f"{fused:.1f}",
            "-" if ops is None else f"{ops:.1f}",
        )
    console.print(table)


def _print_cpu_verdict(console: Console, rows: list[dict[str, Any]], has_fused: bool) -> None:
    key = "fused_time_vs_copy" if has_fused else "reference_time_vs_copy"
    for prefix, (target, goal) in CPU_TARGETS.items():
        hits = [r for r in rows if r["kernel"].startswith(prefix)]
        if not hits:
            continue
        worst = max(hits, key=lambda r: r[key])
        ok = worst[key] <= target
        console.print(
            f"[{'green' if ok else 'red'}]{'PASS' if ok else 'FAIL'}[/] {prefix}: worst "
            f"{worst[key]:.1f}x the copy time ({worst['kernel']}, {worst['size_mb']:g} MiB); "
            f"target <= {target:g}x, goal <= {goal:g}x"
        )


def _print_table(console: Console, rows: list[dict[str, Any]], has_fused: bool, dev) -> None:
    table = Table(
        title=f"Compression kernels vs device copy ({dev}; GB/s of algorithmic bytes read+written)"
    )
    for col in ("MiB", "kernel", "copy GB/s"):
        table.add_column(col, justify="right" if col != "kernel" else "left")
    table.add_column("copy ms", justify="right")
    if has_fused:
        for col in ("fused ms", "fused GB/s", "fused time/copy"):
            table.add_column(col, justify="right")
    for col in ("torch-op ms", "torch-op GB/s", "torch-op time/copy"):
        table.add_column(col, justify="right")
    if has_fused:
        table.add_column("speed-up", justify="right")
    last = None
    for r in rows:
        if last is not None and r["size_mb"] != last:
            table.add_section()
        last = r["size_mb"]
        cells = [
            f"{r['size_mb']:g}", r["kernel"], f"{r['copy_gbps']:.1f}", f"{r['copy_s'] * 1e3:.3f}"
        ]  # fmt: skip
        if has_fused:
            cells += [
                f"{r['fused_s'] * 1e3:.3f}",
                f"{r['fused_gbps']:.1f}",
                f"{r['fused_time_vs_copy']:.1f}",
            ]
        cells += [
            f"{r['reference_s'] * 1e3:.3f}",
            f"{r['reference_gbps']:.1f}",
            f"{r['reference_time_vs_copy']:.1f}",
        ]
        if has_fused:
            cells.append(f"{r['speedup']:.1f}x")
        table.add_row(*cells)
    console.print(table)


def _print_verdict(console: Console, rows: list[dict[str, Any]], has_fused: bool) -> None:
    if not has_fused:
        console.print(
            f"[yellow]GPU targets (fused quantise/dequantise >= {COPY_RATIO_TARGET:g}x copy and "
            f">= {SPEEDUP_TARGET:g}x over the torch-op chain, at >= 16 MiB) need a CUDA GPU "
            "with Triton: not evaluated in this run.[/]"
        )
        return
    big = [r for r in rows if r["size_mb"] >= 16 and r["kernel"].startswith(("quant", "dequant"))]
    if not big:
        console.print("[yellow]No size >= 16 MiB measured: targets not evaluated.[/]")
        return
    for key, target, what in (
        ("fused_vs_copy", COPY_RATIO_TARGET, "x copy throughput"),
        ("speedup", SPEEDUP_TARGET, "x speed-up over the torch-op chain"),
    ):
        worst = min(big, key=lambda r, key=key: r[key])
        ok = worst[key] >= target
        console.print(
            f"[{'green' if ok else 'red'}]{'PASS' if ok else 'FAIL'}[/] quantise/dequantise "
            f">= {target:g}{what} at >= 16 MiB: worst {worst[key]:.2f} "
            f"({worst['kernel']}, {worst['size_mb']:g} MiB)"
        )
    console.print(
        "[dim]top-k / random-k speed-ups are informational (random-k scatter is a memset "
        "plus a k-element scatter in both implementations).[/]"
    )
