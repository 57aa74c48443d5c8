"""A user's own ``DistributedDataParallel`` model steered like a ``GradientSynchronizer``."""

from __future__ import annotations

import functools
import math
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from commgym.collectives.averaging import PeriodicAverager, average_optimizer_state
from commgym.collectives.checks import check_int
from commgym.collectives.config import CommConfig
from commgym.collectives.ddp_hook import ddp_comm_hook
from commgym.collectives.stats import AveragingStats, StepStats
from commgym.collectives.synchronizer import (
    DEFAULT_TIMEOUT_S,
    check_same_on_all_ranks,
    comm_device,
)

__all__ = ["DDPHookSynchronizer"]


class DDPHookSynchronizer:
    """Switches compression and local-SGD period of a DDP model through one comm hook.

    Registers a single commgym comm hook (:func:`~commgym.collectives.ddp_comm_hook`)
    on ``ddp_model`` and exposes the :class:`GradientSynchronizer` interface that
    :class:`~commgym.agents.scheduler.CommScheduler` drives: :meth:`reconfigure` changes
    the hook's compressor, and ``sync_period = H > 1`` makes the hook a pass-through
    (gradients stay local) with parameters averaged every ``H`` optimizer steps in
    :meth:`after_optimizer_step` (periodic model averaging, as torch's
    ``PeriodicModelAverager``).

    DDP communicates inside ``backward()``, so :meth:`synchronize` only reads what the
    hook measured. **Bucket size is DDP's**: DDP fixes its buckets (``bucket_cap_mb``)
    and rebuilds them once after the first iteration; rebuilding the wrapper at every
    decision would cost a parameter broadcast and a new reducer, so a config's
    ``bucket_mb`` is not applied (a warning says so once) and ``StepStats.bucket_bytes``
    reports DDP's actual buckets. Everything else DDP guarantees (broadcast at
    construction, buffers, unused parameters, ``no_sync``) is DDP's own.

    Args:
        ddp_model: the user's ``DistributedDataParallel`` model (no comm hook yet).
        config: the initial configuration.
        group: process group (default: the world).
        seed: cross-rank seed of the compressors (checked equal on every rank).
        optimizer: averaged with the parameters when leaving local SGD.
        timeout_s: collective timeout of the checks, seconds.
        grad_norm_every: measure ``StepStats.grad_norm`` every this many steps (a pass
            over the gradients DDP does not make); 0 only on steps asked for with
            :meth:`request_grad_norm`. Unmeasured steps report ``grad_norm`` and
            ``nonfinite`` as ``None``, as :class:`GradientSynchronizer` does.

    Raises:
        TypeError: ``ddp_model`` is not a ``DistributedDataParallel``.
        ValueError: on every rank, when configurations or seeds differ across ranks.
    """

    def __init__(
        self,
        ddp_model: DistributedDataParallel,
        config: CommConfig,
        group: dist.ProcessGroup | None = None,
        *,
        seed: int = 0,
        optimizer: torch.optim.Optimizer | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        grad_norm_every: int = 1,
    ) -> None:
        check_int("grad_norm_every", grad_norm_every, 0)
        if not isinstance(ddp_model, DistributedDataParallel):
            raise TypeError(
                f"ddp_model must be a DistributedDataParallel, got {type(ddp_model).__name__}"
            )
        self.model = ddp_model
        self.group = group
        self.seed = int(seed)
        self.optimizer = optimizer
        self.timeout_s = float(timeout_s)
        self.grad_norm_every = grad_norm_every
        self._norm_next = False
        self.world_size = dist.get_world_size(group)
        self.params = [p for p in ddp_model.module.parameters() if p.requires_grad]
        self._ctl_device = comm_device(group, self.params[0])
        self._check(config, "DDPHookSynchronizer construction")
        self.state, hook = ddp_comm_hook(
            config.compression,
            error_feedback=config.error_feedback,
            seed=self.seed,
            group=group,
            model=ddp_model.module,
        )
        ddp_model.register_comm_hook(self.state, hook)
        self._averager = PeriodicAverager(self.params, 1, group)
        self._config = config
        self._bucket_mb = config.bucket_mb
        self._warned_bucket = False
        self._step = 0
        self._set_period(config.sync_period)
        self._t_forward: float | None = None
        self._bytes_mark = 0
        self._handle = ddp_model.register_forward_pre_hook(self._on_forward)
        # DDP rebuilds its buckets at the second synchronising forward, in the order the
        # gradients became ready in the first synchronising backward; that order is
        # recorded so a checkpoint can name the buckets DDP uses next (see state_dict)
        self._rebuilds = not ddp_model.find_unused_parameters and not getattr(
            ddp_model, "static_graph", False
        )
        self._ready_order: list[int] = []
        self._sync_forwards = 0
        self._ready_handles = (
            [
                p.register_post_accumulate_grad_hook(functools.partial(self._on_ready, i))
                for i, p in enumerate(self.params)
            ]
            if self._rebuilds
            else []
        )

    # -- the GradientSynchronizer interface -----------------------------------------------
    @property
    def config(self) -> CommConfig:
        """The configuration in force (``bucket_mb`` as first given: DDP's buckets)."""
        return self._config

    def no_sync(self) -> Any:
        """DDP's own ``no_sync()`` (gradient accumulation)."""
        return self.model.no_sync()

    def request_error_measurement(self) -> None:
        """No effect: the hook does not measure compression error (reported as None)."""

    def request_grad_norm(self) -> None:
        """Measure ``grad_norm`` on the next step regardless of ``grad_norm_every``."""
        self._norm_next = True

    def _on_forward(self, module: torch.nn.Module, args: Any) -> None:
        if self._t_forward is None and torch.is_grad_enabled():
            self._t_forward = time.perf_counter()
        if torch.is_grad_enabled() and self.model.require_backward_grad_sync:
            self._sync_forwards += 1
            if self._sync_forwards > 1 and self._ready_handles:  # DDP rebuilds now
                for h in self._ready_handles:
                    h.remove()
                self._ready_handles = []

    def _on_ready(self, index: int, param: torch.Tensor) -> None:
        if self._sync_forwards == 1 and index not in self._ready_order:
            self._ready_order.append(index)

    def _next_layouts(self) -> list[tuple[int, ...]] | None:
        """DDP's buckets after its rebuild (parameter indices), once the order is known.

        The assignment DDP's reducer computes (``compute_bucket_assignment_by_size`` over
        the first synchronising backward's ready order, first bucket capped as DDP caps
        it); None while DDP still runs its initial buckets (a fresh wrapper has the same)
        or never rebuilds (``find_unused_parameters=True``).
        """
        if not self._rebuilds or len(self._ready_order) != len(self.params):
            return None
        ddp = self.model
        cap = int(ddp.bucket_bytes_cap)
        first = dist._DEFAULT_FIRST_BUCKET_BYTES if ddp.bucket_bytes_cap_default else cap
        order = self._ready_order
        buckets, _ = dist._compute_bucket_assignment_by_size(
            [self.params[i] for i in order], [first, cap], [False] * len(order), order
        )
        return [tuple(int(i) for i in b) for b in buckets]

    def synchronize(self) -> StepStats:
        """What the hook did for this step's backward (DDP already synchronised).

        Returns:
            :class:`StepStats`: bytes handed to collectives, compress/decompress time,
            ``compute_s`` = forward start to now (backward includes DDP's communication,
            so ``comm_wait_s`` is 0), the gradient norm and the non-finite flag (equal on
            every rank at ``sync_period == 1``; both ``None`` on a step that does not
            measure the norm, see ``grad_norm_every``).
        """
        now = time.perf_counter()
        st = self.state
        grad_norm: float | None = None
        nonfinite: bool | None = None
        if self._norm_next or (self.grad_norm_every and self._step % self.grad_norm_every == 0):
            grads = [p.grad for p in self.params if p.grad is not None]
            grad_norm = math.sqrt(
                sum(float(torch.linalg.vector_norm(g.float())) ** 2 for g in grads)
            )
            nonfinite = st.nonfinite or not math.isfinite(grad_norm)
        compress_s = st.compress_s
        stats = StepStats(
            step=self._step,
            bytes_sent=st.bytes_sent - self._bytes_mark,
            compute_s=max(0.0, now - (self._t_forward or now) - compress_s),
            comm_wait_s=0.0,
            compress_s=compress_s,
            bucket_bytes=tuple(self._ddp_bucket_bytes()),
            compression_error=0.0 if self.config.compression.lossless else None,
            grad_norm=grad_norm,
            nonfinite=nonfinite,
            synchronized=st.communicate,
            collectives=0,
        )
        self._bytes_mark = st.bytes_sent
        st.compress_s = 0.0
        st.nonfinite = False
        self._t_forward = None
        self._step += 1
        self._norm_next = False
        return stats

    def _ddp_bucket_bytes(self) -> list[int]:
        """Bytes of the buckets DDP handed to the hook last iteration (its actual buckets)."""
        layouts = self.state._seen or self.state.layouts
        if not layouts:
            return [sum(p.numel() * p.element_size() for p in self.params)]
        return [
            sum(self.params[i].numel() * self.params[i].element_size() for i in lay)
            for lay in layouts
        ]

    @torch.no_grad()
    def after_optimizer_step(self) -> AveragingStats:
        """Count one optimizer step; average parameters every ``sync_period`` steps."""
        averaged, nbytes, secs = self._averager.optimizer_step()
        return AveragingStats(averaged, nbytes, secs, self._averager.optimizer_steps)

    @property
    def replicas_apart(self) -> bool:
        """Whether local-SGD steps since the last average left the replicas apart.

        As :attr:`GradientSynchronizer.replicas_apart`: parameters (``sync_period > 1``
        with steps since the average) or the optimizer's state (any local step).
        """
        state = self.optimizer is not None and self._averager.local_steps > 0
        return self._averager.params_apart or state

    @torch.no_grad()
    def consensus(self) -> AveragingStats:
        """Average parameters (and optimizer state) if local-SGD steps left them apart."""
        nbytes, secs, averaged = 0, 0.0, False
        if self._averager.params_apart:
            nbytes, secs = self._averager.average()
            averaged = True
        if self.optimizer is not None and self._averager.local_steps > 0:
            self._averager.local_steps = 0
            b, t = average_optimizer_state(self.optimizer, self.group)
            nbytes, secs, averaged = nbytes + b, secs + t, True
        return AveragingStats(averaged, nbytes, secs, self._averager.optimizer_steps)

    def reconfigure(self, config: CommConfig) -> None:
        """Switch compression and period at a step boundary (a collective on every rank).

        Raises:
            ValueError: on every rank, when the ranks pass different configurations.
        """
        self._check(config, "DDPHookSynchronizer.reconfigure")
        if config.bucket_mb != self._bucket_mb and not self._warned_bucket:
            self._warned_bucket = True
            warnings.warn(
                f"bucket size {config.bucket_mb:g} MiB not applied: the DDP wrapper's buckets "
                f"(bucket_cap_mb) stay as built; compression and period are switched",
                stacklevel=2,
            )
        if config == self._config:
            return
        if self._averager.steps_since_average > 0:
            self._averager.average()
        if config.sync_period == 1:
            self.consensus()
        self.state.reconfigure(config.compression, error_feedback=config.error_feedback)
        self._set_period(config.sync_period)
        self._config = config
        self._step = 0

    def _set_period(self, period: int) -> None:
        self._averager.period = period
        self._averager.steps_since_average = 0
        self._averager.steps = 0
        self.state.communicate = period == 1

    def _check(self, config: CommConfig, context: str) -> None:
        check_same_on_all_ranks(
            {"config": repr(config.to_dict()), "seed": str(self.seed)},
            group=self.group,
            timeout_s=self.timeout_s,
            device=self._ctl_device,
            context=context,
        )

    def state_dict(self) -> dict[str, Any]:
        """Config, counters, hook state (residuals, layouts) and averager state.

        The saved layouts are the buckets DDP hands the hook next: after DDP's rebuild
        (or with the rebuild pending, right after the first iteration) the rebuilt
        buckets, so the resumed job compresses its first iteration as this one would.
        """
        hook = self.state.state_dict()
        layouts = self._next_layouts()
        if layouts is not None:
            hook["layouts"] = [list(lay) for lay in layouts]
        return {
            "config": self._config.to_dict(),
            "step": self._step,
            "optimizer_steps": self._averager.optimizer_steps,
            "local_steps": self._averager.local_steps,
            "hook": hook,
            "averager": self._averager.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (this rank's; save one file per rank)."""
        config = CommConfig(**state["config"])
        self._check(config, "DDPHookSynchronizer.load_state_dict")
        self.state.load_state_dict(state["hook"])
        self._set_period(config.sync_period)
        self._config = config
        self._averager.load_state_dict(state["averager"])
        self._step = int(state["step"])
        self._averager.optimizer_steps = int(state["optimizer_steps"])
        self._averager.local_steps = int(state["local_steps"])
        self._bytes_mark = self.state.bytes_sent

    def remove_hooks(self) -> None:
        """Back to DDP's default behaviour: the hook (DDP cannot unregister it) runs ``none``."""
        self.state.reconfigure("none")
        self.state.communicate = True
        self._handle.remove()
        for h in self._ready_handles:
            h.remove()
        self._ready_handles = []
