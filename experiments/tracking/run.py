"""One MLflow run: :class:`RunLogger` batches params, metrics and artifacts, never raising.

A logger logs through the store that opened it (:class:`RunStore`, which
:class:`~commgym.experiments.tracking.Tracker` is): that store owns the client and the
failure handling; this module owns what one run's values must look like for MLflow.
"""

from __future__ import annotations

import math
import numbers
import os
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any, Protocol

__all__ = [
    "MAX_METRICS_PER_BATCH",
    "MAX_PARAMS_TAGS_PER_BATCH",
    "MAX_PARAM_VAL_LENGTH",
    "MAX_TAG_VAL_LENGTH",
    "RunLogger",
    "RunStore",
    "flatten",
    "truncate",
]

#: MLflow's limits (``mlflow.utils.validation``), repeated so this module imports fast.
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level of dotted keys (``{"env": {"a": 1}}`` -> ``env.a``)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def truncate(value: str, limit: int) -> str:
    """``value`` cut to ``limit`` characters, the cut marked with ``...``."""
    return value if len(value) <= limit else value[: limit - 3] + "..."


class RunStore(Protocol):
    """What a :class:`RunLogger` needs of the store it logs to (the ``Tracker``).

    Attributes:
        client: the ``mlflow.MlflowClient`` of the store.
    """

    client: Any

    def call(self, kind: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one store call; on failure warn once per ``kind`` and return ``None``."""

    def warn(self, kind: str, message: str) -> None:
        """Warn once per ``kind`` of problem."""


class RunLogger:
    """Logs to one MLflow run; a context manager that ends the run.

    Leaving the ``with`` block ends the run ``FINISHED`` (``KILLED`` when a
    ``KeyboardInterrupt`` escapes it, ``FAILED`` for any other exception; the exception
    is re-raised). All methods are thread-safe and never raise
    on store failures (they warn once per kind of failure and continue). A logger whose
    :attr:`run_id` is ``None`` (disabled tracker) accepts every call and records nothing.

    Metrics are buffered and sent with ``client.log_batch`` every ``flush_every`` points
    and on :meth:`flush` / :meth:`end`. Non-finite values (NaN, ±inf) are never logged as
    numbers: the run gets tag ``diverged=true`` and tag ``nonfinite.<key>`` holding the
    raw value and the step where it first occurred.

    Args:
        tracker: the store that opened the run (the :class:`~commgym.experiments.tracking.Tracker`).
        run_id: MLflow run id, or ``None`` for a no-op logger.
        name: run name.
        flush_every: buffered metric points that trigger a batch send.
    """

    def __init__(
        self, tracker: RunStore, run_id: str | None, name: str = "", *, flush_every: int = 500
    ) -> None:
        if flush_every < 1:
            raise ValueError(f"flush_every must be >= 1, got {flush_every!r}")
        self.tracker = tracker
        self.name = name
        self._run_id = run_id
        self.flush_every = int(flush_every)
        self._buffer: list[Any] = []
        self._nonfinite_seen: set[str] = set()
        self._lock = threading.RLock()
        self._ended = False
        self.points_logged = 0
        self.points_dropped = 0

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (``None`` when nothing is recorded)."""
        return self._run_id

    @property
    def active(self) -> bool:
        """Whether calls reach a store (run exists and has not ended)."""
        return self._run_id is not None and not self._ended

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.end("FINISHED")
        else:  # Ctrl-C, and SIGTERM/SIGHUP through the CLI's handler, are interruptions
            self.end("KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED")

    # -- params and tags ----------------------------------------------------------------
    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log parameters; nested dicts become dotted keys (``env.world_size``).

        Values are stringified; longer than MLflow's 6000 characters they are truncated
        (with a warning). Logging a key again with a different value fails in MLflow
        (params are immutable): that is warned about, not raised.

        Args:
            params: possibly nested mapping of parameter names to values.

        Raises:
            TypeError: ``params`` is not a mapping.
        """
        if not isinstance(params, Mapping):
            raise TypeError(f"params must be a mapping, got {type(params).__name__}")
        flat = flatten(params)
        items = []
        for k, v in flat.items():
            s = str(v)
            if len(s) > MAX_PARAM_VAL_LENGTH:
                warnings.warn(
                    f"param {k!r} is {len(s)} characters, truncated to MLflow's limit of "
                    f"{MAX_PARAM_VAL_LENGTH}",
                    stacklevel=2,
                )
                s = truncate(s, MAX_PARAM_VAL_LENGTH)
            items.append((str(k), s))
        if not self.active or not items:
            return
        from mlflow.entities import Param

        for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            chunk = [Param(k, v) for k, v in items[i : i + MAX_PARAMS_TAGS_PER_BATCH]]
            self.tracker.call(
                "log_params",
                self.tracker.client.log_batch,
                self._run_id,
                params=chunk,
                synchronous=True,
            )

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set run tags (values stringified, truncated to MLflow's 8000 characters).

        Args:
            tags: tag names to values.
        """
        if not self.active or not tags:
            return
        from mlflow.entities import RunTag

        items = [RunTag(str(k), truncate(str(v), MAX_TAG_VAL_LENGTH)) for k, v in tags.items()]
        for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            self.tracker.call(
                "set_tags",
                self.tracker.client.log_batch,
                self._run_id,
                tags=items[i : i + MAX_PARAMS_TAGS_PER_BATCH],
                synchronous=True,
            )

    # -- metrics --------------------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Buffer metric points at ``step``; sent in batches.

        Args:
            metrics: names to numbers (Python, numpy or 0-d tensor scalars); ``None``
                values are skipped. Non-finite values are recorded as tags (see class doc).
            step: the x-axis value (decision, episode, iteration); required.

        Raises:
            TypeError: ``step`` is not an integer, or a value is not a number.
        """
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"step must be an integer, got {step!r}")
        step = int(step)
        now = int(time.time() * 1000)
        points = []
        nonfinite: dict[str, str] = {}
        for k, v in metrics.items():
            if v is None:
                continue
            try:
                x = float(v)
            except (TypeError, ValueError):
                raise TypeError(f"metric {k!r} must be a number, got {v!r}") from None
            if not math.isfinite(x):
                if k not in self._nonfinite_seen:
                    self._nonfinite_seen.add(k)
                    nonfinite[f"nonfinite.{k}"] = f"{x} (first at step {step})"
                continue
            points.append((str(k), x, now, step))
        if nonfinite:
            self.set_tags({"diverged": "true", **nonfinite})
        if not self.active:
            return
        with self._lock:
            self._buffer.extend(points)
            full = len(self._buffer) >= self.flush_every
        if full:
            self.flush()

    def flush(self) -> None:
        """Send all buffered metric points (``log_batch`` chunks of <= 1000 points)."""
        with self._lock:
            buf, self._buffer = self._buffer, []
            if not buf or self._run_id is None:
                return
            from mlflow.entities import Metric

            for i in range(0, len(buf), MAX_METRICS_PER_BATCH):
                chunk = [Metric(k, v, t, s) for k, v, t, s in buf[i : i + MAX_METRICS_PER_BATCH]]
                done = self.tracker.call(
                    "log_metrics",
                    self._log_batch_checked,
                    chunk,
                )
                if done:
                    self.points_logged += len(chunk)
                else:
                    self.points_dropped += len(chunk)

    def _log_batch_checked(self, chunk: list[Any]) -> bool:
        self.tracker.client.log_batch(self._run_id, metrics=chunk, synchronous=True)
        return True

    # -- artifacts ------------------------------------------------------------------------
    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        """Upload a local file or directory.

        Args:
            path: local file or directory.
            artifact_path: directory inside the run's artifacts (default: the root).
        """
        if self.active:
            self.tracker.call(
                "log_artifact",
                self.tracker.client.log_artifact,
                self._run_id,
                os.fspath(path),
                artifact_path,
            )

    def log_text(self, text: str, file_name: str) -> None:
        """Store ``text`` as artifact ``file_name`` (run-relative posix path)."""
        if self.active:
            self.tracker.call(
                "log_text", self.tracker.client.log_text, self._run_id, text, file_name
            )

    def log_dict(self, d: Mapping[str, Any], file_name: str) -> None:
        """Store a dict as YAML (``.yaml``/``.yml``) or JSON (anything else) artifact."""
        if self.active:
            self.tracker.call(
                "log_dict", self.tracker.client.log_dict, self._run_id, dict(d), file_name
            )

    # -- end --------------------------------------------------------------------------------
    def end(self, status: str = "FINISHED") -> None:
        """Flush and mark the run ``status`` (``FINISHED``, ``FAILED`` or ``KILLED``).

        Safe to call twice (the second call does nothing).
        """
        if self._ended:
            return
        self.flush()
        self._ended = True
        if self._run_id is not None:
            self.tracker.call("end_run", self.tracker.client.set_terminated, self._run_id, status)
