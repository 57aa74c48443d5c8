"""Codec time and payload of each compression entry, measured by the kernels on this host.

The simulator's codec part: one compressor (``make_compressor``) encodes and decodes one
bucket of the workload's real parameter shapes (:class:`~commgym.collectives.BucketPlan`'s
shapes, DDP's bucket assignment) exactly as the synchronizer does (``compress``, every
``advance`` round, :func:`~commgym.collectives.exchange.decode`), with error feedback on.
What comes back is measured, not assumed: the payload tensors each round hands to
collectives (their count and bytes) and the wall time of the codec, median of repeats.
Collectives are not run (the wire is :mod:`commgym.env.sim.wire`'s part): an all-gathered
payload is decoded from ``W`` copies of this rank's own.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["CodecMeasurement", "measure_codec"]


@dataclass(frozen=True)
class CodecMeasurement:
    """One compression spec on one bucket.

    Attributes:
        spec: the compression spec string.
        kind: ``"allreduce"`` (summable payloads) or ``"allgather"``.
        bucket_bytes: the fp32 bucket's size, B.
        round_bytes: per communication round, the bytes handed to collectives.
        round_collectives: per round, the collectives issued (non-empty payload tensors).
        codec_s: compress + advance + decode wall time, s (median).
    """

    spec: str
    kind: str
    bucket_bytes: int
    round_bytes: tuple[int, ...]
    round_collectives: tuple[int, ...]
    codec_s: float

    @property
    def payload_bytes(self) -> int:
        """Bytes handed to collectives for the bucket, all rounds."""
        return int(sum(self.round_bytes))

    def to_dict(self) -> dict[str, Any]:
        """Plain values."""
        d = asdict(self)
        d["round_bytes"] = list(self.round_bytes)
        d["round_collectives"] = list(self.round_collectives)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CodecMeasurement:
        """Inverse of :meth:`to_dict`."""
        return cls(
            str(d["spec"]),
            str(d["kind"]),
            int(d["bucket_bytes"]),
            tuple(int(x) for x in d["round_bytes"]),
            tuple(int(x) for x in d["round_collectives"]),
            float(d["codec_s"]),
        )


def measure_codec(
    spec: str,
    shapes: list[tuple[int, ...]],
    world_size: int,
    *,
    repeats: int = 7,
    threads: int = 1,
) -> CodecMeasurement:
    """Time one bucket's codec and record its payload.

    Args:
        spec: compression spec (``"topk:0.01"``).
        shapes: the bucket's parameter shapes, in bucket order.
        world_size: ranks (payloads are pre-divided and gathered for this many).
        repeats: timed repetitions after one warm-up (median reported).
        threads: torch intra-op threads while timing (the ranks' ``threads_per_rank``).

    Returns:
        The :class:`CodecMeasurement`.

    Raises:
        ValueError: an invalid spec or empty ``shapes``.
    """
    from commgym.collectives.compressors import BucketLayout, make_compressor
    from commgym.collectives.exchange import decode

    if not shapes:
        raise ValueError("measure_codec needs at least one parameter shape")
    comp = make_compressor(spec, seed=0, error_feedback=True, world_size=world_size)
    layout = BucketLayout("sim-codec", tuple(torch.Size(s) for s in shapes))
    n = layout.numel
    gen = torch.Generator().manual_seed(0)
    flat = torch.randn(n, generator=gen) / world_size
    residual = torch.zeros(n)
    out = torch.empty(n)
    kind = "allreduce" if comp.summable else "allgather"
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    round_bytes: list[int] = []
    round_coll: list[int] = []
    times: list[float] = []
    try:
        for i in range(repeats + 1):
            rb, rc = [], []
            t0 = time.perf_counter()
            payload, ctx = comp.compress(flat, layout, residual)
            rb.append(sum(t.numel() * t.element_size() for t in payload))
            rc.append(sum(1 for t in payload if t.numel()))
            for r in range(1, comp.rounds):
                payload = comp.advance(r, payload, ctx)
                rb.append(sum(t.numel() * t.element_size() for t in payload))
                rc.append(sum(1 for t in payload if t.numel()))
            gathered = payload if comp.summable else [t.repeat(world_size) for t in payload]
            decode(comp, gathered, ctx, out, world_size)
            dt = time.perf_counter() - t0
            if i:
                times.append(dt)
            round_bytes, round_coll = rb, rc
    finally:
        torch.set_num_threads(prev_threads)
    return CodecMeasurement(
        spec=str(spec),
        kind=kind,
        bucket_bytes=4 * n,
        round_bytes=tuple(round_bytes),
        round_collectives=tuple(round_coll),
        codec_s=statistics.median(times),
    )
