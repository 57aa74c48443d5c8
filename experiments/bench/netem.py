"""``commgym bench netem``: all-reduce bus bandwidth over the emulated network.

For every named profile and world size, ranks run in their own network namespaces (one
torchrun agent each, exactly the env's multi-node path) and time fp32 all-reduces of
1-64 MiB. Bus bandwidth follows nccl-tests: ``busbw = size / t * 2 (W - 1) / W``; it is
printed next to the configured link rate as a ratio.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["run_netem_benchmark"]


def run_netem_benchmark(
    profiles: list[str],
    world_sizes: list[int],
    sizes_mb: list[float],
    repeats: int = 3,
    json_path: str | None = None,
) -> list[dict[str, Any]]:
    """Measure and print all-reduce bus bandwidth for each profile and world size.

    Args:
        profiles: profile names or spec strings (see ``commgym.env.net.PROFILES``).
        world_sizes: rank counts (each rank in its own namespace).
        sizes_mb: buffer sizes in MiB.
        repeats: timed all-reduces per size (median reported).
        json_path: also write the rows as JSON here.

    Returns:
        One dict per (profile, world size, size) with seconds, busbw and ratio.

    Raises:
        RuntimeError: network emulation is not available on this machine.
    """
    from commgym.env.cluster import Cluster, LaunchConfig
    from commgym.env.net import EmulatedNetwork, NetworkSpec, delay_available, netem_available

    ok, why = netem_available()
    if not ok:
        raise RuntimeError(f"network emulation unavailable: {why}")
    console = Console(width=140)
    has_delay, delay_why = delay_available()
    if not has_delay:
        console.print(
            f"[yellow]note:[/yellow] {delay_why}: delay/jitter/loss are dropped, rates still apply"
        )
    rows: list[dict[str, Any]] = []
    for profile in profiles:
        spec = NetworkSpec.parse(profile)
        for world in world_sizes:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                net = EmulatedNetwork(world, spec, strict=False)
            cluster = Cluster(world, LaunchConfig(timeout_s=600), network=net)
            try:
                cluster.start()
                sizes = [int(mb * 1024 * 1024) for mb in sizes_mb]
                secs = cluster.command(
                    {"cmd": "allreduce_bench", "sizes_bytes": sizes, "repeats": repeats},
                    timeout_s=1800,
                )[0]["seconds"]
                for size in sizes:
                    t = float(secs[str(size)])
                    busbw = size * 8 / t * 2 * (world - 1) / world
                    rows.append(
                        {
                            "profile": profile,
                            "applied": str(net.effective_spec)
                            if hasattr(net, "effective_spec")
                            else str(spec),
                            "world_size": world,
                            "size_mb": size / 2**20,
                            "seconds": t,
                            "busbw_gbit_s": busbw / 1e9,
                            "rate_gbit_s": spec.rate_bit_s / 1e9,
                            "ratio": busbw / spec.rate_bit_s,
                        }
                    )
            finally:
                cluster.close()
                net.close()
    table = Table(title="all-reduce bus bandwidth over emulated links (busbw = size/t * 2(W-1)/W)")
    for col in (
        "profile",
        "applied",
        "W",
        "MiB",
        "ms",
        "busbw Gbit/s",
        "configured Gbit/s",
        "ratio",
    ):
        table.add_column(col, justify="left" if col in ("profile", "applied") else "right")
    for r in rows:
        table.add_row(
            r["profile"],
            r["applied"],
            str(r["world_size"]),
            f"{r['size_mb']:g}",
            f"{r['seconds'] * 1e3:.1f}",
            f"{r['busbw_gbit_s']:.3f}",
            f"{r['rate_gbit_s']:g}",
            f"{r['ratio']:.2f}",
        )
    console.print(table)
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=2))
    return rows
