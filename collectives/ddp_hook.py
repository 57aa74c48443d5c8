"""Use any commgym compressor from plain ``DistributedDataParallel``."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from commgym.collectives.compressors import BucketLayout, Compressor, make_compressor
from commgym.collectives.exchange import all_gather_flat
from commgym.collectives.residual import ResidualMemory
from commgym.collectives.spec import CompressionSpec

__all__ = ["DDPHookState", "ddp_comm_hook"]


@dataclass
class DDPHookState:
    """State of a commgym DDP communication hook (checkpointable via ``state_dict``).

    Attributes:
        compressor: the compressor instance.
        error_feedback: whether residuals are kept for lossy compressors.
        group: process group (``None`` = world).
        residuals: error-feedback memory keyed by DDP bucket index.
        bytes_sent: running total of bytes handed to collectives by this rank.
    """

    compressor: Compressor
    error_feedback: bool = True
    group: Any = None
    residuals: ResidualMemory = field(default_factory=ResidualMemory)
    bytes_sent: int = 0

    def state_dict(self) -> dict[str, Any]:
        """Residuals and compressor state (plain tensors and ints)."""
        return {
            "residuals": self.residuals.state_dict(),
            "compressor": self.compressor.state_dict(),
            "bytes_sent": self.bytes_sent,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.residuals.load_state_dict(state["residuals"])
        self.compressor.load_state_dict(state["compressor"])
        self.bytes_sent = int(state["bytes_sent"])


def ddp_comm_hook(
    spec: str | CompressionSpec,
    *,
    error_feedback: bool = True,
    seed: int = 0,
    group: dist.ProcessGroup | None = None,
) -> tuple[DDPHookState, Any]:
    """Build a ``(state, hook)`` pair for ``DistributedDataParallel.register_comm_hook``.

    The hook divides DDP's fp32 bucket by the world size, compresses it with the commgym
    compressor for ``spec`` (with error feedback for lossy methods), and all-reduces
    (``summable``) or all-gathers the payload. Multi-round methods (PowerSGD) wait for
    the first round inside the hook, which DDP runs in bucket order, and issue the last
    round asynchronously; the returned future only decompresses (no collective is ever
    issued from a future callback, unlike torch's own PowerSGD hook).

    Example::

        state, hook = ddp_comm_hook("topk:0.01")
        ddp_model.register_comm_hook(state, hook)

    Args:
        spec: compression spec string, e.g. ``"int8"``, ``"powersgd:2"``.
        error_feedback: keep residuals for lossy compressors.
        seed: cross-rank seed (equal on all ranks).
        group: process group (default: world).

    Returns:
        ``(state, hook)``.

    Raises:
        ValueError: invalid spec.
    """
    state = DDPHookState(
        compressor=make_compressor(
            spec, seed=seed, error_feedback=error_feedback, world_size=dist.get_world_size(group)
        ),
        error_feedback=error_feedback,
        group=group,
    )

    def hook(state: DDPHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        comp = state.compressor
        world = dist.get_world_size(state.group)
        flat = bucket.buffer()
        if flat.dtype != torch.float32 and not comp.spec.lossless:
            raise ValueError(f"commgym DDP hook {comp.spec} needs fp32 gradients, got {flat.dtype}")
        flat.div_(world)
        shapes = tuple(p.shape for p in bucket.parameters())
        # DDP rebuilds its buckets after the first iteration in gradient-ready order: the
        # same index and size can then hold the tensors in another order, and per-bucket
        # state (PowerSGD's matrices and Q, residuals) must not be reused across orders.
        order = zlib.crc32(repr([tuple(s) for s in shapes]).encode())
        layout = BucketLayout(f"ddp{bucket.index()}:n{flat.numel()}:{order:08x}", shapes)
        residual = None
        if state.error_feedback and comp.uses_error_feedback and flat.numel():
            residual = state.residuals.get(layout.key, flat)
        payload, ctx = comp.compress(flat, layout, residual)
        for rnd in range(comp.rounds):
            works, outs = [], []
            for t in payload:
                if t.numel() == 0:
                    outs.append(t.new_empty(0))
                    continue
                state.bytes_sent += t.numel() * t.element_size()
                if comp.summable:
                    works.append(dist.all_reduce(t, group=state.group, async_op=True))
                    outs.append(t)
                else:
                    out = t.new_empty(t.numel() * world)
                    works.append(all_gather_flat(out, t, group=state.group, async_op=True))
                    outs.append(out)
            if rnd + 1 < comp.rounds:
                for w in works:
                    w.wait()
                payload = comp.advance(rnd + 1, outs, ctx)
                continue

            def finish(_: Any, outs: list[torch.Tensor] = outs) -> torch.Tensor:
                if comp.summable:
                    comp.decompress(outs, ctx, flat)
                else:
                    flat.zero_()
                    for r in range(world):
                        part = [
                            t[r * (t.numel() // world) : (r + 1) * (t.numel() // world)]
                            for t in outs
                        ]
                        comp.decompress(part, ctx, flat, accumulate=True)
                return flat

            if not works:
                fut: torch.futures.Future[Any] = torch.futures.Future()
                fut.set_result(None)
            else:
                fut = torch.futures.collect_all([w.get_future() for w in works])
            return fut.then(finish)
        raise AssertionError("unreachable: compressors have at least one round")

    # DDP checks these annotations at registration; real objects, not strings.
    hook.__annotations__ = {
        "state": DDPHookState,
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    return state, hook
