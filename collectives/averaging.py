"""Local SGD: periodic parameter averaging with a changeable period."""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch
import torch.distributed as dist

__all__ = ["PeriodicAverager", "average_optimizer_state"]


class PeriodicAverager:
    """Averages parameters across ranks once every ``period`` optimizer steps.

    Source: local SGD / periodic model averaging (Stich, ICLR 2019; Lin et al., ICLR 2020);
    same semantics as torch's ``PeriodicModelAverager`` except that the period may change
    between steps and there is no warm-up. Averaging is fp32-exact: parameters are copied
    into flat buffers, all-reduced (SUM), divided by the world size and copied back, so
    right after an averaging step parameters are bit-identical on every rank.

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
        groups: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
        for p in self.params:
            groups.setdefault((p.dtype, p.device), []).append(p)
        self._groups = list(groups.values())
        self._buffers: list[torch.Tensor] | None = None

    @property
    def period(self) -> int:
        """The averaging period ``H`` in optimizer steps."""
        return self._period

    @period.setter
    def period(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"period must be an integer >= 1 (optimizer steps), got {value!r}")
        self._period = value

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

    def state_dict(self) -> dict[str, int]:
        """Counters (plain ints)."""
        return {
            "period": self._period,
            "steps": self.steps,
            "steps_since_average": self.steps_since_average,
            "averagings": self.averagings,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore :meth:`state_dict` output."""
        self.period = int(state["period"])
        self.steps = int(state["steps"])
        self.steps_since_average = int(state["steps_since_average"])
        self.averagings = int(state["averagings"])


def _optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Per-parameter floating-point state tensors, in a rank-independent order."""
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key in sorted(state):
                t = state[key]
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() > 0:
                    out.append(t)
    return out


@torch.no_grad()
def average_optimizer_state(optimizer: torch.optim.Optimizer, group=None) -> tuple[int, float]:
    """Average an optimizer's per-parameter state across ranks (a collective).

    Local SGD leaves rank-local optimizer state apart (SGD momentum buffers, Adam's
    ``exp_avg`` / ``exp_avg_sq``): each rank accumulated its own gradients. Averaging
    parameters alone then does not make the replicas equal again, and a following
    synchronous period (``H = 1``) would keep them apart forever (every rank applies the
    same averaged gradient through a different momentum). Averaging the state as well
    restores identical replicas, as at the start of training. Scalars (``step``) are left
    alone: they are equal on every rank.

    Every rank must call it at the same point with optimizers over the same parameters.

    Args:
        optimizer: any ``torch.optim.Optimizer``; its floating-point state tensors with at
            least one dimension are averaged in place (fp32-exact sum, then divide).
        group: process group (default: the world).

    Returns:
        ``(bytes_sent, seconds)``; ``(0, 0.0)`` when the optimizer has no such state.
    """
    t0 = time.perf_counter()
    tensors = _optimizer_state_tensors(optimizer)
    if not tensors:
        return 0, 0.0
    world = dist.get_world_size(group)
    nbytes = 0
    by_kind: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        by_kind.setdefault((t.dtype, t.device), []).append(t)
    for ts in by_kind.values():
        flat = torch.cat([t.reshape(-1) for t in ts])
        dist.all_reduce(flat, group=group)
        flat.div_(world)
        off = 0
        for t in ts:
            t.copy_(flat[off : off + t.numel()].view_as(t))
            off += t.numel()
        nbytes += flat.numel() * flat.element_size()
    return nbytes, time.perf_counter() - t0
