"""Local SGD: periodic parameter averaging with a changeable period and compression."""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from commgym.collectives.bucketing import BucketPlan
from commgym.collectives.checks import check_int
from commgym.collectives.compressors import BucketLayout, Compressor
from commgym.collectives.exchange import decode, issue
from commgym.collectives.residual import ResidualMemory

__all__ = ["PeriodicAverager", "average_optimizer_state"]

#: Prefix of the bucket keys of compressed model deltas (residuals, PowerSGD warm starts),
#: kept apart from the gradient buckets' keys.
DELTA_KEY_PREFIX = "avg/"


class PeriodicAverager:
    """Averages parameters across ranks once every ``period`` optimizer steps.

    Source: local SGD / periodic model averaging (Stich, ICLR 2019; Lin et al., ICLR 2020);
    same semantics as torch's ``PeriodicModelAverager`` except that the period may change
    between steps and there is no warm-up.

    Two ways to average, chosen with :meth:`set_compression`:

    * exact (no compressor, or ``none``): parameters are copied into one flat buffer per
      dtype and device, all-reduced (SUM), divided by the world size and copied back;
    * compressed (Qsparse-local-SGD, Basu et al., NeurIPS 2019; the compressed outer
      gradient of DiLoCo, Douillard et al. 2023): every rank keeps an *anchor*, the
      parameters after the last average (identical on all ranks). At an average each rank
      compresses its change since then, bucket by bucket (buckets of ``bucket_bytes`` as
      for gradients), with error feedback per bucket,
      ``c_r = C(e_r + (x_r - anchor) / W)``, ``e_r <- e_r + (x_r - anchor) / W - c_r``;
      the payloads are all-reduced or all-gathered as the compressor's ``summable`` says,
      decoded into the mean change ``d = sum_r c_r`` and every rank sets
      ``x = anchor = anchor + d``.

    Either way every rank applies the same bits, so right after an average the
    parameters are bit-identical on every rank.

    Args:
        params: parameters to average (``requires_grad`` ones only are kept).
        period: averaging period ``H`` (int >= 1); ``1`` averages after every step.
        group: process group (default: the world).

    Raises:
        ValueError: ``period`` is not an integer >= 1.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], period: int = 1, group=None) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.period = period  # validated by the setter
        self.steps = 0
        self.steps_since_average = 0
        self.averagings = 0
        #: the job's optimizer steps (:meth:`optimizer_step`), what a synchronizer reports
        self.optimizer_steps = 0
        #: local-SGD steps since the optimizer state was last averaged (the owner of the
        #: optimizer averages it and sets this back to 0)
        self.local_steps = 0
        groups: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
        for p in self.params:
            groups.setdefault((p.dtype, p.device), []).append(p)
        self._groups = list(groups.values())
        self._buffers: list[torch.Tensor] | None = None
        self._delta: _DeltaAveraging | None = None

    def set_compression(
        self,
        compressor: Compressor | None,
        *,
        bucket_bytes: float = 25 * 2**20,
        residuals: ResidualMemory | None = None,
        error_feedback: bool = True,
    ) -> None:
        """Choose how the following averages are computed; call on every rank together.

        With a lossy ``compressor`` the current parameters become the anchor, so they
        must be identical on every rank at this call (as after an average, or at the
        start of training). ``None`` or ``none`` selects the exact average.

        Args:
            compressor: the compressor for parameter changes, or ``None``.
            bucket_bytes: bucket size of the compressed changes in bytes.
            residuals: error-feedback memory (keys ``"avg/..."``); a private one if None.
            error_feedback: keep residuals for compressors that use them.
        """
        if compressor is None or compressor.spec.lossless:
            self._delta = None
            return
        self._delta = _DeltaAveraging(
            self.params,
            compressor,
            bucket_bytes,
            residuals if residuals is not None else ResidualMemory(),
            error_feedback,
            self.group,
        )

    @property
    def compressed(self) -> bool:
        """Whether averages send compressed parameter changes (else exact fp32)."""
        return self._delta is not None

    @property
    def period(self) -> int:
        """The averaging period ``H`` in optimizer steps."""
        return self._period

    @period.setter
    def period(self, value: int) -> None:
        self._period = check_int("period", value, 1, note=" (optimizer steps)")

    @property
    def params_apart(self) -> bool:
        """Whether local steps since the last average left the parameters apart (``period > 1``)."""
        return self._period > 1 and self.steps_since_average > 0

    def optimizer_step(self) -> tuple[bool, int, float]:
        """Count one optimizer step of a synchronizer's job: local SGD's one counting.

        At ``period == 1`` the gradients were averaged, so nothing is averaged here; above
        it the step is a local step (:attr:`local_steps`) and parameters are averaged
        every ``period`` (:meth:`step`). Both synchronizers (``GradientSynchronizer`` and
        the DDP hook's) count their steps here.

        Returns:
            ``(averaged, bytes_sent, seconds)``.
        """
        self.optimizer_steps += 1
        if self._period == 1:
            return False, 0, 0.0
        self.local_steps += 1
        return self.step()

    def step(self) -> tuple[bool, int, float]:
        """Count one optimizer step; average when ``period`` steps have passed.

        Call exactly once per optimizer step (not per parameter group), on every rank.

        Returns:
            ``(averaged, bytes_sent, seconds)``.
        """
        self.steps += 1
        self.steps_since_average += 1
        if self.steps_since_average >= self._period:
            nbytes, secs = self.average()
            return True, nbytes, secs
        return False, 0, 0.0

    @torch.no_grad()
    def average(self) -> tuple[int, float]:
        """Average parameters across ranks now (a collective: call on every rank).

        Returns:
            ``(bytes_sent, seconds)``.
        """
        t0 = time.perf_counter()
        if self._delta is not None:
            nbytes = self._delta.average()
            self.steps_since_average = 0
            self.averagings += 1
            return nbytes, time.perf_counter() - t0
        world = dist.get_world_size(self.group)
        if self._buffers is None:
            self._buffers = [
                torch.empty(sum(p.numel() for p in ps), dtype=ps[0].dtype, device=ps[0].device)
                for ps in self._groups
            ]
        nbytes = 0
        works = []
        for ps, buf in zip(self._groups, self._buffers, strict=True):
            off = 0
            for p in ps:
                buf[off : off + p.numel()].view_as(p).copy_(p)
                off += p.numel()
            works.append(dist.all_reduce(buf, group=self.group, async_op=True))
            nbytes += buf.numel() * buf.element_size()
        for ps, buf, work in zip(self._groups, self._buffers, works, strict=True):
            work.wait()
            buf.div_(world)
            off = 0
            for p in ps:
                p.copy_(buf[off : off + p.numel()].view_as(p))
                off += p.numel()
        self.steps_since_average = 0
        self.averagings += 1
        return nbytes, time.perf_counter() - t0

    def state_dict(self) -> dict[str, Any]:
        """Counters (plain ints) and, when compressed, the anchor (CPU tensors)."""
        state: dict[str, Any] = {
            "period": self._period,
            "steps": self.steps,
            "steps_since_average": self.steps_since_average,
            "averagings": self.averagings,
        }
        if self._delta is not None:
            state["anchor"] = [a.detach().cpu().clone() for a in self._delta.anchor]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (after :meth:`set_compression`).

        Raises:
            ValueError: the saved anchor does not fit the current compressed buckets.
        """
        self.period = int(state["period"])
        self.steps = int(state["steps"])
        self.steps_since_average = int(state["steps_since_average"])
        self.averagings = int(state["averagings"])
        anchor = state.get("anchor")
        if self._delta is not None and anchor is not None:
            self._delta.load_anchor(anchor)


class _DeltaAveraging:
    """Compressed parameter averaging state: buckets, anchor, error feedback."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        compressor: Compressor,
        bucket_bytes: float,
        residuals: ResidualMemory,
        error_feedback: bool,
        group: dist.ProcessGroup | None,
    ) -> None:
        for p in params:
            if p.dtype != torch.float32:
                raise ValueError(
                    f"compressed averaging ({compressor.spec}) needs fp32 parameters, got "
                    f"{p.dtype}; use compression 'none' for other dtypes"
                )
        self.params = params
        self.compressor = compressor
        self.residuals = residuals
        self.error_feedback = error_feedback and compressor.uses_error_feedback
        self.group = group
        self.world_size = dist.get_world_size(group)
        # The plan's flat buffers hold the (divided) changes; its views are never grads.
        self.plan = BucketPlan(params, bucket_bytes)
        self.layouts = [
            BucketLayout(DELTA_KEY_PREFIX + lay.key, lay.shapes) for lay in self.plan.layouts
        ]
        self._gather: dict[Any, torch.Tensor] = {}
        with torch.no_grad():
            for p, view in zip(self.plan.params, self.plan.views, strict=True):
                view.copy_(p)
        self.anchor = [buf.clone() for buf in self.plan.buffers]
        # per parameter, the anchor's view with the same layout as the plan's view
        self.anchor_views = [
            self.anchor[b].as_strided(
                view.shape,
                view.stride(),
                view.storage_offset() - self.plan.buffers[b].storage_offset(),
            )
            for b, view in zip(self.plan.bucket_of, self.plan.views, strict=True)
        ]

    def load_anchor(self, anchor: list[torch.Tensor]) -> None:
        if len(anchor) != len(self.anchor) or any(
            a.numel() != b.numel() for a, b in zip(anchor, self.anchor, strict=True)
        ):
            raise ValueError(
                f"saved anchor has buckets of {[a.numel() for a in anchor]} elements, the "
                f"current compressed buckets hold {[b.numel() for b in self.anchor]}"
            )
        for dst, src in zip(self.anchor, anchor, strict=True):
            dst.copy_(src)

    def average(self) -> int:
        comp, plan, world = self.compressor, self.plan, self.world_size
        nbytes = 0
        inflight: list[tuple[list[Any], list[torch.Tensor], Any]] = []
        for p, view in zip(plan.params, plan.views, strict=True):
            view.copy_(p)
        for b, (flat, layout) in enumerate(zip(plan.buffers, self.layouts, strict=True)):
            flat.sub_(self.anchor[b]).div_(world)
            residual = None
            if self.error_feedback and flat.numel():
                residual = self.residuals.get(layout.key, flat)
            payload, ctx = comp.compress(flat, layout, residual)
            works, gathered, sent, _ = issue(
                comp, payload, group=self.group, world_size=world,
                gather_buffers=self._gather, key=(b, 0),
            )  # fmt: skip
            nbytes += sent
            inflight.append((works, gathered, ctx))
        for rnd in range(comp.rounds):
            for b, (works, gathered, ctx) in enumerate(inflight):
                for w in works:
                    w.wait()
                if rnd + 1 < comp.rounds:
                    payload = comp.advance(rnd + 1, gathered, ctx)
                    next_works, next_gathered, sent, _ = issue(
                        comp, payload, group=self.group, world_size=world,
                        gather_buffers=self._gather, key=(b, rnd + 1),
                    )  # fmt: skip
                    nbytes += sent
                    inflight[b] = (next_works, next_gathered, ctx)
                else:
                    decode(comp, gathered, ctx, plan.buffers[b], world)
        for anchor, change in zip(self.anchor, plan.buffers, strict=True):
            anchor.add_(change)
        for p, view in zip(plan.params, self.anchor_views, strict=True):
            p.copy_(view)
        return nbytes


def _float_state(optimizer: torch.optim.Optimizer) -> list[dict[str, torch.Tensor]]:
    """Per parameter (in param-group order), its floating-point state tensors by key."""
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            out.append(
                {
                    k: v
                    for k, v in sorted(state.items())
                    if isinstance(v, torch.Tensor) and v.is_floating_point()
                }
            )
    return out


def _layout(states: list[dict[str, torch.Tensor]]) -> list[list[tuple[str, tuple, str, str]]]:
    """Per parameter: ``(key, shape, dtype, device)`` of each state tensor."""
    return [
        [
            (k, tuple(v.shape), str(v.dtype).removeprefix("torch."), str(v.device))
            for k, v in s.items()
        ]
        for s in states
    ]


@torch.no_grad()
def average_optimizer_state(optimizer: torch.optim.Optimizer, group=None) -> tuple[int, float]:
    """Average an optimizer's per-parameter state across ranks (a collective).

    Local SGD leaves rank-local optimizer state apart (SGD momentum buffers, Adam's
    ``exp_avg`` / ``exp_avg_sq`` and per-parameter ``step``): each rank accumulated its
    own gradients. Averaging parameters alone then does not make the replicas equal
    again, and a following synchronous period (``H = 1``) would keep them apart forever
    (every rank applies the same averaged gradient through a different momentum).
    Averaging the state as well restores identical replicas, as at the start of training.

    Every floating-point state tensor is averaged, scalars included (Adam's ``step``
    differs between ranks when a parameter got no gradient on some ranks during local
    steps). A rank may even lack a parameter's state altogether (it never had a gradient
    there, so the optimizer skipped it): such a state is averaged over the ranks that
    hold it and created on the others, so every rank ends with the same keys and values.
    One small all-reduce of per-parameter checksums finds out whether the layouts agree;
    only when they do not are the layouts exchanged (``all_gather_object``). Non-tensor
    state is left alone.

    Every rank must call it at the same point with optimizers over the same parameters.

    Args:
        optimizer: any ``torch.optim.Optimizer``; its floating-point state tensors are
            averaged in place (fp32-exact sum, then divide).
        group: process group (default: the world).

    Returns:
        ``(bytes_sent, seconds)``; ``(0, 0.0)`` when the optimizer has no parameters.
    """
    t0 = time.perf_counter()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if not params:
        return 0, 0.0
    states = _float_state(optimizer)
    world = dist.get_world_size(group)
    nccl = dist.get_backend(group) == "nccl"
    ctl = params[0].device if nccl else torch.device("cpu")
    layout = _layout(states)
    # [checksum per parameter, -checksum per parameter] reduced with MAX: max and -min
    sums = torch.tensor([zlib.crc32(repr(lay).encode()) for lay in layout], dtype=torch.int64)
    check = torch.cat([sums, -sums]).to(ctl)
    dist.all_reduce(check, op=dist.ReduceOp.MAX, group=group)
    nbytes = check.numel() * check.element_size()
    n = len(params)
    if torch.equal(check[:n], -check[n:]):  # the same layout on every rank (the usual case)
        union, counts = layout, None
    else:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, layout, group=group)
        union = [sorted({e for g in gathered for e in g[i]}) for i in range(n)]
        counts = [[sum(e in g[i] for g in gathered) for e in union[i]] for i in range(n)]
    entries: list[tuple[int, str, torch.Tensor | None, tuple, torch.dtype, torch.device]] = []
    for i, lay in enumerate(union):
        for key, shape, dtype, device in lay:
            have = states[i].get(key)
            ok = have is not None and tuple(have.shape) == shape
            entries.append(
                (i, key, have if ok else None, shape, getattr(torch, dtype), torch.device(device))
            )
    by_kind: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for j, (_, _, _, _, dtype, device) in enumerate(entries):
        by_kind.setdefault((dtype, device), []).append(j)
    flat_counts = None
    if counts is not None:
        flat_counts = [c for per in counts for c in per]
    for (dtype, device), js in by_kind.items():
        comm = ctl if nccl else device  # NCCL cannot reduce CPU tensors (Adam's step)
        flat = torch.cat(
            [
                t.reshape(-1).to(comm)
                if t is not None
                else torch.zeros(math.prod(shape), dtype=dtype, device=comm)
                for _, _, t, shape, _, _ in (entries[j] for j in js)
            ]
        )
        dist.all_reduce(flat, group=group)
        nbytes += flat.numel() * flat.element_size()
        off = 0
        for j in js:
            i, key, t, shape, _, _ = entries[j]
            numel = math.prod(shape)
            chunk = flat[off : off + numel]
            off += numel
            div = world if flat_counts is None else flat_counts[j]
            value = chunk.div(div).view(shape).to(device)
            if t is not None:
                t.copy_(value)
            else:  # this rank never stepped the parameter: take the others' state
                optimizer.state[params[i]][key] = value.clone()
    return nbytes, time.perf_counter() - t0
