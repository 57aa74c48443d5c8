"""The gymnasium wrapper that logs every decision of an env to a :class:`RunLogger`."""

from __future__ import annotations

import csv
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from commgym.env.measure import DecisionMeasurement, measurement_from_info
from commgym.experiments.tracking.run import RunLogger


def _action_indices(action: Any) -> list[int] | None:
    try:
        arr = np.asarray(action).reshape(-1)
    except Exception:
        return None
    if arr.size == 0 or not np.issubdtype(arr.dtype, np.number):
        return None
    return [int(x) for x in arr]


def _scalar(v: Any) -> float | None:
    if v is None or isinstance(v, str):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _measured_metrics(m: DecisionMeasurement | None) -> dict[str, float | None]:
    """The ``comm/*`` and ``train/*`` metrics of one decision (none when nothing measured)."""
    if m is None:
        return {}
    return {
        "comm/bytes_per_step": _scalar(m.bytes_per_step),
        "comm/step_time_s": _scalar(m.step_time_s),
        "comm/comm_wait_s": _scalar(m.comm_wait_s),
        "comm/compress_s": _scalar(m.compress_s),
        "comm/compression_error": _scalar(m.compression_error),
        "train/loss": _scalar(m.train_loss),
        "train/eval_loss": _scalar(m.eval_loss),
        "train/eval_acc": _scalar(m.eval_acc),
        "train/grad_norm": _scalar(m.grad_norm),
    }


