"""The simulator's measured parts, as one JSON record of one workload on this machine.

A :class:`Calibration` holds what ``commgym calibrate-sim`` measured (each part where it
lives) for one *workload setting* (workload, world size, threads per rank, shards, learning
rate, batch size, steps per decision) and one action menu. Scenarios that share the setting
share the calibration (``flaky-link`` and ``link-lottery`` do): links, schedules and budgets
are the scenario's, not the calibration's.

* ``entries``: per menu entry, what static episodes on unshaped loopback measured on the
  ranks (median decision time without the probe, median iteration time, compute per
  iteration, bytes per decision) and the held-out loss curves (one per calibration seed);
* ``codec``: per compression spec, the kernels' codec time and payload per round
  (:mod:`commgym.env.sim.codec`) on the workload's one bucket;
* ``wire``: the alpha-beta fit per recorded link rate (:mod:`commgym.env.sim.wire`);
* ``switch_penalty`` / ``switch_penalties`` / ``switch_costs``: the progress a switch costs,
  pooled, per pair of compressor families, or per family entered over two decisions (the
  form whose held-out episodes the fit predicted better; where ``switch_costs`` is
  non-empty it is the simulator's), with the fit's leave-one-episode-out check
  ``switch_fit`` (:mod:`commgym.env.sim.progress`);
* ``meta``: the real cost (seconds, decisions), load, date, commit.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from commgym.env.sim.codec import CodecMeasurement
from commgym.env.sim.wire import WireModel

__all__ = ["CALIBRATION_VERSION", "Calibration", "EntryCalibration", "workload_key"]

#: Layout version of the JSON record; others are refused.
CALIBRATION_VERSION = 1


def workload_key(cfg: Any) -> dict[str, Any]:
    """The settings a calibration is valid for, from an ``EnvConfig``.

    Learning rate and batch size are resolved to the workload's defaults when unset, so
    ``lr: null`` and the default's value mean the same setting.
    """
    from commgym.env.workloads import get_workload

    wl = get_workload(cfg.workload)
    return {
        "workload": cfg.workload,
        "world_size": int(cfg.world_size),
        "threads_per_rank": int(cfg.threads_per_rank),
        "shards": str(cfg.shards),
        "lr": float(cfg.lr if cfg.lr is not None else wl.default_lr),
        "batch_size": int(cfg.batch_size if cfg.batch_size is not None else wl.default_batch_size),
        "steps_per_decision": int(cfg.steps_per_decision),
        "backend": str(cfg.backend),
    }


def _json_safe(d: dict[str, Any]) -> dict[str, Any]:
    """NaN -> None at the top level (JSON has no NaN)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


@dataclass
class EntryCalibration:
    """One menu entry on unshaped loopback (medians over its calibration decisions).

    Attributes:
        train_s: decision time without the probe, s.
        step_s: median iteration time, s.
        compute_s: forward + backward per iteration, s (the ranks' ``compute_s``).
        compress_s: the ranks' codec time per iteration, s (0 where they time none:
            local-SGD averaging is not in it).
        bytes_total: bytes handed to collectives per decision, B (link-independent).
        train_loss_ratio: median of training loss / held-out loss before the decision.
        log10_grad_norm: median log10 of the aggregated gradient norm.
        compression_error: median compression error (0 when never measured).
        decisions: calibration decisions behind the medians.
        curves: held-out losses per calibration seed: the reset's, then after each decision.
    """

    train_s: float
    step_s: float
    compute_s: float
    compress_s: float
    bytes_total: float
    train_loss_ratio: float
    log10_grad_norm: float
    compression_error: float
    decisions: int
    curves: list[list[float]] = field(default_factory=list)


