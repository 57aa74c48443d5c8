"""What one decision measured: the typed record, its recorder, the cross-rank aggregate.

Every producer of decisions speaks this contract: the env's worker ranks
(:mod:`commgym.env.worker`), the in-training replay
(:class:`~commgym.agents.scheduler.CommScheduler`) and the learned surrogate
(:class:`~commgym.env.surrogate.SurrogateEnv`). Each rank fills a
:class:`RankMeasurement` with a :class:`DecisionRecorder` inside its timed loop; the
records of all ranks become one :class:`DecisionMeasurement`
(:meth:`DecisionMeasurement.from_ranks`), which the observation builder
(:class:`~commgym.env.spaces.ObservationBuilder`) reads by field name and which travels
in ``info["measured"]`` (as :meth:`DecisionMeasurement.to_dict`) to the transition
recorder, callbacks and logs; they read it back typed with :func:`measurement_from_info`.
A new measured quantity is one new field here.

Units: times in seconds of wall clock, bytes as counted by the synchronizer (payloads
handed to collectives by one rank), losses in nats.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch
    import torch.distributed as dist

__all__ = [
    "DECISION_FIELDS",
    "RANK_FIELDS",
    "DecisionMeasurement",
    "DecisionRecorder",
    "RankMeasurement",
    "LinkProbe",
    "combine_eval",
    "decision_info",
    "effective_bandwidth_gbps",
    "measurement_from_info",
]


@dataclass
class RankMeasurement:
    """One rank's measurements of one decision (``steps`` training iterations).

    Attributes:
        train_time_s: wall time of the iterations plus the decision's consensus averaging
            and reconfiguration (training time a real job would pay).
        step_time_s: median wall time of one iteration.
        steps: iterations run.
        compute_s: mean forward+backward time per iteration (``StepStats.compute_s``).
        comm_wait_s: mean time per iteration waiting on collectives after backward.
        compress_s: mean time per iteration spent compressing and decompressing.
        comm_s: total time waiting on communication (iterations plus consensus).
        bytes_per_step: ``bytes_total / steps``.
        bytes_total: bytes this rank handed to collectives (gradients, averaging,
            consensus).
        train_loss: mean training loss over the iterations (nats; NaN when not given).
        eval_loss: held-out loss on this rank's share (nats).
        eval_acc: held-out accuracy on this rank's share (NaN when not measured).
        eval_n: held-out samples this rank evaluated.
        eval_s: wall time of the evaluation (not training time).
        grad_norm: L2 norm of the aggregated gradient at the last iteration that measured
            it (the window's last, which asks for it; NaN when none did).
        compression_error: ``||g - g_hat|| / ||g||`` at the last iteration (None when not
            measured).
        nonfinite: a gradient, loss or held-out loss was NaN/inf.
        samples: training samples this rank consumed.
        bucket_bytes: per-bucket bytes of the last iteration (identical on every rank).
        probe_s: wall time of this rank's probe all-reduce at the decision's end (0 when
            the decision ran none; part of ``train_time_s``).
        probe_bytes: size of that probe buffer, B (0: no probe).
    """

    train_time_s: float
    step_time_s: float
    steps: int
    compute_s: float
    comm_wait_s: float
    compress_s: float
    comm_s: float
    bytes_per_step: float
    bytes_total: float
    train_loss: float
    eval_loss: float
    eval_acc: float
    eval_n: int
    eval_s: float
    grad_norm: float
    compression_error: float | None
    nonfinite: bool
    samples: int
    bucket_bytes: list[int] = field(default_factory=list)
    probe_s: float = 0.0
    probe_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python copy (picklable, JSON-able)."""
        # a shallow copy with its one list copied: what asdict() gives, at a tenth of its
        # cost (every rank builds one per decision)
        d = self.__dict__.copy()
        d["bucket_bytes"] = list(self.bucket_bytes)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RankMeasurement:
        """Reads the fields by name from ``d`` (other keys are ignored)."""
        return cls(**{k: d[k] for k in RANK_FIELDS if k in d})

    def to_row(self) -> list[float]:
        """The scalar fields (all but ``bucket_bytes``) as floats, ``None`` as NaN."""
        return [math.nan if v is None else float(v) for v in (getattr(self, k) for k in _SCALARS)]

    @classmethod
    def from_row(cls, row: Sequence[float], bucket_bytes: Sequence[int]) -> RankMeasurement:
        """Inverse of :meth:`to_row` (NaN counts become 0, a NaN error becomes None)."""
        d: dict[str, Any] = {}
        for k, v in zip(_SCALARS, row, strict=True):
            if k in _INTS:
                d[k] = int(v) if math.isfinite(v) else 0
            elif k == "nonfinite":
                d[k] = bool(v) if math.isfinite(v) else False
            elif k == "compression_error":
                d[k] = None if math.isnan(v) else float(v)
            else:
                d[k] = float(v)
        return cls(**d, bucket_bytes=list(bucket_bytes))


#: Field names of :class:`RankMeasurement`, in order.
RANK_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RankMeasurement))
_SCALARS = tuple(k for k in RANK_FIELDS if k != "bucket_bytes")
_INTS = frozenset({"steps", "eval_n", "samples", "probe_bytes"})


