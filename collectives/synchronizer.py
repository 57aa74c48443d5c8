"""The executed action path: bucketed, overlapping, compressed gradient synchronisation."""

from __future__ import annotations

import contextlib
import datetime
import functools
import math
import time
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from commgym.collectives import kernels
from commgym.collectives.averaging import (
    DELTA_KEY_PREFIX,
    PeriodicAverager,
    average_optimizer_state,
)
from commgym.collectives.bucketing import BucketPlan
from commgym.collectives.checks import check_int
from commgym.collectives.compressors import Compressor, make_compressor
from commgym.collectives.config import CommConfig
from commgym.collectives.errors import CollectiveTimeout
from commgym.collectives.exchange import (
    CarriedControl,
    all_gather_flat,
    attach_control,
    decode,
    detach_control,
    issue,
)
from commgym.collectives.residual import ResidualMemory
from commgym.collectives.stats import AveragingStats, StepStats

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "GradientSynchronizer",
    "all_gather_flat",
    "check_same_on_all_ranks",
]

#: Positions per parameter probed for a non-zero synchronised gradient (see
#: ``GradientSynchronizer._used_counts``).
_PROBES = 8

#: Seconds a commgym collective may take before every waiting rank raises
#: :class:`CollectiveTimeout` (gloo's own default is 30 min, NCCL's 10 min).
DEFAULT_TIMEOUT_S = 300.0
#: Coordinates per bucket that ``compression_error`` is measured on (a fixed uniform sample,
#: the same on every rank): the exact reference all-reduce of a whole bucket cost as much
#: wire time as the step it measured (4.5 MB: ~5 s a decision on a 10 Mbit/s link).
ERROR_SAMPLE = 16384


def wait_work(work: Any, timeout_s: float, what: str) -> None:
    """Wait for an async collective, turning a stall into :class:`CollectiveTimeout`.

    Args:
        work: the handle returned by a ``torch.distributed`` call with ``async_op=True``.
        timeout_s: seconds to wait.
        what: the collective, for the message.

    Raises:
        CollectiveTimeout: the collective did not finish within ``timeout_s``.
    """
    try:
        work.wait(datetime.timedelta(seconds=timeout_s))
    except RuntimeError as err:
        msg = str(err).lower()
        if "timed out" in msg or "timeout" in msg:
            raise CollectiveTimeout(
                f"{what} did not finish within timeout_s={timeout_s:g} s: another rank "
                "stalled, died or skipped this collective (every rank must call the same "
                "synchronizer methods in the same order); raise timeout_s for slow steps"
            ) from err
        raise


def comm_device(group: dist.ProcessGroup | None, like: torch.Tensor) -> torch.device:
    """Device for small control tensors: ``like``'s device on NCCL, CPU otherwise."""
    return like.device if dist.get_backend(group) == "nccl" else torch.device("cpu")


def check_same_on_all_ranks(
    facts: dict[str, str],
    *,
    group: dist.ProcessGroup | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    device: torch.device | None = None,
    context: str = "",
) -> None:
    """Verify that every rank passes the same ``facts`` (a collective; call on every rank).

    Costs one all-gather of ``len(facts)`` int64 checksums; the values themselves are
    exchanged only when they differ, to name them.

    Args:
        facts: name -> value (as text) that must agree, e.g. the configuration and seed.
        group: process group (default: the world).
        timeout_s: collective timeout, seconds.
        device: device of the exchanged tensor (CUDA for NCCL groups).
        context: what is being checked, for the message.

    Raises:
        ValueError: on every rank, when some value differs between ranks; the message
            names each differing fact with its value per rank.
        CollectiveTimeout: a rank did not join within ``timeout_s``.
    """
    device = device or torch.device("cpu")
    world = dist.get_world_size(group)
    names = sorted(facts)
    local = torch.tensor(
        [zlib.crc32(f"{k}={facts[k]}".encode()) for k in names], dtype=torch.int64, device=device
    )
    rows = [torch.empty_like(local) for _ in range(world)]
    wait_work(dist.all_gather(rows, local, group=group, async_op=True), timeout_s, context)
    if all(torch.equal(r, local) for r in rows):
        return
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {k: facts[k] for k in names}, group=group)
    differ = []
    for k in names:
        values = [g.get(k) if isinstance(g, dict) else None for g in gathered]
        if len(set(values)) > 1:
            differ.append(f"{k}: " + ", ".join(f"rank {r}={v}" for r, v in enumerate(values)))
    raise ValueError(
        f"{context}: ranks disagree ({'; '.join(differ) or 'set of checked names'}); every "
        "rank must use the same configuration, seed and model (pass the same values on "
        "every rank)"
    )


class _Clock:
    """Host wall clock on CPU; CUDA events on GPU (resolved after the measured region)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        if start is None or end is None:
            return 0.0
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        return end - start


@dataclass
class _Inflight:
    """One bucket's communication in progress."""

    round: int
    payload: list[torch.Tensor]
    ctx: Any
    works: list[Any]
    gathered: list[torch.Tensor]
    #: the control word rides in this exchange (the last bucket's first round)
    carried: CarriedControl | None = None


@dataclass
class _StepState:
    """Per-step bookkeeping, reset after every ``synchronize()``."""

    ready: list[bool]
    pending: list[int]
    #: per parameter: a gradient was accumulated since the last synchronize() (no_sync
    #: micro-batches included), as DDP's ``local_used_map``
    used: list[bool]
    #: per parameter, at its gradient hook: (param version, grad tensor, grad version);
    #: a change before synchronize() means the optimizer or clipping ran too early
    versions: dict[int, tuple[int, torch.Tensor, int]] = field(default_factory=dict)
    #: the control word summed over ranks (int64: [non-finite, used per parameter]),
    #: once the exchange that carried it finished
    word: torch.Tensor | None = None
    #: bytes the control word added to this step's collectives
    control_bytes: int = 0
    #: per launched bucket: its buffer's version counter after launch
    bucket_versions: dict[int, int] = field(default_factory=dict)
    next_launch: int = 0
    inflight: dict[int, _Inflight] = field(default_factory=dict)
    compress_spans: list[tuple[Any, Any]] = field(default_factory=list)
    wait_spans: list[tuple[Any, Any]] = field(default_factory=list)
    hook_compress_spans: int = 0
    bytes_sent: int = 0
    collectives: int = 0
    nonfinite_local: torch.Tensor | None = None
    t_forward: Any = None
    started: bool = False
    #: gradients were accumulated under no_sync() and not yet synchronised
    accumulating: bool = False


