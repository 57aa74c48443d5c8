"""The executed action path: bucketed, overlapping, compressed gradient synchronisation."""

from __future__ import annotations

import functools
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from commgym.collectives import kernels
from commgym.collectives.averaging import (
    DELTA_KEY_PREFIX,
    PeriodicAverager,
    average_optimizer_state,
)
from commgym.collectives.bucketing import BucketPlan
from commgym.collectives.compressors import Compressor, make_compressor
from commgym.collectives.config import CommConfig
from commgym.collectives.exchange import all_gather_flat, decode, issue
from commgym.collectives.residual import ResidualMemory
from commgym.collectives.stats import AveragingStats, StepStats

__all__ = ["GradientSynchronizer", "all_gather_flat"]


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


@dataclass
class _StepState:
    """Per-step bookkeeping, reset after every ``synchronize()``."""

    ready: list[bool]
    pending: list[int]
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

        sync = GradientSynchronizer(model, CommConfig("topk:0.01", bucket_mb=4))
        for x, y in data:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            stats = sync.synchronize()          # StepStats
            opt.step()
            sync.after_optimizer_step()          # local-SGD averaging when H > 1

    Args:
        model: the replicated module (same parameters, same order on every rank). Its
            parameters must be identical across ranks at construction (broadcast them).
        config: the initial communication configuration.
        group: process group (default: the world). Must already be initialised.
        seed: seed of all cross-rank randomness (random-k, stochastic rounding, PowerSGD's
            initial ``Q``); must be equal on every rank.
        error_every: measure ``compression_error`` every this many steps (an extra exact
            fp32 all-reduce after the measured region, not counted in ``bytes_sent``);
            0 disables it.
        optimizer: the optimizer stepping ``model`` (settable later as
            ``sync.optimizer``). With it, :meth:`consensus` and a switch from local SGD
            back to ``sync_period = 1`` also average its per-parameter state (momentum,
            Adam moments; :func:`~commgym.collectives.averaging.average_optimizer_state`),
            so the replicas are identical again; without it they stay apart under
            ``H = 1`` whenever the optimizer has rank-local state (a warning says so).

    Raises:
        RuntimeError: ``torch.distributed`` is not initialised.
        TypeError: ``config`` is not a ``CommConfig``.
        ValueError: the model has no trainable parameters, or a lossy compression is
            asked for parameters that are not fp32.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: CommConfig,
        group: dist.ProcessGroup | None = None,
        *,
        seed: int = 0,
        error_every: int = 1,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "GradientSynchronizer needs an initialised process group: call "
                "torch.distributed.init_process_group(...) first (e.g. under torchrun)"
            )
        if isinstance(error_every, bool) or not isinstance(error_every, int) or error_every < 0:
            raise ValueError(f"error_every must be an integer >= 0, got {error_every!r}")
        self.model = model
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.seed = int(seed)
        self.error_every = error_every
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("model has no parameters with requires_grad=True to synchronise")
        self._clock = _Clock(self.params[0].device)
        kernels.warmup(self.params[0].device.type)  # JIT compile outside measured steps
        self._averager = PeriodicAverager(self.params, 1, group)
        self.optimizer = optimizer
        # optimizer steps taken with H > 1 since the optimizer state was last averaged
        self._local_steps = 0
        self._warned_state = False
        self._residuals = ResidualMemory()
        self._config: CommConfig | None = None
        self._plan: BucketPlan | None = None
        self._compressor: Compressor | None = None
        self._err_ref: dict[int, torch.Tensor] = {}
        self._gather_bufs: dict[tuple[int, int, int], torch.Tensor] = {}
        self._apply(self._check_config(config))
        self._handles = [
            p.register_post_accumulate_grad_hook(functools.partial(self._on_grad_ready, i))
            for i, p in enumerate(self.params)
        ]
        self._handles.append(model.register_forward_pre_hook(self._on_forward))

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
            self._gather_bufs.clear()
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
        self._opt_steps = 0
        self._measure_next = False
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
        A config equal to the current one is a no-op.

        Raises:
            RuntimeError: called between ``backward()`` and ``synchronize()``.
            TypeError, ValueError: as for the constructor.
        """
        config = self._check_config(config)
        if self._state.started:
            raise RuntimeError(
                "reconfigure() called during a step (after backward started, before "
                "synchronize()); call it between steps"
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
        if self._local_steps == 0:
            return 0, 0.0
        self._local_steps = 0
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
        )

    def _on_forward(self, module: torch.nn.Module, args: Any) -> None:
        # only training forwards start a step (evaluation under no_grad does not)
        if self._state.t_forward is None and torch.is_grad_enabled():
            self._state.t_forward = self._clock.mark()

    def _on_grad_ready(self, index: int, param: torch.Tensor) -> None:
        st = self._state
        if self.config.sync_period > 1:
            st.started = True
            return
        if st.ready[index]:
            raise RuntimeError(
                f"gradient of parameter {index} was accumulated twice before synchronize(); "
                "call synchronize() after every backward (gradient accumulation across "
                "backward passes is not supported)"
            )
        st.started = True
        st.ready[index] = True
        plan = self.plan
        view = plan.views[index]
        grad = param.grad
        if grad is not None and not _is_view_of(grad, view):
            with torch.no_grad():
                view.copy_(grad)
            if _can_alias(param, grad):
                param.grad = view
        b = plan.bucket_of[index]
        st.pending[b] -= 1
        if st.pending[b] == 0:
            self._launch_ready()

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
        flat.div_(self.world_size)
        if self._measuring and flat.numel():
            ref = self._err_ref.get(b)
            if ref is None:
                ref = self._err_ref[b] = torch.empty_like(flat, dtype=torch.float32)
            ref.copy_(flat)
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
        t1 = self._clock.mark()
        st.compress_spans.append((t0, t1))
        if in_hook:
            st.hook_compress_spans += 1
        works, gathered = self._issue(b, 0, payload)
        st.inflight[b] = _Inflight(0, payload, ctx, works, gathered)

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

    @torch.no_grad()
    def synchronize(self) -> StepStats:
        """Finish this step's communication and write averaged gradients into ``.grad``.

        Call on every rank after ``backward()`` and before ``optimizer.step()``. Buckets
        whose parameters got no gradient this step (unused parameters) are sent as zeros.
        On a local-SGD step (``sync_period > 1``) nothing is communicated.

        Returns:
            The measured :class:`StepStats` of this rank (``nonfinite`` agrees on all ranks).
        """
        st = self._state
        clock = self._clock
        t_start = clock.mark()
        plan = self.plan
        if self.config.sync_period > 1:
            stats = StepStats(
                step=self._step,
                bytes_sent=0,
                compute_s=clock.seconds(st.t_forward, t_start),
                comm_wait_s=0.0,
                compress_s=0.0,
                bucket_bytes=tuple(plan.bucket_bytes),
                compression_error=None,
                grad_norm=_norm([p.grad for p in self.params if p.grad is not None]),
                nonfinite=not all(
                    bool(torch.isfinite(p.grad).all()) for p in self.params if p.grad is not None
                ),
                synchronized=False,
                collectives=0,
            )
            self._step += 1
            self._new_step_state()
            return stats

        comp = self.compressor
        # Buckets not launched by hooks (unused parameters, or no backward at all).
        for b in range(st.next_launch, len(plan)):
            for i in plan.buckets[b]:
                if not st.ready[i]:
                    plan.views[i].zero_()
                    st.ready[i] = True
            st.pending[b] = 0
            self._launch(b, in_hook=False)
        st.next_launch = len(plan)
        flag_work = None
        if st.nonfinite_local is not None:
            flag_work = dist.all_reduce(st.nonfinite_local, group=self.group, async_op=True)
            st.bytes_sent += 4
            st.collectives += 1

        for rnd in range(comp.rounds):
            for b in range(len(plan)):
                inf = st.inflight[b]
                w0 = clock.mark()
                for w in inf.works:
                    w.wait()
                w1 = clock.mark()
                st.wait_spans.append((w0, w1))
                c0 = clock.mark()
                if rnd + 1 < comp.rounds:
                    payload = comp.advance(rnd + 1, inf.gathered, inf.ctx)
                    c1 = clock.mark()
                    works, gathered = self._issue(b, rnd + 1, payload)
                    st.inflight[b] = _Inflight(rnd + 1, payload, inf.ctx, works, gathered)
                else:
                    self._finish_bucket(b, inf)
                    c1 = clock.mark()
                st.compress_spans.append((c0, c1))
        if flag_work is not None:
            w0 = clock.mark()
            flag_work.wait()
            st.wait_spans.append((w0, clock.mark()))
        self._write_grads()
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
        grad_norm = _norm(plan.buffers)  # non-finite iff some element is
        nonfinite = not math.isfinite(grad_norm) or (
            st.nonfinite_local is not None and int(st.nonfinite_local.sum()) > 0
        )
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
        self._new_step_state()
        return stats

    def _finish_bucket(self, b: int, inf: _Inflight) -> None:
        decode(self.compressor, inf.gathered, inf.ctx, self.plan.buffers[b], self.world_size)

    def _write_grads(self) -> None:
        plan = self.plan
        for p, view in zip(plan.params, plan.views, strict=True):
            g = p.grad
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
        num = den = 0.0
        for b, buf in enumerate(plan.buffers):
            ref = self._err_ref.get(b)
            if ref is None:
                continue
            dist.all_reduce(ref, group=self.group)
            num += float(torch.linalg.vector_norm(ref - buf)) ** 2
            den += float(torch.linalg.vector_norm(ref)) ** 2
        if den == 0.0:
            return None
        return math.sqrt(num / den)

    @torch.no_grad()
    def after_optimizer_step(self) -> AveragingStats:
        """Count one optimizer step; with ``sync_period = H > 1`` average parameters every H.

        Call exactly once per optimizer step on every rank (not per parameter group).

        Returns:
            :class:`AveragingStats` saying whether parameters were averaged now.
        """
        self._opt_steps += 1
        if self.config.sync_period == 1:
            return AveragingStats(False, 0, 0.0, self._opt_steps)
        self._local_steps += 1
        averaged, nbytes, secs = self._averager.step()
        return AveragingStats(averaged, nbytes, secs, self._opt_steps)

    @torch.no_grad()
    def consensus(self) -> AveragingStats:
        """Make the replicas identical now if local-SGD steps left them apart.

        Averages parameters when there are un-averaged local steps and, with
        :attr:`optimizer` set, the optimizer's per-parameter state when any local step
        happened since it was last averaged. A collective in those cases (every rank
        must call it at the same point); a no-op otherwise (``sync_period == 1`` keeps
        replicas equal).

        Returns:
            :class:`AveragingStats` (``averaged`` False when nothing had to be done;
            bytes and seconds include the optimizer state).
        """
        nbytes, secs, averaged = 0, 0.0, False
        if self.config.sync_period > 1 and self._averager.steps_since_average > 0:
            nbytes, secs = self._averager.average()
            averaged = True
        if self.optimizer is not None and self._local_steps > 0:
            b, t = self._average_optimizer_state()
            nbytes, secs, averaged = nbytes + b, secs + t, True
        return AveragingStats(averaged, nbytes, secs, self._opt_steps)

    # -- state --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state: config, counters, residuals, compressor and averager state."""
        return {
            "config": self.config.to_dict(),
            "step": self._step,
            "optimizer_steps": self._opt_steps,
            "residuals": self._residuals.state_dict(),
            "compressor": self.compressor.state_dict(),
            "averager": self._averager.state_dict(),
            "local_steps": self._local_steps,
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
        self._opt_steps = int(state["optimizer_steps"])
        self._local_steps = int(state.get("local_steps", 0))

    def remove_hooks(self) -> None:
        """Detach from the model (the synchronizer cannot be used afterwards)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _is_view_of(t: torch.Tensor, view: torch.Tensor) -> bool:
    return (
        t.data_ptr() == view.data_ptr()
        and t.shape == view.shape
        and t.stride() == view.stride()
        and t.dtype == view.dtype
    )


def _can_alias(param: torch.Tensor, grad: torch.Tensor) -> bool:
    # A bucket view may stand in for .grad only where the parameter is contiguous
    # (the gradient layout contract) and lives on the same device/dtype.
    return param.is_contiguous() and param.dtype == grad.dtype and param.device == grad.device


def _norm(tensors: list[torch.Tensor]) -> float:
    if not tensors:
        return 0.0
    sq = sum(float(torch.linalg.vector_norm(t.float())) ** 2 for t in tensors if t.numel())
    return math.sqrt(sq)