class DecisionRecorder:
    """Fills one rank's :class:`RankMeasurement` from inside its timed training loop.

    Call :meth:`record_step` once per iteration with the iteration's wall time (training
    time only: commgym's own instrumentation excluded), its loss and the synchronizer's
    statistics, then :meth:`finish` at the decision boundary. Losses are kept as tensors
    (no device sync inside the loop) and reduced once in :meth:`finish`.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Starts a new decision window."""
        self.walls: list[float] = []
        self.losses: list[Any] = []
        self.stats: list[Any] = []
        self.extra_bytes = 0

    def __len__(self) -> int:
        return len(self.walls)

    def record_step(self, wall_s: float, loss: Any, stats: Any, extra_bytes: int = 0) -> None:
        """Adds one iteration.

        Args:
            wall_s: the iteration's training wall time, seconds.
            loss: its training loss (a detached tensor or a float), or None.
            stats: its :class:`~commgym.collectives.StepStats`.
            extra_bytes: bytes sent outside the gradient synchronization (e.g. local-SGD
                averaging after the optimizer step).
        """
        self.walls.append(wall_s)
        if loss is not None:
            self.losses.append(loss)
        self.stats.append(stats)
        self.extra_bytes += int(extra_bytes)

    def train_loss(self) -> float:
        """Mean recorded training loss (NaN when none was recorded)."""
        if not self.losses:
            return math.nan
        import torch

        return float(torch.stack([torch.as_tensor(x).float() for x in self.losses]).mean())

    def finish(
        self,
        *,
        overhead_s: float,
        consensus_comm_s: float,
        consensus_bytes: int,
        eval_loss: float,
        eval_acc: float,
        eval_n: int,
        eval_s: float,
        samples: int,
        train_loss: float | None = None,
        check_eval: bool = True,
        probe_s: float = 0.0,
        probe_bytes: int = 0,
    ) -> RankMeasurement:
        """The window's record.

        Args:
            overhead_s: training time outside the iterations (consensus averaging,
                reconfiguration), added to ``train_time_s``.
            consensus_comm_s: communication time of the decision's consensus averaging.
            consensus_bytes: bytes of that averaging.
            eval_loss: held-out loss (nats) on this rank's share.
            eval_acc: held-out accuracy (NaN when not measured).
            eval_n: held-out samples evaluated.
            eval_s: wall time of the evaluation.
            samples: training samples consumed in the window.
            train_loss: the window's training loss when already reduced
                (default: :meth:`train_loss`).
            check_eval: a non-finite ``eval_loss`` marks the record ``nonfinite``.
            probe_s: the decision's probe all-reduce time (already in ``overhead_s``).
            probe_bytes: the probe's buffer size, B.
        """
        stats, walls = self.stats, self.walls
        steps = len(walls)
        if train_loss is None:
            train_loss = self.train_loss()
        nonfinite = (
            any(s.nonfinite for s in stats)
            or (bool(self.losses) and not math.isfinite(train_loss))
            or (check_eval and not math.isfinite(eval_loss))
        )
        last = stats[-1] if stats else None
        total_bytes = sum(s.bytes_sent for s in stats) + self.extra_bytes + consensus_bytes
        return RankMeasurement(
            train_time_s=sum(walls) + overhead_s,
            step_time_s=statistics.median(walls) if walls else 0.0,
            steps=steps,
            compute_s=_mean([s.compute_s for s in stats]),
            comm_wait_s=_mean([s.comm_wait_s for s in stats]),
            compress_s=_mean([s.compress_s for s in stats]),
            comm_s=sum(s.comm_wait_s for s in stats) + consensus_comm_s,
            bytes_per_step=total_bytes / max(steps, 1),
            bytes_total=total_bytes,
            train_loss=train_loss,
            eval_loss=eval_loss,
            eval_acc=eval_acc,
            eval_n=eval_n,
            eval_s=eval_s,
            grad_norm=_last_norm(stats),
            compression_error=last.compression_error if last else None,
            nonfinite=nonfinite,
            samples=samples,
            bucket_bytes=list(last.bucket_bytes) if last else [],
            probe_s=probe_s,
            probe_bytes=probe_bytes,
        )


