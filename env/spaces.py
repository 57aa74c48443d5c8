"""Action menu, observation layout and rewards shared by every commgym environment.

The real environment (:class:`~commgym.env.AllReduceEnv`), the surrogate
(:class:`~commgym.env.surrogate.SurrogateEnv`) and the in-training policy replay
(:class:`~commgym.agents.scheduler.CommScheduler`) build actions, observations and rewards
with this module only, so an observation means the same thing wherever a policy meets it.
The observation is built from what a decision measured (:mod:`commgym.env.measure`, read
by field name), never from the other way round.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from commgym.collectives import CommConfig, CompressionSpec
from commgym.env.measure import DecisionMeasurement, effective_bandwidth_gbps

__all__ = [
    "OBSERVATION_FIELDS",
    "REWARDS",
    "ActionMenu",
    "ObservationBuilder",
    "ObservationField",
    "UNSHAPED_GBPS",
    "RewardContext",
    "decision_outcome",
    "probe_gbps",
    "reset_probe_option",
]


@dataclass(frozen=True)
class ActionMenu:
    """The discrete choices an agent has; an action is one index per list (zero-based).

    Attributes:
        compression: compression specs (validated with ``CompressionSpec.parse``).
        bucket_mb: bucket sizes in MiB (> 0).
        sync_period: local-SGD periods (integers >= 1).
        error_feedback: error feedback for lossy compressors (fixed, not a choice).

    Raises:
        ValueError: an empty or duplicated list, or an invalid entry (the message names it).
    """

    compression: tuple[str, ...] = ("none", "fp16", "int8", "topk:0.01", "powersgd:2")
    bucket_mb: tuple[float, ...] = (1.0, 4.0, 25.0)
    sync_period: tuple[int, ...] = (1, 2, 4)
    error_feedback: bool = True

    def __post_init__(self) -> None:
        comp = tuple(str(CompressionSpec.parse(c)) for c in self.compression)
        object.__setattr__(self, "compression", comp)
        object.__setattr__(self, "bucket_mb", tuple(float(b) for b in self.bucket_mb))
        object.__setattr__(self, "sync_period", tuple(self.sync_period))
        for name in ("compression", "bucket_mb", "sync_period"):
            values = getattr(self, name)
            if not values:
                raise ValueError(f"action menu {name} must not be empty")
            if len(set(values)) != len(values):
                raise ValueError(f"action menu {name} has duplicates: {list(values)}")
        for b in self.bucket_mb:
            CommConfig(bucket_mb=b)  # raises with the value
        for h in self.sync_period:
            CommConfig(sync_period=h)

    @classmethod
    def from_any(cls, menu: ActionMenu | dict[str, Sequence[Any]] | None) -> ActionMenu:
        """Build from a menu, a dict of lists (e.g. from YAML) or None (the default menu).

        Raises:
            TypeError: unsupported type; ValueError: unknown keys or invalid entries.
        """
        if menu is None:
            return cls()
        if isinstance(menu, cls):
            return menu
        if isinstance(menu, dict):
            unknown = set(menu) - {"compression", "bucket_mb", "sync_period", "error_feedback"}
            if unknown:
                raise ValueError(
                    f"unknown action menu keys {sorted(unknown)}; valid: compression, "
                    "bucket_mb, sync_period, error_feedback"
                )
            kw = {k: tuple(v) if k != "error_feedback" else bool(v) for k, v in menu.items()}
            return cls(**kw)
        raise TypeError(
            f"action_menu must be an ActionMenu, a dict or None, got {type(menu).__name__}"
        )

    @property
    def nvec(self) -> np.ndarray:
        """Sizes of the three lists (for ``MultiDiscrete``)."""
        return np.array(
            [len(self.compression), len(self.bucket_mb), len(self.sync_period)], dtype=np.int64
        )

    @property
    def size(self) -> int:
        """Number of distinct configurations."""
        return int(np.prod(self.nvec))

    def entry_names(self) -> list[str]:
        """Every entry as ``str(CommConfig)``, in flat row-major order (the simulator's index)."""
        return [str(self.decode(np.array(a))) for a in np.ndindex(*map(int, self.nvec))]

    def action_in(self, observation: np.ndarray) -> np.ndarray:
        """The menu indices an observation names (the entry configured last).

        The inverse of the observation's ``compression_index`` / ``bucket_index`` /
        ``period_index`` fields (each ``index / (n - 1)``, :class:`ObservationBuilder`),
        rounded and clipped to the menu.

        Args:
            observation: one observation, float array of shape ``(len(OBSERVATION_FIELDS),)``.

        Returns:
            int64 array ``[i_compression, i_bucket, i_period]``.
        """
        out = []
        for name, n in zip(_ACTION_FIELDS, self.nvec, strict=True):
            top = max(int(n) - 1, 1)
            i = round(float(observation[_FIELD_INDEX[name]]) * top)
            out.append(min(max(i, 0), int(n) - 1))
        return np.array(out, dtype=np.int64)

    def decode(self, action: Sequence[int] | np.ndarray) -> CommConfig:
        """Map ``[i_compression, i_bucket, i_period]`` to a :class:`CommConfig`.

        Raises:
            ValueError: wrong length, non-integer or out-of-range index (message gives the
                valid ranges).
        """
        a = np.asarray(action)
        if a.shape != (3,) or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(
                f"action must be 3 integers [compression, bucket, period], got {action!r}"
            )
        nvec = self.nvec
        if (a < 0).any() or (a >= nvec).any():
            raise ValueError(
                f"action {a.tolist()} out of range: valid indices are 0..{nvec[0] - 1} "
                f"(compression), 0..{nvec[1] - 1} (bucket_mb), 0..{nvec[2] - 1} (sync_period)"
            )
        return CommConfig(
            self.compression[int(a[0])],
            bucket_mb=self.bucket_mb[int(a[1])],
            sync_period=int(self.sync_period[int(a[2])]),
            error_feedback=self.error_feedback,
        )

    def encode(self, config: CommConfig) -> np.ndarray:
        """Indices of ``config`` in the menu.

        Raises:
            ValueError: the configuration is not on the menu.
        """
        try:
            return np.array(
                [
                    self.compression.index(str(config.compression)),
                    self.bucket_mb.index(config.bucket_mb),
                    self.sync_period.index(config.sync_period),
                ],
                dtype=np.int64,
            )
        except ValueError:
            raise ValueError(
                f"configuration {config} is not on the action menu {self.to_dict()}"
            ) from None

    def default_action(self) -> np.ndarray:
        """The DDP default (``none``, 25 MiB, period 1) where the menu has it.

        Otherwise the closest entries: first compression, largest bucket, smallest period.
        """
        c = self.compression.index("none") if "none" in self.compression else 0
        b = self.bucket_mb.index(25.0) if 25.0 in self.bucket_mb else int(np.argmax(self.bucket_mb))
        h = int(np.argmin(self.sync_period))
        return np.array([c, b, h], dtype=np.int64)

    def to_dict(self) -> dict[str, Any]:
        """Plain lists (for YAML, MLflow params and compatibility checks)."""
        return {
            "compression": list(self.compression),
            "bucket_mb": list(self.bucket_mb),
            "sync_period": list(self.sync_period),
            "error_feedback": self.error_feedback,
        }


@dataclass(frozen=True)
class ObservationField:
    """One entry of the observation vector."""

    name: str
    unit: str
    low: float
    high: float
    description: str


#: The observation layout (index = position in the vector). Changing it bumps the env version.
OBSERVATION_FIELDS: tuple[ObservationField, ...] = (
    ObservationField(
        "step_time_s", "s", 0.0, 1e3, "median wall time of one training iteration (slowest rank)"
    ),
    ObservationField("comm_wait_frac", "1", 0.0, 1.0, "mean comm-wait time / mean iteration time"),
    ObservationField("compress_s", "s", 0.0, 1e3, "mean compress+decompress time per iteration"),
    ObservationField(
        "log10_bytes_per_step",
        "log10 B",
        0.0,
        15.0,
        "log10(1 + bytes handed to collectives per iteration)",
    ),
    ObservationField(
        "bandwidth_gbps",
        "Gbit/s",
        0.0,
        1e4,
        "effective: bytes sent * 8 / time the step waited on communication "
        "(not the link rate; see effective_bandwidth_gbps)",
    ),
    ObservationField(
        "train_loss", "nats", 0.0, 1e4, "mean training loss over the decision (all ranks)"
    ),
    ObservationField("eval_loss", "nats", 0.0, 1e4, "held-out loss of the consensus model"),
    ObservationField(
        "loss_change", "log ratio", -20.0, 20.0, "log(eval_loss_prev) - log(eval_loss)"
    ),
    ObservationField(
        "log10_grad_norm", "log10", -20.0, 20.0, "log10 of the aggregated gradient norm"
    ),
    ObservationField("grad_norm_rel_change", "1", -10.0, 10.0, "(g - g_prev) / g_prev"),
    ObservationField(
        "compression_error", "1", 0.0, 10.0, "||g - g_hat|| / ||g|| of the aggregated gradient"
    ),
    ObservationField("compression_index", "1", 0.0, 1.0, "current compression index / (n - 1)"),
    ObservationField("bucket_index", "1", 0.0, 1.0, "current bucket index / (n - 1)"),
    ObservationField("period_index", "1", 0.0, 1.0, "current sync-period index / (n - 1)"),
    ObservationField("elapsed_frac", "1", 0.0, 1.0, "training wall time used / time_budget_s"),
    ObservationField("world_size", "ranks", 1.0, 1e5, "number of ranks"),
    ObservationField(
        "log10_num_params", "log10", 0.0, 15.0, "log10 of the model's parameter count"
    ),
    ObservationField(
        "log10_probe_gbps",
        "log10 Gbit/s",
        -4.0,
        4.0,
        "bus bandwidth of the fixed-size probe all-reduce at the decision's end "
        "(probe_gbps; 0 when the env runs no probe)",
    ),
    ObservationField(
        "log10_link_gbps",
        "log10 Gbit/s",
        -4.0,
        4.0,
        "configured link rate, privileged (0 unless privileged_obs; unshaped counts as "
        "UNSHAPED_GBPS)",
    ),
    ObservationField(
        "straggler_ms",
        "ms",
        0.0,
        6e4,
        "configured straggler delay x probability per iteration, privileged (0 unless "
        "privileged_obs)",
    ),
)

#: The rate an unshaped (loopback) link counts as in the privileged observation, Gbit/s.
UNSHAPED_GBPS = 100.0


def probe_gbps(probe_bytes: float, probe_s: float, world_size: int) -> float:
    """Bus bandwidth of a probe all-reduce (nccl-tests' ``size / t * 2(W-1)/W``), Gbit/s.

    Args:
        probe_bytes: the probe buffer's size, B.
        probe_s: its all-reduce's time, s (the fastest rank's).
        world_size: ranks.

    Returns:
        Gbit/s; 0 when no probe ran (``probe_s`` or ``probe_bytes`` 0) or ``W = 1``.
    """
    if probe_s <= 0 or probe_bytes <= 0 or world_size < 2:
        return 0.0
    return probe_bytes * 2 * (world_size - 1) / world_size * 8 / probe_s / 1e9


def reset_probe_option(options: Mapping[str, Any] | None) -> bool:
    """Whether an episode's player reads the probe: ``env.reset``'s ``options["probe"]``.

    The rollout resets every episode with ``{"probe": agent.reads_probe}``; a player that
    never reads ``log10_probe_gbps`` then runs no probe all-reduce (its time would count as
    training time for an observation it never makes). Other options are left to the env,
    as Gymnasium's envs do.

    Args:
        options: ``env.reset``'s options (``None``: probe on, as configured).

    Returns:
        ``True`` unless ``options["probe"]`` is ``False``.

    Raises:
        ValueError: ``options`` is not a mapping, or ``options["probe"]`` is not a bool.
    """
    if options is None:
        return True
    if not isinstance(options, Mapping):
        raise ValueError(f"reset options must be a mapping or None, got {options!r}")
    probe = options.get("probe", True)
    if not isinstance(probe, bool | np.bool_):
        raise ValueError(f"reset option 'probe' must be True or False, got {probe!r}")
    return bool(probe)


class ObservationBuilder:
    """Builds float32 observations from measurements (shared by env, surrogate and replay).

    Non-finite or out-of-range measurements never leak: NaN becomes 0 and everything is
    clipped to the field's bounds (the raw values stay in ``info``).

    Args:
        menu: the action menu (gives the action-index normalisation).
        world_size: number of ranks.
        num_params: model parameter count.
    """

    def __init__(self, menu: ActionMenu, world_size: int, num_params: int) -> None:
        self.menu = menu
        self.world_size = world_size
        self.num_params = num_params
        self.low = np.array([f.low for f in OBSERVATION_FIELDS], dtype=np.float32)
        self.high = np.array([f.high for f in OBSERVATION_FIELDS], dtype=np.float32)
        self.space = spaces.Box(self.low, self.high, dtype=np.float32)
        self.prev_eval_loss = float("nan")
        self.prev_grad_norm = float("nan")

    def _action_part(self, action: np.ndarray) -> dict[str, float]:
        nvec = self.menu.nvec
        return {
            name: float(a) / max(int(n) - 1, 1)
            for name, a, n in zip(_ACTION_FIELDS, action, nvec, strict=True)
        }

    def _finish(self, values: dict[str, float]) -> np.ndarray:
        assert len(values) == len(_FIELD_NAMES), sorted(set(values) ^ set(_FIELD_NAMES))
        v = np.array([values[name] for name in _FIELD_NAMES], dtype=np.float64)
        v[~np.isfinite(v)] = 0.0
        return np.clip(v, self.low, self.high).astype(np.float32)

    def _static(self) -> dict[str, float]:
        return {
            "world_size": float(self.world_size),
            "log10_num_params": math.log10(max(self.num_params, 1)),
        }

    def reset(self, eval_loss: float, action: np.ndarray, *, probe_gbps: float = 0.0) -> np.ndarray:
        """Observation at episode start: no timings, only deterministic quantities.

        Args:
            eval_loss: the held-out loss of the initial model.
            action: the menu indices in force (the default action).
            probe_gbps: the probe all-reduce's bus bandwidth measured right after the
                reset (``probe_at="reset"``), Gbit/s; 0: no probe ran.
        """
        self.prev_eval_loss = eval_loss
        self.prev_grad_norm = float("nan")
        values = dict.fromkeys(_FIELD_NAMES, 0.0)
        values.update(train_loss=eval_loss, eval_loss=eval_loss)
        values.update(self._action_part(action))
        values.update(self._static())
        values["log10_probe_gbps"] = _log10_or_0(probe_gbps)
        return self._finish(values)

    def build(
        self,
        m: DecisionMeasurement | Mapping[str, Any],
        action: np.ndarray,
        elapsed_frac: float,
        *,
        link_gbps: float | None = None,
        straggler_ms: float | None = None,
    ) -> np.ndarray:
        """Observation after a decision.

        Args:
            m: the decision's :class:`DecisionMeasurement` (or its ``to_dict()``).
            action: the menu indices that were applied.
            elapsed_frac: training time used / budget.
            link_gbps: the configured link rate for the privileged field (None: 0, not
                revealed).
            straggler_ms: the configured straggler delay x probability, privileged.
        """
        if isinstance(m, Mapping):
            m = _DictView(m)
        step = float(m.step_time_s)
        iter_mean = float(m.iter_mean_s) or step
        wait = float(m.comm_wait_s)
        comm_s = float(m.comm_s)
        eval_loss = float(m.eval_loss)
        prev = self.prev_eval_loss
        g = float(m.grad_norm)
        err = m.compression_error
        values = {
            "step_time_s": step,
            "comm_wait_frac": wait / iter_mean if iter_mean > 0 else 0.0,
            "compress_s": float(m.compress_s),
            "log10_bytes_per_step": math.log10(1.0 + float(m.bytes_per_step)),
            "bandwidth_gbps": effective_bandwidth_gbps(m.bytes_total, comm_s),
            "train_loss": float(m.train_loss),
            "eval_loss": eval_loss,
            "loss_change": (
                math.log(max(prev, 1e-8)) - math.log(max(eval_loss, 1e-8))
                if math.isfinite(prev) and math.isfinite(eval_loss)
                else 0.0
            ),
            "log10_grad_norm": math.log10(g) if g > 0 and math.isfinite(g) else 0.0,
            "grad_norm_rel_change": (
                (g - self.prev_grad_norm) / self.prev_grad_norm
                if self.prev_grad_norm > 0 and math.isfinite(g)
                else 0.0
            ),
            "compression_error": 0.0 if err is None else float(err),
            "elapsed_frac": elapsed_frac,
            **self._action_part(action),
            **self._static(),
            "log10_probe_gbps": _log10_or_0(
                probe_gbps(float(m.probe_bytes), float(m.probe_s), self.world_size)
            ),
            "log10_link_gbps": 0.0 if link_gbps is None else _log10_or_0(link_gbps),
            "straggler_ms": 0.0 if straggler_ms is None else straggler_ms,
        }
        self.prev_eval_loss = eval_loss if math.isfinite(eval_loss) else prev
        self.prev_grad_norm = g if math.isfinite(g) else self.prev_grad_norm
        return self._finish(values)


def _log10_or_0(x: float) -> float:
    return math.log10(x) if x > 0 and math.isfinite(x) else 0.0


_FIELD_NAMES = tuple(f.name for f in OBSERVATION_FIELDS)
_FIELD_INDEX = {name: i for i, name in enumerate(_FIELD_NAMES)}
_ACTION_FIELDS = ("compression_index", "bucket_index", "period_index")


class _DictView:
    """Attribute access to a measurement mapping (optional keys get their defaults)."""

    def __init__(self, d: Mapping[str, Any]) -> None:
        self._d = d

    def __getattr__(self, key: str) -> Any:
        d = self._d
        if key == "iter_mean_s":
            return d.get("iter_mean_s", d["step_time_s"])
        if key == "compression_error":
            return d.get("compression_error")
        if key in ("probe_s", "probe_bytes"):
            return d.get(key, 0)
        return d[key]


@dataclass
class RewardContext:
    """What a reward function may look at for one decision."""

    prev_eval_loss: float
    eval_loss: float
    dt_s: float
    time_budget_s: float
    samples: int
    target_loss: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _log_progress(c: RewardContext) -> float:
    return math.log(max(c.prev_eval_loss, 1e-8)) - math.log(max(c.eval_loss, 1e-8))


def _time_to_target(c: RewardContext) -> float:
    return -c.dt_s / c.time_budget_s


def _throughput(c: RewardContext) -> float:
    return c.samples / c.dt_s / 1000.0 if c.dt_s > 0 else 0.0


#: Reward functions by name (see ``AllReduceEnv``'s docstring for the formulas).
REWARDS: dict[str, Callable[[RewardContext], float]] = {
    "log_progress": _log_progress,
    "time_to_target": _time_to_target,
    "throughput": _throughput,
}


def decision_outcome(
    cfg: Any,
    reward_fn: Callable[[RewardContext], float],
    *,
    prev_eval_loss: float,
    eval_loss: float,
    dt_s: float,
    samples: int,
    diverged: bool,
    train_time_s: float,
    decisions: int,
) -> tuple[float, bool, bool, str | None]:
    """Reward and episode end of one decision (the one definition every env uses).

    Args:
        cfg: the env config (reads ``time_budget_s``, ``target_loss``, ``max_decisions``).
        reward_fn: an entry of :data:`REWARDS`.
        prev_eval_loss: held-out loss before the decision.
        eval_loss: held-out loss after it.
        dt_s: the decision's training time in seconds.
        samples: samples trained on during the decision (all ranks).
        diverged: a non-finite loss or gradient was seen.
        train_time_s: training time used in the episode so far, this decision included.
        decisions: decisions taken in the episode, this one included.

    Returns:
        ``(reward, terminated, truncated, reason)``: reward 0 on divergence; terminated for
        ``"diverged"`` / ``"target_reached"``, truncated for ``"time_budget"`` /
        ``"max_decisions"``; reason ``None`` while the episode goes on.
    """
    reward = 0.0
    if not diverged:
        reward = reward_fn(
            RewardContext(
                prev_eval_loss=prev_eval_loss,
                eval_loss=eval_loss,
                dt_s=dt_s,
                time_budget_s=cfg.time_budget_s,
                samples=samples,
                target_loss=cfg.target_loss,
            )
        )
    if diverged:
        return reward, True, False, "diverged"
    if cfg.target_loss is not None and eval_loss <= cfg.target_loss:
        return reward, True, False, "target_reached"
    if train_time_s >= cfg.time_budget_s:
        return reward, False, True, "time_budget"
    if cfg.max_decisions is not None and decisions >= cfg.max_decisions:
        return reward, False, True, "max_decisions"
    return reward, False, False, None
