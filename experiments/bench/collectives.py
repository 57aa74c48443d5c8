"""``commgym bench collectives``: all-reduce / all-gather on real ranks, the alpha-beta prior.

Times all-reduce and all-gather of a few sizes on real ranks (the worker's
``allreduce_bench`` / ``allgather_bench`` commands) and fits the alpha-beta prior of the
surrogate (:class:`~commgym.env.surrogate.AlphaBeta`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["run_collectives_benchmark"]

console = Console()


def run_collectives_benchmark(
    world_size: int = 2,
    sizes_kb: list[float] | None = None,
    repeats: int = 5,
    json_path: str | Path | None = None,
) -> dict[str, Any]:
    """Time collectives on ``world_size`` gloo ranks and fit alpha and beta.

    Returns:
        ``{"samples": [[kind, W, bytes, s], ...], "alpha_s", "beta_s_per_byte"}``; the
        JSON file (if given) holds ``samples`` only, as ``fit_surrogate`` reads it.
    """
    from commgym.env.cluster import Cluster, LaunchConfig
    from commgym.env.surrogate import AlphaBeta, bench_collectives

    sizes = [int(kb * 1024) for kb in (sizes_kb or [4, 64, 512, 4096])]
    cluster = Cluster(world_size, LaunchConfig(timeout_s=600))
    try:
        cluster.start()
        samples = bench_collectives(cluster, sizes, repeats)
    finally:
        cluster.close()
    ab = AlphaBeta.fit(samples)
    table = Table(title=f"collectives on {world_size} gloo ranks (median of {repeats})")
    for col in ("collective", "bytes", "measured ms", "alpha-beta ms"):
        table.add_column(col, justify="right")
    for kind, w, n, t in samples:
        model = ab.allreduce_s(n, w) if kind == "allreduce" else ab.allgather_s(n, w)
        table.add_row(kind, f"{n:,.0f}", f"{t * 1e3:.3f}", f"{model * 1e3:.3f}")
    console.print(table)
    console.print(
        f"alpha = {ab.alpha_s * 1e6:.1f} us, beta = {ab.beta_s_per_byte * 1e9:.3f} ns/B "
        f"({1 / ab.beta_s_per_byte / 1e9 if ab.beta_s_per_byte else float('inf'):.2f} GB/s)"
    )
    if json_path is not None:
        Path(json_path).write_text(json.dumps(samples))
    return {"samples": samples, "alpha_s": ab.alpha_s, "beta_s_per_byte": ab.beta_s_per_byte}
