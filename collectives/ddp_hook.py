"""Use any commgym compressor from plain ``DistributedDataParallel``, switchable at run time."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from commgym.collectives.compressors import (
    BucketLayout,
    CompressionSpec,
    Compressor,
    make_compressor,
)
from commgym.collectives.exchange import decode, issue
from commgym.collectives.residual import ResidualMemory

__all__ = ["DDPHookState", "ddp_comm_hook"]


@dataclass
class DDPHookState:
    """Mutable state of the commgym DDP communication hook (checkpointable).

    DDP accepts one comm hook per model, so switching compression during training means
    changing this state, never registering a second hook: :meth:`reconfigure` swaps the
    compressor (and restarts error feedback), ``communicate = False`` turns the hook
    into a pass-through for local-SGD steps.

    Residuals and per-bucket compressor state are keyed by the *parameters* a bucket
    holds (their indices in ``model.parameters()``), never by DDP's bucket index or size,
    which change when DDP rebuilds its buckets after the first iteration. When a bucket
    appears whose parameters were held by other buckets, its residual is assembled from
    theirs (re-bucketed, not dropped). The bucket layouts last used are part of
    :meth:`state_dict`: a resumed job, whose fresh DDP wrapper starts with its
    pre-rebuild buckets, compresses each of those as the saved layouts it is made of,
    so every layout is compressed and summed as in the job that wrote the checkpoint and
    resuming is bit-identical to not stopping, at any world size (tested at 2 and 3).
    A DDP wrapper that rebuilds its buckets (``find_unused_parameters=False``) starts
    with ONE bucket holding every parameter, which every saved layout splits; one that
    does not rebuild keeps its buckets. Right after the first iteration, DDP's rebuild is
    still pending and its buckets unknown to the hook:
    :class:`~commgym.collectives.ddp_sync.DDPHookSynchronizer` saves the buckets DDP
    will use instead (the hook alone saves those it saw).

    Attributes:
        compressor: the compressor instance in force.
        error_feedback: whether residuals are kept for lossy compressors.
        group: process group (``None`` = world).
        residuals: error-feedback memory keyed by parameter indices.
        bytes_sent: running total of bytes handed to collectives by this rank.
        communicate: False skips all communication (local SGD): gradients stay local.
        seed: cross-rank seed of the compressors.
        nonfinite: a non-finite gradient was seen on some rank since it was last reset.
    """

    compressor: Compressor
    error_feedback: bool = True
    group: Any = None
    residuals: ResidualMemory = field(default_factory=ResidualMemory)
    bytes_sent: int = 0
    communicate: bool = True
    seed: int = 0
    nonfinite: bool = False
    compress_s: float = 0.0
    param_index: dict[int, int] = field(default_factory=dict)
    #: layouts (tuples of parameter indices, in buffer order) compressed last iteration
    layouts: list[tuple[int, ...]] = field(default_factory=list)
    _seen: list[tuple[int, ...]] = field(default_factory=list)
    _seen_params: set[int] = field(default_factory=set)

    def reconfigure(self, spec: str | CompressionSpec, *, error_feedback: bool = True) -> None:
        """Switch compression (restarts residuals and compressor state; layouts kept).

        Raises:
            ValueError: invalid spec.
        """
        spec = CompressionSpec.parse(spec)
        if spec == self.compressor.spec and error_feedback == self.error_feedback:
            return
        self.compressor = make_compressor(
            spec,
            seed=self.seed,
            error_feedback=error_feedback,
            world_size=dist.get_world_size(self.group),
        )
        self.error_feedback = error_feedback
        self.residuals.reset()

    def state_dict(self) -> dict[str, Any]:
        """Residuals, compressor state, layouts and counters (plain tensors and ints)."""
        return {
            "spec": str(self.compressor.spec),
            "error_feedback": self.error_feedback,
            "communicate": self.communicate,
            "residuals": self.residuals.state_dict(),
            "compressor": self.compressor.state_dict(),
            "bytes_sent": self.bytes_sent,
            "layouts": [list(x) for x in (self._seen or self.layouts)],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (switching to the saved compression)."""
        self.reconfigure(state.get("spec", str(self.compressor.spec)),
                         error_feedback=bool(state.get("error_feedback", True)))  # fmt: skip
        self.communicate = bool(state.get("communicate", True))
        self.residuals.load_state_dict(state["residuals"])
        self.compressor.load_state_dict(state["compressor"])
        self.bytes_sent = int(state["bytes_sent"])
        self.layouts = [tuple(x) for x in state.get("layouts", [])]
        self._seen, self._seen_params = [], set()

    # -- internals ------------------------------------------------------------------------
    def _indices(self, params: list[torch.Tensor]) -> tuple[int, ...]:
        for p in params:
            if id(p) not in self.param_index:  # without a model: numbered as first seen
                self.param_index[id(p)] = len(self.param_index)
        return tuple(self.param_index[id(p)] for p in params)

    def _record(self, key: tuple[int, ...]) -> None:
        """Note a compressed layout; a parameter seen twice starts a new iteration."""
        if any(i in self._seen_params for i in key):
            self.layouts, self._seen, self._seen_params = self._seen, [], set()
        self._seen.append(key)
        self._seen_params.update(key)

    def _residual(self, key: tuple[int, ...], sizes: list[int], like: torch.Tensor):
        name = _layout_name(key, sizes)
        if name in self.residuals:
            return self.residuals.get(name, like)
        fresh = self.residuals.get(name, like)  # zeros
        # re-bucket: take each parameter's slice from the entry that held it before
        where = dict(zip(key, zip(_offsets(sizes), sizes, strict=True), strict=True))
        for other in self.residuals.keys():
            if other == name:
                continue
            old = self.residuals.lookup(other)
            if old is None:
                continue
            moved, off = False, 0
            for i, n in zip(*_parse(other), strict=True):
                if i in where:
                    o, m = where[i]
                    fresh[o : o + m].copy_(old[off : off + n])
                    old[off : off + n].zero_()
                    moved = True
                off += n
            if moved and not bool(old.any()):
                self.residuals.discard(other)
        return fresh