class GradientSynchronizer:
    """Synchronises gradients of a replicated model under a :class:`CommConfig`.

    Each bucket's communication is launched from the parameter's
    ``post_accumulate_grad`` hook as soon as the bucket's last gradient is accumulated,
    strictly in bucket order, so communication overlaps the rest of backward (as
    DDP's reducer and Horovod do). ``synchronize()`` after ``backward()`` waits,
    decompresses and writes the averaged gradient into every ``param.grad`` (a view into
    the bucket where the parameter's layout allows, as DDP's ``gradient_as_bucket_view``).
    Collectives are only issued from these hooks and from ``synchronize()`` /
    ``after_optimizer_step()`` / ``reconfigure()`` on the training thread, in the same
    order on every rank; never from a ``Future`` callback.

    Typical loop (every rank)::

        sync = GradientSynchronizer(model, CommConfig("topk:0.01", bucket_mb=4),
                                    optimizer=opt)
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            stats = sync.synchronize()          # StepStats; .grad is now the average
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # optional
            opt.step()
            sync.after_optimizer_step()          # local-SGD averaging when H > 1

    DDP semantics it keeps (``DistributedDataParallel`` with
    ``find_unused_parameters=True``):

    * construction broadcasts rank 0's parameters and buffers (a collective);
    * ``broadcast_buffers=True`` broadcasts rank 0's buffers (BatchNorm running
      statistics) before a training forward whenever the previous forward synchronised,
      exactly when DDP does;
    * each rank's gradient is multiplied by ``1 / world_size`` before the sum, as DDP's
      reducer does, in DDP's bucket layout, so ``none`` gives DDP's gradients bit for bit;
    * a parameter that got no gradient on any rank since the last ``synchronize()``
      keeps its ``.grad`` (``None`` after ``zero_grad(set_to_none=True)``), so optimizers
      skip it (no weight decay, no momentum); one used only on some ranks gets the
      average with zeros from the others;
    * ``with sync.no_sync():`` accumulates gradients locally (gradient accumulation);
      the next backward outside it communicates the accumulated sum. Step counters
      (error feedback, local-SGD period, ``error_every``) advance per ``synchronize()``;
    * a non-finite gradient on any rank makes the synchronised gradient non-finite on
      every rank, for every compressor (top-k / random-k buckets are filled with NaN
      then), so ``torch.amp.GradScaler`` skips the step on every rank.

    It issues no collective per step beyond the buckets' own (DDP with
    ``find_unused_parameters=True`` all-reduces its used-parameter map every step): the
    control word (non-finite flag, used-parameter map) rides at the end of the last
    bucket's payload, exact under every compressor; ``none``, ``fp16`` and ``bf16`` read
    unused parameters off the synchronised result instead and all-reduce used flags only
    on a step where some parameter's result is all zero (see :attr:`control_bytes`).

    Misuse raises on every rank instead of letting replicas drift: ranks constructed
    or reconfigured with different configurations or seeds (checked at construction and
    at each :meth:`reconfigure`), ``optimizer.step()`` or an in-place change of ``.grad``
    (e.g. ``clip_grad_norm_``) between ``backward()`` and :meth:`synchronize`, a second
    backward without :meth:`no_sync`, a missing :meth:`after_optimizer_step` under local
    SGD; a rank that stalls makes the others raise :class:`CollectiveTimeout` after
    ``timeout_s``.

    Args:
        model: the replicated module (same parameters, same order on every rank).
        config: the initial communication configuration.
        group: process group (default: the world). Must already be initialised.
        seed: seed of all cross-rank randomness (random-k, stochastic rounding, PowerSGD's
            initial ``Q``); must be equal on every rank (checked).
        error_every: measure ``compression_error`` every this many steps (an extra fp32
            all-reduce of the sampled coordinates after the measured region, not counted
            in ``bytes_sent``); 0 disables it.
        error_sample: coordinates per bucket the error is measured on, a fixed uniform
            sample drawn from ``seed`` (the same on every rank; buckets with fewer
            coordinates are measured whole); 0 measures every coordinate (an exact
            all-reduce of the whole gradient). Default :data:`ERROR_SAMPLE`.
        grad_norm_every: measure ``grad_norm`` every this many steps (a pass over the
            synchronised gradient after the measured region, ~0.2 ms for 4.5 MB on one
            CPU thread: more than 1 % of a 16 ms step, a cost DDP does not have); 0 only
            on steps asked for with :meth:`request_grad_norm`. On a step that does not
            measure it, ``grad_norm`` is ``None`` and so is ``nonfinite`` for compressors
            that let a non-finite value reach every rank (``none``, ``fp16``, ``bf16``:
            the synchronised gradient is then non-finite on every rank alike, as DDP's,
            and ``GradScaler`` sees it); the others carry the flag in the exchange and
            always know it. The env's ranks and :class:`~commgym.agents.CommScheduler`
            use 0 and ask on a decision's last step, the one whose norm they observe.
        optimizer: the optimizer stepping ``model`` (settable later as
            ``sync.optimizer``). With it, :meth:`consensus` and a switch from local SGD
            back to ``sync_period = 1`` also average its per-parameter state (momentum,
            Adam moments; :func:`~commgym.collectives.averaging.average_optimizer_state`),
            so the replicas are identical again; without it they stay apart under
            ``H = 1`` whenever the optimizer has rank-local state (a warning says so).
        broadcast_buffers: broadcast rank 0's buffers before training forwards (DDP's
            default); False keeps buffers rank-local.
        timeout_s: seconds any commgym collective may wait before raising
            :class:`CollectiveTimeout` (default :data:`DEFAULT_TIMEOUT_S`).

    Raises:
        RuntimeError: ``torch.distributed`` is not initialised.
        TypeError: ``config`` is not a ``CommConfig``.
        ValueError: the model has no trainable parameters, a lossy compression is asked
            for parameters that are not fp32, an invalid ``timeout_s``, or (on every rank)
            the ranks' models, configurations or seeds differ.
        CollectiveTimeout: a rank did not join construction within ``timeout_s``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: CommConfig,
        group: dist.ProcessGroup | None = None,
        *,
        seed: int = 0,
        error_every: int = 1,
        error_sample: int = ERROR_SAMPLE,
        grad_norm_every: int = 1,
        optimizer: torch.optim.Optimizer | None = None,
        broadcast_buffers: bool = True,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "GradientSynchronizer needs an initialised process group: call "
                "torch.distributed.init_process_group(...) first (e.g. under torchrun)"
            )
        check_int("error_every", error_every, 0)
        check_int("error_sample", error_sample, 0)
        check_int("grad_norm_every", grad_norm_every, 0)
        if (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, int | float)
            or not math.isfinite(timeout_s)
            or timeout_s <= 0
        ):
            raise ValueError(f"timeout_s must be a finite number > 0 (seconds), got {timeout_s!r}")
        self.model = model
        self.group = group
        self.world_size = dist.get_world_size(group)
        self._inv_world = 1.0 / self.world_size
        self.rank = dist.get_rank(group)
        self.seed = int(seed)
        self.error_every = error_every
        self.error_sample = error_sample
        self.grad_norm_every = grad_norm_every
        self._norm_next = False
        self.timeout_s = float(timeout_s)
        self.broadcast_buffers = bool(broadcast_buffers)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("model has no parameters with requires_grad=True to synchronise")
        self._src = 0 if group is None else dist.get_global_rank(group, 0)
        self._ctl_device = comm_device(group, self.params[0])
        self._clock = _Clock(self.params[0].device)
        kernels.warmup(self.params[0].device.type)  # JIT compile outside measured steps
        self._averager = PeriodicAverager(self.params, 1, group)
        self.optimizer = optimizer
        self._warned_state = False
        self._residuals = ResidualMemory()
        self._config: CommConfig | None = None
        self._plan: BucketPlan | None = None
        self._compressor: Compressor | None = None
        self._err_ref: dict[int, torch.Tensor] = {}
        # per bucket: the sorted flat positions compression_error reads (None: all)
        self._err_idx: dict[int, torch.Tensor | None] = {}
        self._gather_bufs: dict[tuple[int, int, int], torch.Tensor] = {}
        # per bucket: flat positions probed for a non-zero result and their parameters
        self._probes: list[tuple[torch.Tensor, list[int]]] | None = None
        self._control_bytes = 0
        self._no_sync = False
        # DDP's require_forward_param_sync: buffers are broadcast before a forward when
        # the previous forward was a synchronising training forward (or there was none)
        self._sync_buffers_next = True
        # synchronize() returned and after_optimizer_step() was not called yet
        self._awaiting_opt_step = False
        config = self._check_config(config)
        check_same_on_all_ranks(
            {
                "config": repr(config.to_dict()),
                "seed": str(self.seed),
                "parameters": _describe(model.named_parameters()),
                "buffers": _describe(model.named_buffers()),
                "broadcast_buffers": str(self.broadcast_buffers),
            },
            group=group,
            timeout_s=self.timeout_s,
            device=self._ctl_device,
            context="GradientSynchronizer construction",
        )
        # identical replicas at start, as DDP's constructor guarantees
        self._broadcast([*model.parameters(), *model.buffers()], "parameter broadcast")
        self._apply(config)
        self._handles = [
            p.register_post_accumulate_grad_hook(functools.partial(self._on_grad_ready, i))
            for i, p in enumerate(self.params)
        ]
        self._handles.append(model.register_forward_pre_hook(self._on_forward))
        self._handles.append(model.register_forward_hook(self._after_forward))

    # -- configuration ------------------------------------------------------------
    @property
    def config(self) -> CommConfig:
        """The configuration in force."""
        assert self._config is not None
        return self._config

    @property
    def plan(self) -> BucketPlan:
        """The current bucket plan."""
        assert self._plan is not None
        return self._plan

    @property
    def compressor(self) -> Compressor:
        """The current compressor instance."""
        assert self._compressor is not None
        return self._compressor

    @property
    def residuals(self) -> ResidualMemory:
        """Error-feedback memory of the current configuration."""
        return self._residuals

    @property
    def averager(self) -> PeriodicAverager:
        """The local-SGD averager (its ``averagings`` counts parameter averagings)."""
        return self._averager

    def _check_config(self, config: CommConfig) -> CommConfig:
        if not isinstance(config, CommConfig):
            raise TypeError(f"config must be a CommConfig, got {type(config).__name__}")
        if not config.compression.lossless:
            bad = sorted({str(p.dtype) for p in self.params if p.dtype != torch.float32})
            if bad:
                raise ValueError(
                    f"compression {config.compression} needs fp32 parameters, got {bad}; "
                    "use compression 'none' for other dtypes"
                )
        return config

    def _apply(self, config: CommConfig) -> None:
        old_plan = self._plan
        if old_plan is None or not old_plan.same_as(self.params, config.bucket_bytes):
            self._plan = BucketPlan(self.params, config.bucket_bytes)
            if old_plan is not None:
                self._detach_grads(old_plan)
            self._err_ref.clear()
            # drawn here, outside any timed step
            self._err_idx = {b: self._error_index(b) for b in range(len(self._plan.buffers))}
            self._gather_bufs.clear()
            self._probes = None
        self._config = config
        self._compressor = make_compressor(
            config.compression,
            seed=self.seed,
            error_feedback=config.error_feedback,
            stochastic_rounding=config.stochastic_rounding,
            world_size=self.world_size,
        )
        self._residuals.reset()
        # at H > 1 the chosen compression carries the parameter changes (the replicas are
        # identical here: at construction, or right after reconfigure()'s average)
        self._averager.set_compression(
            self._compressor if config.sync_period > 1 else None,
            bucket_bytes=config.bucket_bytes,
            residuals=self._residuals,
            error_feedback=config.error_feedback,
        )
        self._averager.period = config.sync_period
        self._averager.steps_since_average = 0
        self._averager.steps = 0
        self._step = 0
        self._averager.optimizer_steps = 0
        self._measure_next = False
        self._norm_next = False
        self._awaiting_opt_step = False
        self._new_step_state()

    def _detach_grads(self, plan: BucketPlan) -> None:
        for p, view in zip(plan.params, plan.views, strict=True):
            if p.grad is not None and _is_view_of(p.grad, view):
                p.grad = p.grad.clone()

    def reconfigure(self, config: CommConfig) -> None:
        """Switch compression, bucket size and period; only between steps.

        Any change restarts compression state (error-feedback residuals, PowerSGD warm
        start, random streams), so the next step gives exactly what a freshly built
        synchronizer would. Leaving a local-SGD period with un-averaged steps averages
        parameters first (a collective: every rank must reconfigure at the same step).
        A config equal to the current one changes nothing. Every call is a collective:
        the ranks' configurations are compared first (one small all-gather).

        Raises:
            RuntimeError: called between ``backward()`` and ``synchronize()`` (also
                after a ``no_sync()`` backward).
            TypeError, ValueError: as for the constructor; ``ValueError`` on every rank
                when the ranks pass different configurations.
        """
        config = self._check_config(config)
        if self._state.started or self._state.accumulating:
            raise RuntimeError(
                "reconfigure() called during a step (after backward started, before "
                "synchronize()); call it between steps"
            )
        check_same_on_all_ranks(
            {"config": repr(config.to_dict())},
            group=self.group,
            timeout_s=self.timeout_s,
            device=self._ctl_device,
            context="GradientSynchronizer.reconfigure",
        )
        if config == self._config:
            return
        if self._averager.steps_since_average > 0:
            self._averager.average()
        if config.sync_period == 1:
            self._average_optimizer_state()
        self._apply(config)

    def _average_optimizer_state(self) -> tuple[int, float]:
        """Average the optimizer state if local steps left it apart (collective)."""
        if self._averager.local_steps == 0:
            return 0, 0.0
        self._averager.local_steps = 0
        if self.optimizer is None:
            if not self._warned_state:
                self._warned_state = True
                warnings.warn(
                    "leaving local SGD without an optimizer attached: rank-local optimizer "
                    "state (momentum, Adam moments) stays apart and replicas drift under "
                    "sync_period=1; pass optimizer= to GradientSynchronizer",
                    stacklevel=3,
                )
            return 0, 0.0
        return average_optimizer_state(self.optimizer, self.group)

    # -- hooks --------------------------------------------------------------------
    def _new_step_state(self) -> None:
        plan = self.plan
        self._state = _StepState(
            ready=[False] * len(self.params),
            pending=[len(b) for b in plan.buckets],
            used=[False] * len(self.params),
        )

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Context manager for gradient accumulation (DDP's ``no_sync``).

        Backward passes inside it accumulate gradients into ``.grad`` locally and
        communicate nothing; the first backward after it communicates the accumulated
        sum in :meth:`synchronize`. Forwards inside it do not trigger the next buffer
        broadcast (as in DDP). Example (two micro-batches per optimizer step)::

            with sync.no_sync():
                loss_fn(model(x0), y0).backward()
            loss_fn(model(x1), y1).backward()
            sync.synchronize()
            opt.step()
            sync.after_optimizer_step()
        """
        old = self._no_sync
        self._no_sync = True
        try:
            yield
        finally:
            self._no_sync = old

    @torch.no_grad()
    def _broadcast(self, tensors: list[torch.Tensor], what: str) -> None:
        """Copy rank 0's values into ``tensors`` (one collective per dtype/device)."""
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for t in tensors:
            if t.numel():
                groups.setdefault((t.dtype, t.device), []).append(t)
        for ts in groups.values():
            flat = _flatten_dense_tensors([t.detach() for t in ts])
            work = dist.broadcast(flat, src=self._src, group=self.group, async_op=True)
            wait_work(work, self.timeout_s, what)
            if self.rank == 0:
                continue
            # buffers may be saved for a pending backward; the copy must not bump their
            # version counters (DDP does the same)
            with torch.autograd._unsafe_preserve_version_counter(tuple(ts)):
                for t, v in zip(ts, _unflatten_dense_tensors(flat, ts), strict=True):
                    t.detach().copy_(v)

    def _on_forward(self, module: torch.nn.Module, args: Any) -> None:
        if self.broadcast_buffers and self._sync_buffers_next:
            buffers = list(self.model.buffers())
            if buffers:
                self._broadcast(buffers, "buffer broadcast before forward")
        # only training forwards start a step (evaluation under no_grad does not)
        if self._state.t_forward is None and torch.is_grad_enabled():
            self._state.t_forward = self._clock.mark()

    def _after_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        # DDP's require_forward_param_sync: the next forward broadcasts buffers only if
        # this one was a synchronising training forward
        self._sync_buffers_next = torch.is_grad_enabled() and not self._no_sync

    def _on_grad_ready(self, index: int, param: torch.Tensor) -> None:
        st = self._state
        if self._no_sync:
            if st.ready[index]:
                raise RuntimeError(
                    "backward inside no_sync() after a synchronising backward of the same "
                    "step; run the no_sync() micro-batches first, then one backward outside "
                    "it, then synchronize()"
                )
            st.used[index] = True
            st.accumulating = True
            return
        st.used[index] = True
        if self.config.sync_period > 1:
            st.started = True
            return
        if st.ready[index]:
            seen = st.versions.get(index)
            if seen is not None and param._version != seen[0]:
                # the parameter moved since its last backward: an optimizer step ran on
                # this rank's own gradient, the usual slip, not gradient accumulation
                raise RuntimeError(
                    "synchronize() was not called after the last backward(), and "
                    "optimizer.step() (or another in-place update) then ran on this rank's "
                    "local gradients: replicas now differ; call synchronize() (or the "
                    "CommScheduler's step()) after every backward() and before "
                    "optimizer.step(), on every rank"
                )
            raise RuntimeError(
                f"gradient of parameter {index} was accumulated twice before synchronize(); "
                "call synchronize() after every backward, or run all but the last "
                "micro-batch's backward inside `with no_sync():` to accumulate (the "
                "GradientSynchronizer's, or the CommScheduler's that wraps it)"
            )
        if not st.started:
            # launch buckets holding parameters unused in this backward at its end
            torch.autograd.Variable._execution_engine.queue_callback(
                functools.partial(self._launch_rest, in_hook=True)
            )
        st.started = True
        st.ready[index] = True
        plan = self.plan
        view = plan.views[index]
        grad = param.grad
        # DDP's reducer multiplies by 1/W while copying into the bucket (one pass, not a
        # copy and then a pass over the bucket): the same fp32 products, so `none` keeps
        # DDP's bits
        with torch.no_grad():
            if grad is None:
                view.zero_()
            elif not _is_view_of(grad, view):
                torch.mul(grad, self._inv_world, out=view)
                if _can_alias(param, grad):
                    param.grad = view
            else:  # accumulated into the bucket view in place
                view.mul_(self._inv_world)
        g = param.grad
        aliased = g is not None and _is_view_of(g, view)
        # a gradient that is a bucket view is checked through the bucket's version
        st.versions[index] = (param._version, g, -1 if aliased or g is None else g._version)
        b = plan.bucket_of[index]
        st.pending[b] -= 1
        if st.pending[b] == 0:
            self._launch_ready()

    @torch.no_grad()
    def _launch_rest(self, *, in_hook: bool) -> None:
        """Launch every bucket not launched yet; parameters without a gradient send zeros.

        Runs at the end of backward (an autograd engine callback), so every rank issues
        all bucket collectives before any collective the user issues after backward,
        whichever parameters it left unused.
        """
        st = self._state
        plan = self.plan
        for b in range(st.next_launch, len(plan)):
            for i in plan.buckets[b]:
                if not st.ready[i]:
                    p, view = self.params[i], plan.views[i]
                    if st.used[i] and p.grad is not None:  # accumulated under no_sync()
                        if not _is_view_of(p.grad, view):
                            torch.mul(p.grad, self._inv_world, out=view)
                        else:
                            view.mul_(self._inv_world)
                    else:
                        view.zero_()
                    st.ready[i] = True
            st.pending[b] = 0
            self._launch(b, in_hook=in_hook)
        st.next_launch = len(plan)

    def _launch_ready(self) -> None:
        st = self._state
        while st.next_launch < len(self.plan) and st.pending[st.next_launch] == 0:
            self._launch(st.next_launch, in_hook=True)
            st.next_launch += 1

    @torch.no_grad()
    def _launch(self, b: int, *, in_hook: bool) -> None:
        st = self._state
        plan = self.plan
        comp = self.compressor
        flat = plan.buffers[b]
        layout = plan.layouts[b]
        t0 = self._clock.mark()
        # every view of the bucket holds its gradient times 1/W already (DDP's reducer
        # multiplies, not divides: bit-identical `none` at any W)
        if self._measuring and flat.numel():
            idx = self._err_idx[b]
            ref = self._err_ref.get(b)
            if ref is None:
                n = flat.numel() if idx is None else idx.numel()
                ref = self._err_ref[b] = flat.new_empty(n, dtype=torch.float32)
            if idx is None:
                ref.copy_(flat)
            else:
                torch.index_select(flat, 0, idx, out=ref)
        if not comp.propagates_nonfinite and flat.numel():
            # min/max are NaN or +-inf iff some element is: exact and ~20x cheaper
            # than isfinite(flat).all() on CPU
            lo, hi = torch.aminmax(flat)
            bad = torch.logical_not(torch.isfinite(lo) & torch.isfinite(hi)).to(torch.int32)
            if st.nonfinite_local is None:
                st.nonfinite_local = bad.reshape(1).clone()
            else:
                st.nonfinite_local.add_(bad)
        residual = None
        if self.config.error_feedback and comp.uses_error_feedback and flat.numel():
            residual = self._residuals.get(layout.key, flat)
        payload, ctx = comp.compress(flat, layout, residual)
        carried = None
        if b == len(plan) - 1 and not self._infers_unused:
            # the last bucket launches once every gradient of this backward is in (or at
            # its end), so the word is final: it rides in this bucket's exchange
            payload, carried = attach_control(payload, self._word(), self._gather_bufs, b)
            nbytes = carried.words * (
                4 if carried.source is None else payload[carried.index].element_size()
            )
            st.control_bytes = nbytes
        t1 = self._clock.mark()
        st.compress_spans.append((t0, t1))
        if in_hook:
            st.hook_compress_spans += 1
        works, gathered = self._issue(b, 0, payload)
        st.inflight[b] = _Inflight(0, payload, ctx, works, gathered, carried)
        st.bucket_versions[b] = flat._version

    @property
    def _infers_unused(self) -> bool:
        """Unused parameters are read off the result (no control word in the exchange).

        Possible where the compressor keeps zeros exact and lets a non-finite value reach
        every rank (``none``, ``fp16``, ``bf16``): the result is then identical on every
        rank, a parameter with a non-zero result was used somewhere, and only one whose
        result is all zero needs asking (:meth:`_used_counts`). Appending a word to
        ``none``'s fp32 bucket would also change where a ring all-reduce splits it, and
        with it the order of each element's sum at three ranks or more: no longer DDP's
        bits.
        """
        comp = self.compressor
        return comp.exact_zeros and comp.propagates_nonfinite

    def _word(self) -> torch.Tensor:
        """This rank's control word: [non-finite (0/1), used per parameter (0/1), 0 pad]."""
        st = self._state
        n = 1 + len(self.params)
        word = torch.zeros(-(-n // 4) * 4, dtype=torch.int32)
        word[1:n] = torch.tensor(st.used, dtype=torch.int32)
        word = word.to(self.params[0].device)
        if st.nonfinite_local is not None:
            word[:1].copy_(st.nonfinite_local.clamp(max=1))
        return word

    def _issue(
        self, b: int, rnd: int, payload: list[torch.Tensor]
    ) -> tuple[list[Any], list[torch.Tensor]]:
        st = self._state
        works, gathered, nbytes, count = issue(
            self.compressor,
            payload,
            group=self.group,
            world_size=self.world_size,
            gather_buffers=self._gather_bufs,
            key=(b, rnd),
        )
        st.bytes_sent += nbytes
        st.collectives += count
        return works, gathered

    # -- the step -----------------------------------------------------------------
    @property
    def _measuring(self) -> bool:
        if self.config.compression.lossless:
            return False
        if self._measure_next:
            return True
        return self.error_every > 0 and self._step % self.error_every == 0

    def request_error_measurement(self) -> None:
        """Measure ``compression_error`` on the next step regardless of ``error_every``."""
        self._measure_next = True

    def request_grad_norm(self) -> None:
        """Measure ``grad_norm`` on the next step regardless of ``grad_norm_every``."""
        self._norm_next = True

    @property
    def _norming(self) -> bool:
        if self._norm_next:
            return True
        return self.grad_norm_every > 0 and self._step % self.grad_norm_every == 0

    @property
    def control_bytes(self) -> int:
        """Bytes the control word added to the last synchronising step's collectives.

        The word (non-finite flag and used-parameter map) rides at the end of the last
        bucket's payload in the payload's dtype, padded to 4 entries, for every
        compressor except those whose result tells unused parameters apart (``none``,
        ``fp16``, ``bf16``): those send it (int32, only the parameters whose result was
        all zero) only on steps where some result was, and 0 bytes otherwise.
        """
        return self._control_bytes

    @torch.no_grad()
    def synchronize(self) -> StepStats:
        """Finish this step's communication and write averaged gradients into ``.grad``.

        Call on every rank after ``backward()`` and before ``optimizer.step()``. Buckets
        whose parameters got no gradient this step (unused parameters) are sent as zeros;
        a parameter unused on every rank keeps its ``.grad`` (see the class docstring).
        No collective beyond the buckets' own: the non-finite flag and which parameters
        each rank used ride at the end of the last bucket's payload
        (:attr:`control_bytes`); for ``none``, ``fp16`` and ``bf16`` they are read off
        the result, and a small all-reduce of used flags is issued only on a step where
        some parameter's synchronised gradient is all zero (every rank sees the same
        result and decides alike). On a local-SGD step (``sync_period > 1``) nothing is
        communicated.

        Returns:
            The measured :class:`StepStats` of this rank (``nonfinite`` agrees on all ranks).

        Raises:
            RuntimeError: on every rank that misuses the step: inside ``no_sync()``;
                parameters changed since backward (``optimizer.step()`` before
                ``synchronize()``); a gradient changed in place since backward (clipping
                before ``synchronize()``); ``after_optimizer_step()`` missing under local
                SGD (a second ``synchronize()`` for one optimizer step: accumulate with
                :meth:`no_sync`).
            CollectiveTimeout: a rank did not join within ``timeout_s``.
        """
        if self._no_sync:
            raise RuntimeError(
                "synchronize() inside no_sync(): leave the no_sync() block, run the last "
                "micro-batch's backward outside it, then call synchronize()"
            )
        if self._awaiting_opt_step and self.config.sync_period > 1:
            # two causes look alike here: synchronize() once per micro-batch (accumulation
            # without no_sync()), or an optimizer step without after_optimizer_step()
            raise RuntimeError(
                "synchronize() called again without after_optimizer_step() since the last "
                "one. To accumulate micro-batches, run all but the last backward inside "
                "`with sync.no_sync():` and call synchronize() once per optimizer step; "
                "under local SGD (sync_period > 1) call after_optimizer_step() once after "
                "every optimizer step (also a skipped one) on every rank, or the ranks "
                "average at different steps"
            )
        st = self._state
        clock = self._clock
        t_start = clock.mark()
        plan = self.plan
        if self.config.sync_period > 1:
            # the local gradient's norm: non-finite iff some element is
            norm = (
                _norm([p.grad for p in self.params if p.grad is not None])
                if self._norming
                else None
            )
            stats = StepStats(
                step=self._step,
                bytes_sent=0,
                compute_s=clock.seconds(st.t_forward, t_start),
                comm_wait_s=0.0,
                compress_s=0.0,
                bucket_bytes=tuple(plan.bucket_bytes),
                compression_error=None,
                grad_norm=norm,
                nonfinite=None if norm is None else not math.isfinite(norm),
                synchronized=False,
                collectives=0,
            )
            self._step += 1
            self._norm_next = False
            self._awaiting_opt_step = True
            self._new_step_state()
            return stats

        misuse = self._misuse()
        comp = self.compressor
        self._launch_rest(in_hook=False)  # only when no backward ran on this rank
        if misuse:
            self._drain()
            raise RuntimeError(misuse)
        for rnd in range(comp.rounds):
            for b in range(len(plan)):
                inf = st.inflight[b]
                w0 = clock.mark()
                for w in inf.works:
                    wait_work(w, self.timeout_s, f"gradient bucket {b}")
                w1 = clock.mark()
                st.wait_spans.append((w0, w1))
                c0 = clock.mark()
                if inf.carried is not None:
                    inf.gathered, st.word = detach_control(
                        comp, inf.gathered, inf.carried, self.world_size
                    )
                if rnd + 1 < comp.rounds:
                    payload = comp.advance(rnd + 1, inf.gathered, inf.ctx)
                    c1 = clock.mark()
                    works, gathered = self._issue(b, rnd + 1, payload)
                    st.inflight[b] = _Inflight(rnd + 1, payload, inf.ctx, works, gathered)
                else:
                    self._finish_bucket(b, inf)
                    c1 = clock.mark()
                st.compress_spans.append((c0, c1))
        if st.word is not None:
            word = st.word.tolist()
            flagged, used = word[0] > 0, word[1 : 1 + len(self.params)]
        else:
            flagged, used = False, self._used_counts()
        if flagged and not comp.propagates_nonfinite:
            # the sampled payload may have dropped this rank's inf: make every rank's
            # gradient non-finite, as a plain all-reduce would, so GradScaler skips
            for buf in plan.buffers:
                buf.fill_(math.nan)
        self._write_grads(used)
        t_end = clock.mark()

        # ---- outside the measured region: resolve timings and statistics ----
        t_stats = time.perf_counter()
        compress_s = sum(clock.seconds(a, c) for a, c in st.compress_spans)
        hook_compress_s = sum(
            clock.seconds(a, c) for a, c in st.compress_spans[: st.hook_compress_spans]
        )
        comm_wait_s = sum(clock.seconds(a, c) for a, c in st.wait_spans)
        compute_s = max(0.0, clock.seconds(st.t_forward, t_start) - hook_compress_s)
        clock.seconds(t_start, t_end)  # ensures all events resolved
        # a step measuring the compression error needs to know whether it is finite
        grad_norm = _norm(plan.buffers) if self._norming or self._measuring else None
        if grad_norm is not None:  # non-finite iff some element is
            nonfinite: bool | None = not math.isfinite(grad_norm) or flagged
        elif comp.propagates_nonfinite:
            nonfinite = None  # not measured: see grad_norm_every
        else:
            nonfinite = flagged  # carried in the exchange: exact on every step
        error = self._compression_error(nonfinite)
        instrumentation_s = time.perf_counter() - t_stats
        stats = StepStats(
            step=self._step,
            bytes_sent=st.bytes_sent,
            compute_s=compute_s,
            comm_wait_s=comm_wait_s,
            compress_s=compress_s,
            bucket_bytes=tuple(plan.bucket_bytes),
            compression_error=error,
            grad_norm=grad_norm,
            nonfinite=nonfinite,
            synchronized=True,
            collectives=st.collectives,
            instrumentation_s=instrumentation_s,
        )
        self._step += 1
        self._measure_next = False
        self._norm_next = False
        self._awaiting_opt_step = True
        self._control_bytes = st.control_bytes
        self._new_step_state()
        return stats

    def _used_counts(self) -> list[int] | None:
        """On how many ranks each parameter was used, where the result cannot tell.

        For compressors that keep zeros exact (:attr:`_infers_unused`): a parameter whose
        synchronised gradient has a non-zero (or NaN) element was used on some rank. Only
        if some parameter's result is all zero (unused everywhere, or used with an
        all-zero gradient) do the ranks, which all see the same result and so decide
        alike, all-reduce their used flags for those parameters (a collective DDP with
        ``find_unused_parameters=True`` issues every step).

        Returns:
            None when every parameter was used somewhere (no collective), else a count per
            parameter (0: unused on every rank).
        """
        st = self._state
        plan = self.plan
        if self._probes is None:
            self._probes = [self._probe_index(b) for b in range(len(plan))]
        unsure = [i for i, p in enumerate(self.params) if p.numel() == 0]
        for buf, (index, owners) in zip(plan.buffers, self._probes, strict=True):
            if not owners:
                continue
            nonzero = (buf.index_select(0, index) != 0).tolist()  # NaN counts as non-zero
            seen: dict[int, bool] = {}
            for i, nz in zip(owners, nonzero, strict=True):
                seen[i] = seen.get(i, False) or nz
            # only a parameter whose probes are all zero is read whole
            unsure += [i for i, nz in seen.items() if not nz and not plan.views[i].any()]
        if not unsure:
            return None
        unsure.sort()
        ctl = torch.tensor([st.used[i] for i in unsure], dtype=torch.int32, device=self._ctl_device)
        w0 = self._clock.mark()
        wait_work(
            dist.all_reduce(ctl, group=self.group, async_op=True),
            self.timeout_s,
            "used-parameter all-reduce",
        )
        st.wait_spans.append((w0, self._clock.mark()))
        st.bytes_sent += ctl.numel() * ctl.element_size()
        st.collectives += 1
        st.control_bytes = ctl.numel() * ctl.element_size()
        counts = [1] * len(self.params)
        for i, c in zip(unsure, ctl.tolist(), strict=True):
            counts[i] = c
        return counts

    def _probe_index(self, b: int) -> tuple[torch.Tensor, list[int]]:
        """Flat positions in bucket ``b`` probed per parameter, and the owner of each.

        Up to :data:`_PROBES` positions per parameter, one in each of as many equal
        segments of its region at a varying offset (a dead ReLU unit zeroes a whole row
        or column of a weight's gradient, so a first element alone is often zero).
        """
        plan = self.plan
        positions, owners = [], []
        for off, i in zip(plan.offsets[b], plan.buckets[b], strict=True):
            numel = self.params[i].numel()
            count = min(_PROBES, numel)
            for t in range(count):
                seg = numel // count
                positions.append(off + t * seg + (t * 131) % seg)
                owners.append(i)
        index = torch.tensor(positions, dtype=torch.long, device=plan.buffers[b].device)
        return index, owners

    def _misuse(self) -> str:
        """What was done wrongly between backward and synchronize() ('' if nothing)."""
        st = self._state
        plan = self.plan
        for i, (pv, g, gv) in st.versions.items():
            p = self.params[i]
            if p._version != pv:
                return (
                    "parameters changed between backward() and synchronize(): "
                    "optimizer.step() (or another in-place update) ran before "
                    "synchronize(); call synchronize() first, then optimizer.step()"
                )
            if p.grad is not g or (gv >= 0 and g._version != gv):
                return self._grad_misuse_msg()
        for b, v in st.bucket_versions.items():
            if plan.buffers[b]._version != v:
                return self._grad_misuse_msg()
        return ""

    @staticmethod
    def _grad_misuse_msg() -> str:
        return (
            "a gradient was changed between backward() and synchronize() (e.g. "
            "clip_grad_norm_ or GradScaler.unscale_ on local gradients); replicas would "
            "diverge: call synchronize() first and clip / unscale the synchronised gradient"
        )

    def _drain(self) -> None:
        """Wait for every collective in flight (before raising, so the group stays usable)."""
        for inf in self._state.inflight.values():
            for w in inf.works:
                wait_work(w, self.timeout_s, "gradient bucket")
        self._new_step_state()

    def _finish_bucket(self, b: int, inf: _Inflight) -> None:
        decode(self.compressor, inf.gathered, inf.ctx, self.plan.buffers[b], self.world_size)

    def _write_grads(self, used_count: list[int] | None) -> None:
        plan = self.plan
        if used_count is None:  # used on some rank, every one
            used_count = [1] * len(plan.params)
        for p, view, n in zip(plan.params, plan.views, used_count, strict=True):
            g = p.grad
            if n == 0:
                continue  # unused on every rank: .grad untouched, as in DDP
            if g is not None and _is_view_of(g, view):
                continue
            if g is None:
                p.grad = view if _can_alias(p, view) else view.clone().view_as(p)
            else:
                g.copy_(view)

    def _compression_error(self, nonfinite: bool) -> float | None:
        if self.config.compression.lossless:
            return 0.0
        if not self._measuring or nonfinite:
            return None
        plan = self.plan
        measured = [b for b in range(len(plan.buffers)) if b in self._err_ref]
        if not measured:
            return None
        # one all-reduce of every bucket's sampled reference (a few collectives fewer)
        refs = torch.cat([self._err_ref[b] for b in measured])
        dist.all_reduce(refs, group=self.group)
        num = den = 0.0
        at = 0
        for b in measured:
            n = self._err_ref[b].numel()
            ref, buf, idx = refs[at : at + n], plan.buffers[b], self._err_idx[b]
            at += n
            got = buf if idx is None else buf.index_select(0, idx)
            num += float(torch.linalg.vector_norm(ref - got)) ** 2
            den += float(torch.linalg.vector_norm(ref)) ** 2
        if den == 0.0:
            return None
        return math.sqrt(num / den)

    def _error_index(self, b: int) -> torch.Tensor | None:
        """Bucket ``b``'s sampled positions for ``compression_error`` (None: all of them).

        Sorted, distinct, up to :attr:`error_sample` of them, drawn uniformly from ``seed``
        and the bucket's index and size, so every rank reads the same coordinates (the
        seed is checked equal across ranks).
        """
        buf = self._plan.buffers[b]
        n, m = buf.numel(), self.error_sample
        if m == 0 or n <= m:
            return None
        g = torch.Generator().manual_seed((self.seed * 0x9E3779B1 + b * 0x85EBCA77 + n) % 2**63)
        return torch.randint(0, n, (m,), generator=g).unique().to(buf.device)

    @torch.no_grad()
    def after_optimizer_step(self) -> AveragingStats:
        """Count one optimizer step; with ``sync_period = H > 1`` average parameters every H.

        Call exactly once per optimizer step on every rank (not per parameter group),
        also when the step was skipped (``GradScaler`` after a non-finite gradient), so
        every rank counts the same steps.

        Returns:
            :class:`AveragingStats` saying whether parameters were averaged now.

        Raises:
            RuntimeError: a backward ran since the last :meth:`synchronize` (the
                optimizer stepped on unsynchronised gradients).
        """
        if self._state.started or self._state.accumulating:
            raise RuntimeError(
                "after_optimizer_step() after a backward that was not synchronised: call "
                "synchronize() after backward and before optimizer.step()"
            )
        self._awaiting_opt_step = False
        averaged, nbytes, secs = self._averager.optimizer_step()
        return AveragingStats(averaged, nbytes, secs, self._averager.optimizer_steps)

    @property
    def replicas_apart(self) -> bool:
        """Whether local-SGD steps since the last average left the replicas apart.

        True when un-averaged local steps left the parameters apart (``sync_period > 1``)
        or any local step left the optimizer's per-parameter state apart; :meth:`consensus`
        makes them identical again.
        """
        state = self.optimizer is not None and self._averager.local_steps > 0
        return self._averager.params_apart or state

    @torch.no_grad()
    def consensus(self, optimizer_state: bool = True) -> AveragingStats:
        """Make the replicas identical now if local-SGD steps left them apart.

        Averages parameters when there are un-averaged local steps and, with
        :attr:`optimizer` set and ``optimizer_state``, the optimizer's per-parameter state
        when any local step happened since it was last averaged. A collective in those
        cases (every rank must call it at the same point); a no-op otherwise
        (``sync_period == 1`` keeps replicas equal).

        Args:
            optimizer_state: also average the optimizer state. ``False`` leaves it
                rank-local, as local SGD does between averages (Qsparse-local-SGD keeps
                momentum local); a later switch to ``sync_period = 1`` still averages it
                first (:meth:`reconfigure`), so replicas never drift. Use ``False`` for a
                consensus *model* inside a local-SGD run (evaluation at a boundary).

        Returns:
            :class:`AveragingStats` (``averaged`` False when nothing had to be done;
            bytes and seconds include the optimizer state).
        """
        nbytes, secs, averaged = 0, 0.0, False
        if self._averager.params_apart:
            nbytes, secs = self._averager.average()
            averaged = True
        if optimizer_state and self.optimizer is not None and self._averager.local_steps > 0:
            b, t = self._average_optimizer_state()
            nbytes, secs, averaged = nbytes + b, secs + t, True
        return AveragingStats(averaged, nbytes, secs, self._averager.optimizer_steps)

    # -- state --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state: config, counters, residuals, compressor and averager state."""
        return {
            "config": self.config.to_dict(),
            "step": self._step,
            "optimizer_steps": self._averager.optimizer_steps,
            "residuals": self._residuals.state_dict(),
            "compressor": self.compressor.state_dict(),
            "averager": self._averager.state_dict(),
            "local_steps": self._averager.local_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (reconfigures to the saved config first).

        Raises:
            ValueError: the state does not match this model's buckets.
        """
        self.reconfigure(CommConfig(**state["config"]))
        self._residuals.load_state_dict(state["residuals"])
        keys = {layout.key for layout in self.plan.layouts}
        keys |= {DELTA_KEY_PREFIX + layout.key for layout in self.plan.layouts}
        unknown = set(self._residuals.keys()) - keys
        if unknown:
            self._residuals.reset()
            raise ValueError(
                f"residuals for unknown buckets {sorted(unknown)}; known: {sorted(keys)}"
            )
        self.compressor.load_state_dict(state["compressor"])
        self._averager.load_state_dict(state["averager"])
        self._step = int(state["step"])
        self._averager.optimizer_steps = int(state["optimizer_steps"])
        self._averager.local_steps = int(state.get("local_steps", 0))

    def remove_hooks(self) -> None:
        """Detach from the model (the synchronizer cannot be used afterwards)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _describe(named: Iterator[tuple[str, torch.Tensor]]) -> str:
    """Names, shapes and dtypes (what must agree across ranks), as one string."""
    return ";".join(f"{n}:{tuple(t.shape)}:{t.dtype}" for n, t in named)


def _is_view_of(t: torch.Tensor, view: torch.Tensor) -> bool:
    return (
        t.data_ptr() == view.data_ptr()
        and t.shape == view.shape
        and t.stride() == view.stride()
        and t.dtype == view.dtype
    )


def _can_alias(param: torch.Tensor, grad: torch.Tensor) -> bool:
    # A bucket view may stand in for .grad only where it has the parameter's strides
    # (the gradient layout contract) and lives on the same device/dtype.
    return (
        param.stride() == grad.stride()
        and param.dtype == grad.dtype
        and param.device == grad.device
    )


def _norm(tensors: list[torch.Tensor]) -> float:
    if not tensors:
        return 0.0
    sq = sum(float(torch.linalg.vector_norm(t.float())) ** 2 for t in tensors if t.numel())
    return math.sqrt(sq)