def effective_bandwidth_gbps(bytes_total: float, comm_s: float) -> float:
    """Effective bandwidth of one decision, Gbit/s: ``bytes_total * 8 / comm_s / 1e9``.

    The rate at which communication *appears* to run from the training step's point of
    view: bytes handed to collectives per second the ranks were blocked on them
    (``comm_s``: comm-wait after backward summed over the decision's iterations, plus the
    consensus average). It is what decides whether compressing pays, and it is **not**
    the link rate: transfer time hidden behind backward and, on an emulated link, bytes
    that pass in the token bucket's burst while the bucket refilled during compute do
    not count as waiting, so it can exceed the configured rate (on a busy machine more
    so, as slower compute refills the bucket further). It is never below
    ``bytes_total * 8 / train_time_s``, the decision's own average throughput. The link
    rate is ``info["network"]``.

    Args:
        bytes_total: bytes handed to collectives in the decision (one rank).
        comm_s: seconds blocked on communication in the decision (mean over ranks).

    Returns:
        Gbit/s; 0.0 when nothing was waited on (``comm_s <= 0``).
    """
    return float(bytes_total) * 8 / float(comm_s) / 1e9 if comm_s > 0 else 0.0


def _last_norm(stats: list[Any]) -> float:
    """The gradient norm (``StepStats.grad_norm``) of the window's last step measuring one.

    NaN when none did.
    """
    for s in reversed(stats):
        if s.grad_norm is not None:
            return float(s.grad_norm)
    return math.nan


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _get(r: Any, key: str) -> Any:
    return r[key] if isinstance(r, Mapping) else getattr(r, key)


def combine_eval(per_rank: Sequence[Any]) -> tuple[float, float]:
    """Held-out loss and accuracy over all ranks' shares, weighted by ``eval_n``.

    Args:
        per_rank: one record per rank (:class:`RankMeasurement` or a mapping) with
            ``eval_loss``, ``eval_acc`` and ``eval_n``.

    Returns:
        ``(loss, accuracy)``; ``(nan, nan)`` when no rank evaluated any sample.
    """
    n = sum(int(_get(r, "eval_n")) for r in per_rank)
    if n == 0:
        return float("nan"), float("nan")
    loss = sum(float(_get(r, "eval_loss")) * int(_get(r, "eval_n")) for r in per_rank) / n
    acc = sum(float(_get(r, "eval_acc")) * int(_get(r, "eval_n")) for r in per_rank) / n
    return loss, acc