def _layout_name(key: tuple[int, ...], sizes: list[int]) -> str:
    """Stable name of a layout: its parameter indices and their sizes."""
    return "p" + ",".join(map(str, key)) + ":n" + ",".join(map(str, sizes))


def _parse(name: str) -> tuple[list[int], list[int]]:
    idx, _, sizes = name[1:].partition(":n")
    return [int(x) for x in idx.split(",") if x], [int(x) for x in sizes.split(",") if x]


def _offsets(sizes: list[int]) -> list[int]:
    out, off = [], 0
    for n in sizes:
        out.append(off)
        off += n
    return out


def ddp_comm_hook(
    spec: str | CompressionSpec,
    *,
    error_feedback: bool = True,
    seed: int = 0,
    group: dist.ProcessGroup | None = None,
    model: torch.nn.Module | None = None,
) -> tuple[DDPHookState, Any]:
    """Build a ``(state, hook)`` pair for ``DistributedDataParallel.register_comm_hook``.

    The hook multiplies DDP's fp32 bucket by ``1 / world_size`` (as DDP's reducer does),
    compresses it with the commgym compressor in force (with error feedback for lossy
    methods), and all-reduces (``summable``) or all-gathers the payload. Multi-round
    methods (PowerSGD) wait for the first round inside the hook, which DDP runs in
    bucket order, and issue the last round asynchronously; the returned future only
    decompresses (no collective is ever issued from a future callback, unlike torch's
    own PowerSGD hook). For compressors that can drop a NaN/inf (top-k, random-k) one
    4-byte flag per bucket is all-reduced and a flagged bucket becomes NaN on every rank,
    so ``GradScaler`` skips the step everywhere. Switch compression with
    ``state.reconfigure(spec)``; see :class:`DDPHookState` for checkpoints.

    Example::

        state, hook = ddp_comm_hook("topk:0.01", model=ddp_model.module)
        ddp_model.register_comm_hook(state, hook)

    Args:
        spec: compression spec string, e.g. ``"int8"``, ``"powersgd:2"``.
        error_feedback: keep residuals for lossy compressors.
        seed: cross-rank seed (equal on all ranks).
        group: process group (default: world).
        model: the wrapped module; its parameter order names residuals and layouts
            (recommended for checkpoints; without it parameters are numbered in the
            order DDP first hands them to the hook).

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
        seed=seed,
    )
    if model is not None:
        trainable = [p for p in model.parameters() if p.requires_grad]
        state.param_index = {id(p): i for i, p in enumerate(trainable)}

    def hook(state: DDPHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        flat = bucket.buffer()
        if not state.communicate:  # local SGD: DDP copies the local gradient back
            fut: torch.futures.Future[Any] = torch.futures.Future()
            fut.set_result(flat)
            return fut
        comp = state.compressor
        if flat.dtype != torch.float32 and not comp.spec.lossless:
            raise ValueError(f"commgym DDP hook {comp.spec} needs fp32 gradients, got {flat.dtype}")
        flat.mul_(1.0 / dist.get_world_size(state.group))
        grads = list(bucket.gradients())
        key = state._indices(list(bucket.parameters()))
        sizes = [g.numel() for g in grads]
        parts = _split(key, state.layouts) if key not in set(state.layouts) else []
        if not parts:
            state._record(key)
            return _run(state, flat, key, sizes, [torch.Size(g.shape) for g in grads], None)
        # a pre-rebuild bucket of a resumed job: compress each saved layout it holds
        view_of = dict(zip(key, grads, strict=True))
        futures = []
        for sub in parts:
            state._record(sub)
            scratch = torch.cat([view_of[i].reshape(-1) for i in sub])
            futures.append(
                _run(
                    state,
                    scratch,
                    sub,
                    [view_of[i].numel() for i in sub],
                    [torch.Size(view_of[i].shape) for i in sub],
                    [view_of[i] for i in sub],
                )
            )
        return torch.futures.collect_all(futures).then(lambda _: flat)

    # DDP checks these annotations at registration; real objects, not strings.
    hook.__annotations__ = {
        "state": DDPHookState,
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    return state, hook


def _split(key: tuple[int, ...], layouts: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Saved layouts whose union is exactly ``key``'s parameters ([] if there are none)."""
    want = set(key)
    parts = [lay for lay in layouts if set(lay) <= want]
    if sorted(i for lay in parts for i in lay) != sorted(want) or len(parts) < 2:
        return []
    return parts


