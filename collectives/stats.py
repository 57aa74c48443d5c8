"""Measured per-step statistics of the communication path."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["AveragingStats", "StepStats"]


@dataclass(frozen=True)
class StepStats:
    """What one training step's gradient synchronisation measured on this rank.

    Every field is measured, none assumed. Times are seconds of wall clock on CPU, and of
    CUDA-event time on GPU.

    Attributes:
        step: 0-based count of ``synchronize()`` calls since the last (re)configuration.
        bytes_sent: bytes of the tensors this rank handed to collectives for this step
            (payload inputs of all-reduce/all-gather, the control word riding at the end
            of the last bucket's payload included, and the used-flag all-reduce on a
            step where ``none``/``fp16``/``bf16`` must ask; see
            ``GradientSynchronizer.control_bytes``); 0 on a local-SGD step.
            Instrumentation traffic (the reference all-reduce behind ``compression_error``)
            is not counted.
        compute_s: forward + backward time not spent compressing (from the model's first
            forward after the previous step to the start of ``synchronize()``).
        comm_wait_s: time ``synchronize()`` waited for collectives to finish.
        compress_s: time spent in compress/decompress (in hooks and in ``synchronize``).
        bucket_bytes: actual size of each bucket in bytes (bucket order).
        compression_error: ``||g - g_hat|| / ||g||`` on the aggregated (mean) gradient,
            where ``g`` is the exact mean, read on the synchronizer's ``error_sample``
            coordinates per bucket (a fixed uniform sample; all of them for smaller
            buckets or ``error_sample=0``); 0.0 for lossless paths; ``None`` when not
            measured this step (see ``error_every``) or when ``||g|| == 0``.
        grad_norm: L2 norm of the aggregated gradient written into ``.grad`` (of the
            local gradient on a local-SGD step); ``None`` when not measured this step
            (see the synchronizer's ``grad_norm_every``).
        nonfinite: True on *every* rank if any rank's gradient held NaN/inf; ``None``
            when not known this step: a compressor that lets non-finite values reach
            every rank (``none``, ``fp16``, ``bf16``) on a step that did not measure
            ``grad_norm``.
        synchronized: False on local-SGD steps (gradients stayed local).
        collectives: number of collective calls issued this step.
        instrumentation_s: host time ``synchronize()`` spent after the measured region
            (resolving timings, gradient norm, the reference all-reduce of the sampled
            coordinates for ``compression_error``). Not part of the training step:
            subtract it from a wall-clock measurement around ``synchronize()`` to get the
            step's own time.
    """

    step: int
    bytes_sent: int
    compute_s: float
    comm_wait_s: float
    compress_s: float
    bucket_bytes: tuple[int, ...]
    compression_error: float | None
    grad_norm: float | None
    nonfinite: bool | None
    synchronized: bool = True
    collectives: int = 0
    instrumentation_s: float = 0.0

    @property
    def step_time_s(self) -> float:
        """``compute_s + compress_s + comm_wait_s``: the step's critical path."""
        return self.compute_s + self.compress_s + self.comm_wait_s

    def to_dict(self) -> dict[str, object]:
        """Plain-value dict (for control-plane messages and logs)."""
        d = asdict(self)
        d["bucket_bytes"] = list(self.bucket_bytes)
        return d


@dataclass(frozen=True)
class AveragingStats:
    """Result of ``GradientSynchronizer.after_optimizer_step()``.

    Attributes:
        averaged: whether parameters were averaged across ranks at this step.
        bytes_sent: bytes handed to collectives for the averaging (0 if none).
        comm_s: time spent averaging (seconds).
        optimizer_steps: optimizer steps counted since the last (re)configuration.
    """

    averaged: bool
    bytes_sent: int
    comm_s: float
    optimizer_steps: int