class TrackingWrapper(gym.Wrapper):
    """Logs every decision of a ``commgym/AllReduce-v1`` env to a :class:`RunLogger`.

    After each ``step`` it logs, with ``step`` = the running decision count over all
    episodes (1 after the first decision):

    =========================  ==========================================================
    metric                     source
    =========================  ==========================================================
    ``env/reward``             the step's reward
    ``env/train_time_s``       ``info["train_time_s"]`` (training time in the episode, s)
    ``comm/bytes_per_step``    ``measured.bytes_per_step`` (B per iteration)
    ``comm/step_time_s``       ``measured.step_time_s``
    ``comm/comm_wait_s``       ``measured.comm_wait_s``
    ``comm/compress_s``        ``measured.compress_s``
    ``comm/compression_error`` ``measured.compression_error`` (when not ``None``)
    ``train/loss``             ``measured.train_loss``
    ``train/eval_loss``        ``measured.eval_loss``
    ``train/eval_acc``         ``measured.eval_acc``
    ``train/grad_norm``        ``measured.grad_norm``
    ``action/compression``     menu index of the compression (first action component)
    ``action/bucket_mb``       ``info["action"]["bucket_mb"]`` (MiB)
    ``action/sync_period``     ``info["action"]["sync_period"]``
    =========================  ==========================================================

    and at each episode end ``episode/return`` and ``episode/length`` with ``step`` = the
    episode index (0-based). Each decision also becomes a row of raw values (non-finite
    ones included), the configuration string and the end reason; :meth:`close` writes
    them as artifact ``decisions.csv`` (or call :meth:`write_csv`). It reads only
    ``info`` and the action. Logging problems never raise out of ``step``.

    With ``log_decisions=False`` only the learning curve is logged: ``episode/return``
    and ``episode/length`` with ``step`` = decisions so far (timesteps), as SB3 plots
    it. That is what a run over thousands of training decisions should hold: one metric
    point per decision and metric (14 x 20,000 for the default ``commgym train``) made
    the MLflow store ~80 MB and the charts unreadable; the rows (and so the CSV) are
    kept either way.

    With ``rows="episodes"`` a row is kept per episode instead (its index, the decisions so
    far, return, length, training time, end reason and the configuration played most): a
    simulator's million decisions would otherwise hold a million rows in memory (~2 KB
    each) for a CSV nobody reads row by row.

    Steps that ran elsewhere (an env actor on a Ray cluster, several envs of a
    ``VecEnv``) are logged the same way by :meth:`record`, one ``stream`` per env.

    Args:
        env: the env (``AllReduceEnv`` or anything with the same ``info`` shape).
        run: where to log.
        prefix: prepended to every metric name (``"eval"`` gives ``eval/env/reward``).
        log_decisions: log the per-decision metrics above (``False``: learning curve only).
        rows: ``"decisions"`` (a row per decision) or ``"episodes"`` (a row per episode).

    Raises:
        ValueError: ``rows`` is neither.
    """

    def __init__(
        self,
        env: gym.Env,
        run: RunLogger,
        prefix: str = "",
        *,
        log_decisions: bool = True,
        rows: str = "decisions",
    ) -> None:
        super().__init__(env)
        if rows not in ("decisions", "episodes"):
            raise ValueError(f"rows must be 'decisions' or 'episodes', got {rows!r}")
        self.per_episode = rows == "episodes"
        self.run = run
        self.log_decisions = bool(log_decisions)
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.rows: list[dict[str, Any]] = []
        self.decisions = 0
        self.episodes = 0
        # per stream (env of a VecEnv): the running episode's return and length
        self._ep: dict[int, list[float]] = {}
        # per stream, with rows="episodes": decisions per configuration this episode
        self._played: dict[int, dict[str, int]] = {}
        self._closed = False

    def reset(self, **kwargs: Any):  # noqa: D102
        self._ep.pop(0, None)
        return self.env.reset(**kwargs)

    def step(self, action: Any):  # noqa: D102
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.record(action, reward, terminated, truncated, info)
        return obs, reward, terminated, truncated, info

    def record(
        self,
        action: Any,
        reward: float,
        terminated: bool,
        truncated: bool,
        info: Mapping[str, Any],
        *,
        stream: int = 0,
    ) -> None:
        """Log one step, as :meth:`step` does after stepping the env; never raises.

        Args:
            action: the action taken.
            reward: the step's reward.
            terminated: the step's ``terminated``.
            truncated: the step's ``truncated``.
            info: the step's ``info``.
            stream: which env of several the step came from (each keeps its own
                episode return and length).
        """
        try:
            self._record(action, reward, terminated, truncated, info, stream)
        except Exception as err:  # logging must never kill training
            self.run.tracker.warn(
                f"wrapper:{type(err).__name__}",
                f"TrackingWrapper could not record a step ({type(err).__name__}: {err})",
            )

    def _menu_index(self, action: Any, info: Mapping[str, Any]) -> int | None:
        idx = _action_indices(action)
        if idx is not None and len(idx) >= 3:
            return idx[0]
        # a flattened (Discrete) action: look the spec up in the env's menu
        menu = getattr(self.env.unwrapped, "menu", None)
        comp = (info.get("action") or {}).get("compression")
        if menu is not None and comp is not None and comp in getattr(menu, "compression", ()):
            return list(menu.compression).index(comp)
        return None

    def _record(self, action, reward, terminated, truncated, info, stream) -> None:
        self.decisions += 1
        ep = self._ep.setdefault(stream, [0.0, 0])
        ep[1] += 1
        r = _scalar(reward)
        ep[0] += r if r is not None else 0.0
        act: Mapping[str, Any] = info.get("action") or {}
        comp_idx = self._menu_index(action, info)
        metrics = {
            "env/reward": r,
            "env/train_time_s": _scalar(info.get("train_time_s")),
            **_measured_metrics(measurement_from_info(info)),
            "action/compression": comp_idx,
            "action/bucket_mb": _scalar(act.get("bucket_mb")),
            "action/sync_period": _scalar(act.get("sync_period")),
        }
        if self.log_decisions:
            self.run.log_metrics(
                {self.prefix + k: v for k, v in metrics.items()}, step=self.decisions
            )
        if self.per_episode:
            played = self._played.setdefault(stream, {})
            played[str(info.get("config"))] = played.get(str(info.get("config")), 0) + 1
            if terminated or truncated:
                self.rows.append({
                    "episode": self.episodes,
                    "decisions": self.decisions,
                    "episode_return": ep[0],
                    "episode_length": ep[1],
                    "train_time_s": info.get("train_time_s"),
                    "reason": info.get("reason"),
                    "most_played": max(played, key=played.get),
                    "condition": info.get("condition"),
                })  # fmt: skip
                del self._played[stream]
            self._episode_end(terminated, truncated, ep, stream)
            return

        idx = _action_indices(action)
        row: dict[str, Any] = {
            "decision": self.decisions,
            "episode": self.episodes,
            "episode_decision": info.get("decision", ep[1]),
            "train_time_s": info.get("train_time_s"),
            "reward": reward,
            "action": " ".join(map(str, idx)) if idx is not None else str(action),
            "config": info.get("config"),
            "compression": act.get("compression"),
            "compression_index": comp_idx,
            "bucket_mb": act.get("bucket_mb"),
            "sync_period": act.get("sync_period"),
        }
        # every measured value, env-side timings (``env_step_s``) included, as it came
        for k, v in (info.get("measured") or {}).items():
            key = f"decision_{k}" if k == "train_time_s" else k
            row[key] = v if not isinstance(v, list | tuple) else " ".join(map(str, v))
        row["terminated"] = bool(terminated)
        row["truncated"] = bool(truncated)
        row["reason"] = info.get("reason")
        if "failure" in info:
            row["failure"] = info["failure"]
        self.rows.append(row)
        self._episode_end(terminated, truncated, ep, stream)

    def _episode_end(self, terminated: bool, truncated: bool, ep: list[float], stream: int) -> None:
        if terminated or truncated:
            self.run.log_metrics(
                {
                    self.prefix + "episode/return": ep[0],
                    self.prefix + "episode/length": ep[1],
                },
                step=self.episodes if self.log_decisions else self.decisions,
            )
            self.episodes += 1
            del self._ep[stream]

    def write_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write the per-decision rows (raw values, ``nan``/``inf`` kept) as CSV.

        Args:
            path: destination file (parent directories are created).

        Returns:
            The path written.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fields: dict[str, None] = {}
        for row in self.rows:
            fields.update(dict.fromkeys(row))
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(fields), restval="")
            writer.writeheader()
            writer.writerows(self.rows)
        return path

    def close(self) -> None:
        """Log ``decisions.csv`` and flush the run (once), then close the env."""
        if not self._closed:
            self._closed = True
            try:
                with tempfile.TemporaryDirectory(prefix="commgym-") as tmp:
                    self.run.log_artifact(self.write_csv(Path(tmp) / "decisions.csv"))
                self.run.flush()
            except Exception as err:  # logging must never kill training
                self.run.tracker.warn(
                    f"wrapper-close:{type(err).__name__}",
                    f"TrackingWrapper could not save decisions.csv ({type(err).__name__}: {err})",
                )
        super().close()