def _run(
    state: DDPHookState,
    flat: torch.Tensor,
    key: tuple[int, ...],
    sizes: list[int],
    shapes: list[torch.Size],
    scatter: list[torch.Tensor] | None,
) -> torch.futures.Future[Any]:
    """Compress, communicate and (in the future) decompress one layout's flat buffer."""
    comp = state.compressor
    world = dist.get_world_size(state.group)
    layout = BucketLayout(_layout_name(key, sizes), tuple(shapes))
    t0 = time.perf_counter()
    flag = None
    works: list[Any] = []
    if not comp.propagates_nonfinite and flat.numel():
        lo, hi = torch.aminmax(flat)
        flag = torch.logical_not(torch.isfinite(lo) & torch.isfinite(hi)).to(torch.int32)
        flag = flag.reshape(1)
        state.bytes_sent += 4
    residual = None
    if state.error_feedback and comp.uses_error_feedback and flat.numel():
        residual = state._residual(key, sizes, flat)
    payload, ctx = comp.compress(flat, layout, residual)
    state.compress_s += time.perf_counter() - t0
    gather: dict[Any, torch.Tensor] = {}  # this call's all-gather destinations
    for rnd in range(comp.rounds):
        works, outs, nbytes, _ = issue(
            comp, payload, group=state.group, world_size=world, gather_buffers=gather, key=rnd
        )
        state.bytes_sent += nbytes
        if rnd + 1 < comp.rounds:
            for w in works:
                w.wait()
            payload = comp.advance(rnd + 1, outs, ctx)
            continue
        if flag is not None:
            works.append(dist.all_reduce(flag, group=state.group, async_op=True))

        def finish(_: Any, outs: list[torch.Tensor] = outs) -> torch.Tensor:
            t1 = time.perf_counter()
            decode(comp, outs, ctx, flat, world)
            if flag is not None and int(flag) > 0:
                flat.fill_(math.nan)  # a rank's inf may not be in the sample: NaN everywhere
                state.nonfinite = True
            if scatter is not None:
                off = 0
                for v in scatter:
                    v.copy_(flat[off : off + v.numel()].view_as(v))
                    off += v.numel()
            state.compress_s += time.perf_counter() - t1
            return flat

        if not works:
            fut: torch.futures.Future[Any] = torch.futures.Future()
            fut.set_result(None)
        else:
            fut = torch.futures.collect_all([w.get_future() for w in works])
        return fut.then(finish)
    raise AssertionError("unreachable: compressors have at least one round")
