"""Mixed precision with local SGD: one ``GradScaler`` decision for every rank."""

from __future__ import annotations

import torch
import torch.distributed as dist

from commgym.collectives.synchronizer import DEFAULT_TIMEOUT_S, comm_device, wait_work

__all__ = ["FOUND_INF_BYTES", "agree_found_inf"]

#: Bytes one :func:`agree_found_inf` hands to its all-reduce (one fp32 flag).
FOUND_INF_BYTES = 4


@torch.no_grad()
def agree_found_inf(
    scaler: torch.amp.GradScaler,
    optimizer: torch.optim.Optimizer,
    group: dist.ProcessGroup | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> bool:
    """Make ``scaler``'s inf/NaN verdict for this step the same on every rank (a collective).

    On a local-SGD step (``sync_period > 1``) every rank unscales its own gradient, so an
    overflow on one rank would make only that rank skip the step and halve its scale: the
    scales stay apart for good, and once the period returns to 1 every rank unscales the
    same synchronised gradient by a different scale, so the replicas drift at every step.
    This reduces the found-inf flag across ranks (MAX) before ``scaler.step``: every rank
    skips together and ``scaler.update()`` moves every rank's scale and growth tracker the
    same way. Source: the same reduction as torch's ``ShardedGradScaler`` (FSDP), where
    each rank also holds only part of the gradient.

    Call on every rank after the backward (and after ``scaler.unscale_(optimizer)`` if
    you unscale to clip), before ``scaler.step(optimizer)``. It unscales the gradients
    first (``scaler.unscale_``) when that was not done yet this step. A disabled scaler
    needs nothing: it returns False without communicating.

    Args:
        scaler: the ``torch.amp.GradScaler`` stepping ``optimizer``.
        optimizer: the optimizer ``scaler.step`` will be called with.
        group: process group (default: the world).
        timeout_s: collective timeout, seconds.

    Returns:
        Whether some rank found an inf/NaN (every rank then skips the step).

    Raises:
        CollectiveTimeout: a rank did not join within ``timeout_s``.
        TypeError: ``scaler`` is not a ``torch.amp.GradScaler``.
    """
    if not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
    if not scaler.is_enabled():
        return False
    from torch.amp.grad_scaler import OptState

    state = scaler._per_optimizer_states[id(optimizer)]
    if state["stage"] is OptState.READY:
        scaler.unscale_(optimizer)
    found = state["found_inf_per_device"]  # device -> fp32 scalar (1.0: inf/NaN seen)
    device = comm_device(group, next(iter(found.values()), torch.empty(0)))
    flag = torch.zeros(1, dtype=torch.float32, device=device)
    for f in found.values():
        flag.add_(f.to(device))
    wait_work(
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group, async_op=True),
        timeout_s,
        "GradScaler found-inf all-reduce",
    )
    any_inf = bool(flag.item() > 0)
    # scaler.step() skips when any entry is non-zero, scaler.update() backs off when their
    # sum is; writing the reduced flag into every entry gives both every rank's answer
    for f in found.values():
        f.fill_(1.0 if any_inf else 0.0)
    return any_inf