@dataclass
class DecisionMeasurement:
    """What one decision measured, over all ranks (the observation's and reward's input).

    Times of the slowest rank, means of per-rank timings and training losses, rank 0's
    byte counts and gradient statistics (identical on every rank after synchronisation),
    held-out loss and accuracy weighted by each rank's evaluated samples. Units as in
    :class:`RankMeasurement`; ``iter_mean_s`` is the slowest rank's mean iteration time
    (``train_time_s / steps``) and ``samples`` the sum over ranks. ``probe_s`` is the
    *fastest* rank's probe time: the rank that arrived last waited for nobody, so its time
    is the transfer's alone (no barrier needed, none paid).
    """

    train_time_s: float
    step_time_s: float
    iter_mean_s: float
    compute_s: float
    comm_wait_s: float
    compress_s: float
    comm_s: float
    bytes_per_step: float
    bytes_total: float
    train_loss: float
    eval_loss: float
    eval_acc: float
    eval_s: float
    grad_norm: float
    compression_error: float | None
    nonfinite: bool
    samples: int
    steps: int
    bucket_bytes: list[int] = field(default_factory=list)
    probe_s: float = 0.0
    probe_bytes: int = 0

    @classmethod
    def from_ranks(cls, per_rank: Sequence[RankMeasurement | Mapping[str, Any]]):
        """Combines the per-rank records of one decision (rank order).

        Raises:
            ValueError: ``per_rank`` is empty.
        """
        if not per_rank:
            raise ValueError("DecisionMeasurement.from_ranks needs at least one rank's record")
        ranks = [
            r if isinstance(r, RankMeasurement) else RankMeasurement.from_dict(r) for r in per_rank
        ]
        r0, n = ranks[0], len(ranks)
        eval_loss, eval_acc = combine_eval(ranks)
        err = r0.compression_error
        return cls(
            train_time_s=max(float(r.train_time_s) for r in ranks),
            step_time_s=max(float(r.step_time_s) for r in ranks),
            iter_mean_s=max(float(r.train_time_s) / max(int(r.steps), 1) for r in ranks),
            compute_s=sum(float(r.compute_s) for r in ranks) / n,
            comm_wait_s=sum(float(r.comm_wait_s) for r in ranks) / n,
            compress_s=sum(float(r.compress_s) for r in ranks) / n,
            comm_s=sum(float(r.comm_s) for r in ranks) / n,
            bytes_per_step=float(r0.bytes_per_step),
            bytes_total=float(r0.bytes_total),
            train_loss=sum(float(r.train_loss) for r in ranks) / n,
            eval_loss=eval_loss,
            eval_acc=eval_acc,
            eval_s=max(float(r.eval_s) for r in ranks),
            grad_norm=float(r0.grad_norm),
            compression_error=None if err is None else float(err),
            nonfinite=any(bool(r.nonfinite) for r in ranks),
            samples=sum(int(r.samples) for r in ranks),
            steps=int(r0.steps),
            bucket_bytes=list(r0.bucket_bytes),
            probe_s=min(float(r.probe_s) for r in ranks),
            probe_bytes=int(r0.probe_bytes),
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DecisionMeasurement:
        """Reads the fields by name from ``d`` (other keys are ignored)."""
        return cls(**{k: d[k] for k in DECISION_FIELDS if k in d})

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python copy: what ``info["measured"]`` holds."""
        d = self.__dict__.copy()
        d["bucket_bytes"] = list(self.bucket_bytes)
        return d


#: Field names of :class:`DecisionMeasurement`, in order (the transition recorder's
#: measured columns are these, less ``bucket_bytes``).
DECISION_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(DecisionMeasurement))


def decision_info(
    *,
    config: str,
    action: dict[str, Any],
    measured: Mapping[str, Any],
    reason: str | None,
    train_time_s: float,
    elapsed_frac: float,
    decision: int,
    diverged: bool,
) -> dict[str, Any]:
    """The ``info`` of a decision step, as both environments return it.

    Args:
        config: the applied configuration as a string (``CommConfig.__str__``).
        action: the applied configuration as a dict (``CommConfig.to_dict``).
        measured: :meth:`DecisionMeasurement.to_dict` (plus env-specific timings).
        reason: why the episode ended (``None`` while it goes on).
        train_time_s: training time so far in the episode.
        elapsed_frac: ``train_time_s / time_budget_s`` capped at 1.
        decision: decisions so far in the episode (1 for the first).
        diverged: the decision produced non-finite values.
    """
    return {
        "config": config,
        "action": action,
        "measured": measured,
        "reason": reason,
        "train_time_s": train_time_s,
        "elapsed_frac": elapsed_frac,
        "decision": decision,
        "diverged": diverged,
    }


def measurement_from_info(info: Mapping[str, Any]) -> DecisionMeasurement | None:
    """The typed record of a decision step's ``info`` (the one reader of ``info["measured"]``).

    Args:
        info: the ``info`` of ``env.step`` (:func:`decision_info`'s shape).

    Returns:
        ``DecisionMeasurement.from_dict(info["measured"])``; ``None`` when the step
        measured nothing (a failed rank: ``info`` has no ``"measured"``).
    """
    measured = info.get("measured")
    return None if measured is None else DecisionMeasurement.from_dict(measured)


class LinkProbe:
    """A fixed-size fp32 all-reduce timed at a decision's end (``probe_bytes``).

    A fixed-size collective measures the link independently of the configuration the
    decision ran (whose own bytes and waits depend on that configuration). It runs right
    after the decision's last collective, when an emulated link's token bucket is mostly
    drained, so it sees the link's rate rather than its burst. No barrier: the caller
    takes the fastest rank's time (that rank waited for nobody; see
    :class:`DecisionMeasurement`). The env's worker and
    :class:`~commgym.agents.scheduler.CommScheduler` both use it, so a policy trained
    with a probe sees the same figure in replay.

    Args:
        device: where the buffer lives (CPU for gloo, the rank's GPU for NCCL).
        group: the process group (default: the world).
    """

    def __init__(self, device: torch.device, group: dist.ProcessGroup | None = None) -> None:
        self.device = device
        self.group = group
        self._buf: torch.Tensor | None = None

    def __call__(self, nbytes: int) -> float:
        """All-reduce ``nbytes`` (fp32, rounded down to whole floats, at least one).

        Every rank of the group must call it with the same ``nbytes``.

        Returns:
            This rank's wall time of the all-reduce, s (0.0 when ``nbytes <= 0``: no probe).
        """
        import torch
        import torch.distributed as dist

        if nbytes <= 0:
            return 0.0
        n = max(1, nbytes // 4)
        if self._buf is None or self._buf.numel() != n:
            self._buf = torch.zeros(n, dtype=torch.float32, device=self.device)
        t0 = time.perf_counter()
        dist.all_reduce(self._buf, group=self.group)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0