@dataclass
class Calibration:
    """Everything the simulator reads (see the module docstring).

    Attributes:
        key: :func:`workload_key` of the calibrated setting.
        menu: the action menu (``ActionMenu.to_dict``).
        num_params: the model's parameter count.
        param_shapes: the model's parameter shapes in bucket order (one bucket).
        optimizer_state_bytes: bytes of the rank-local optimizer state averaged when a
            local-SGD period switches to 1 (SGD momentum: one fp32 buffer per parameter).
        target_loss: held-out loss the calibration episodes ran down to (the floor the
            simulator answers for).
        entries: ``str(CommConfig)`` -> :class:`EntryCalibration`.
        codec: compression spec -> :class:`CodecMeasurement`.
        wire: the fitted :class:`WireModel`.
        switch_penalty: progress lost by a switching decision whose pair has no own
            value, share of a decision (pooled over every switch).
        switch_penalties: ``"family->family"`` -> progress lost by such a switch
            (:func:`~commgym.env.sim.progress.switch_pair`).
        switch_costs: family switched to -> ``[c0, c1]``, progress lost by the switching
            decision and by the next one if it plays the same entry; non-empty: this
            form is the model's (calibrations before it have none: the pair form).
        switch_fit: what :func:`~commgym.env.sim.progress.fit_switch_penalties` returned
            (counts per pair and the leave-one-episode-out errors: the switch gate).
        switch_episodes: the random-switch episodes it was fitted on, ``[entries played,
            held-out losses]`` each (``losses[0]`` the reset's), so a fit can be redone.
        eval_acc: ``[[loss, accuracy], ...]`` sorted by loss (the accuracy read-out).
        link_train_s: ``str(rate bit/s)`` -> entry -> median decision time without the probe
            measured on that emulated link, s (short static episodes; entries too slow there
            are left out). Where present, :class:`~commgym.env.sim.model.SimModel` adds the
            difference from its composed time as the entry's host cost on that link (empty
            in calibrations before it: the composed time alone).
        meta: cost (``real_s``, ``real_decisions``), load, date, commit, seeds.
        version: :data:`CALIBRATION_VERSION`.
    """

    key: dict[str, Any]
    menu: dict[str, Any]
    num_params: int
    param_shapes: list[list[int]]
    optimizer_state_bytes: int
    target_loss: float
    entries: dict[str, EntryCalibration]
    codec: dict[str, CodecMeasurement]
    wire: WireModel
    switch_penalty: float = 0.0
    switch_penalties: dict[str, float] = field(default_factory=dict)
    switch_costs: dict[str, list[float]] = field(default_factory=dict)
    switch_fit: dict[str, Any] = field(default_factory=dict)
    switch_episodes: list[list[list[Any]]] = field(default_factory=list)
    eval_acc: list[list[float]] = field(default_factory=list)
    link_train_s: dict[str, dict[str, float]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    version: int = CALIBRATION_VERSION

    def to_dict(self) -> dict[str, Any]:
        """Plain values (JSON)."""
        return {
            "version": self.version,
            "key": dict(self.key),
            "menu": dict(self.menu),
            "num_params": self.num_params,
            "param_shapes": [list(s) for s in self.param_shapes],
            "optimizer_state_bytes": self.optimizer_state_bytes,
            "target_loss": self.target_loss,
            "entries": {k: asdict(v) for k, v in self.entries.items()},
            "codec": {k: v.to_dict() for k, v in self.codec.items()},
            "wire": self.wire.to_dict(),
            "switch_penalty": self.switch_penalty,
            "switch_penalties": dict(self.switch_penalties),
            "switch_costs": {k: list(v) for k, v in self.switch_costs.items()},
            "switch_fit": _json_safe(self.switch_fit),
            "switch_episodes": [[list(e), list(ls)] for e, ls in self.switch_episodes],
            "eval_acc": self.eval_acc,
            "link_train_s": {r: dict(v) for r, v in self.link_train_s.items()},
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: another layout version.
        """
        if d.get("version") != CALIBRATION_VERSION:
            raise ValueError(
                f"simulator calibration version {d.get('version')!r} is not "
                f"{CALIBRATION_VERSION}: re-run `commgym calibrate-sim`"
            )
        return cls(
            key=dict(d["key"]),
            menu=dict(d["menu"]),
            num_params=int(d["num_params"]),
            param_shapes=[list(s) for s in d["param_shapes"]],
            optimizer_state_bytes=int(d["optimizer_state_bytes"]),
            target_loss=float(d["target_loss"]),
            entries={k: EntryCalibration(**v) for k, v in d["entries"].items()},
            codec={k: CodecMeasurement.from_dict(v) for k, v in d["codec"].items()},
            wire=WireModel.from_dict(d["wire"]),
            switch_penalty=float(d["switch_penalty"]),
            # calibrations written before the per-pair fit have one pooled penalty and the
            # RMS of its fit
            switch_penalties={k: float(v) for k, v in d.get("switch_penalties", {}).items()},
            switch_costs={k: [float(x) for x in v] for k, v in d.get("switch_costs", {}).items()},
            switch_fit=dict(d.get("switch_fit", {"rms": d.get("switch_rms")})),
            switch_episodes=[[list(e), list(ls)] for e, ls in d.get("switch_episodes", [])],
            eval_acc=[list(x) for x in d.get("eval_acc", [])],
            link_train_s={
                str(r): {e: float(t) for e, t in v.items()}
                for r, v in d.get("link_train_s", {}).items()
            },
            meta=dict(d.get("meta", {})),
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the JSON record (parents created)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1))
        return p

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Calibration:
        """Read a JSON record written by :meth:`save`.

        Raises:
            FileNotFoundError: no file; ValueError: another layout version.
        """
        return cls.from_dict(json.loads(Path(path).read_text()))

    def check(self, cfg: Any) -> None:
        """Refuse an env config the calibration cannot answer for.

        Raises:
            ValueError: another workload setting, a menu entry never calibrated, a target
                below the calibrated curves, or a condition the simulator does not model
                (straggler jitter, cross traffic, link delay/jitter/loss, several buckets).
        """
        key = workload_key(cfg)
        diff = {k: (v, self.key.get(k)) for k, v in key.items() if self.key.get(k) != v}
        if diff:
            parts = ", ".join(f"{k}={a!r} (calibrated: {b!r})" for k, (a, b) in diff.items())
            raise ValueError(
                f"the simulator's calibration is for another setting: {parts}; run "
                "`commgym calibrate-sim` for this one"
            )
        from commgym.env.spaces import ActionMenu

        menu = cfg.menu if isinstance(cfg.menu, ActionMenu) else ActionMenu.from_any(cfg.menu)
        import numpy as np

        missing = [
            str(menu.decode(np.array(a)))
            for a in np.ndindex(*tuple(int(n) for n in menu.nvec))
            if str(menu.decode(np.array(a))) not in self.entries
        ]
        if missing:
            raise ValueError(
                f"menu entries {missing} were not calibrated (calibrated: "
                f"{sorted(self.entries)}); run `commgym calibrate-sim` with this menu"
            )
        model_bytes = 4 * self.num_params
        small = [b for b in menu.bucket_mb if b * 2**20 < model_bytes]
        if small:
            raise ValueError(
                f"bucket_mb {small} split the {model_bytes:,} B model into several buckets: "
                "the simulator models one bucket per exchange (no overlap between buckets); "
                "use a bucket >= the model or the real env"
            )
        target = getattr(cfg, "target_loss", None)
        if target is not None and target < self.target_loss * 0.999:
            raise ValueError(
                f"target_loss {target} is below the calibrated curves' reach "
                f"({self.target_loss}); calibrate with a lower --target-loss"
            )
        if any(c.active for c in cfg.straggler_condition.values):
            raise ValueError(
                f"stragglers={cfg.stragglers!r}: the simulator does not model straggler "
                "jitter; use the real env (env_kind: real)"
            )
        if any(c.active for c in cfg.cross_traffic_condition.values):
            raise ValueError(
                f"cross_traffic={cfg.cross_traffic!r}: the simulator does not model "
                "competing flows; use the real env (env_kind: real)"
            )
        impaired = [str(s) for s in cfg.network_plan.specs if s.has_impairments]
        if impaired:
            raise ValueError(
                f"network specs {impaired} have delay, jitter or loss: the simulator models "
                "the link rate and its token bucket only"
            )
