"""MLflow tracking for commgym runs: a failure-tolerant run logger and a gymnasium wrapper.

Everything here talks to MLflow through an explicit :class:`mlflow.MlflowClient`, never
through the fluent API (``mlflow.start_run`` / ``mlflow.log_metric``) and its
process-global active run, so several processes and threads can log to one store, and an
inherited ``MLFLOW_RUN_ID`` never redirects logging to somebody else's run.

Logging is a side concern: **no logging failure ever propagates into training**. An
unreachable tracking server, a locked SQLite file or a rejected value is reported with
``warnings.warn`` (once per kind of failure) and the run continues; a :class:`Tracker`
whose store cannot be reached at start-up degrades to a no-op.

Typical use::

    tracker = Tracker()  # sqlite:///<cwd>/mlflow.db unless MLFLOW_TRACKING_URI is set
    with tracker.start_run("ppo-mlp", params=cfg) as parent:
        parent.log_params(reproducibility_params())
        with tracker.start_run("seed-0", parent_run_id=parent.run_id) as run:
            env = TrackingWrapper(gymnasium.make("commgym/AllReduce-v0"), run)
            ...
            env.close()  # logs decisions.csv
    print(ui_command(tracker.tracking_uri))

Metrics always carry a ``step`` and are sent in batches (``client.log_batch``), so
10,000 points cost ~20 calls, not 10,000.
"""

from __future__ import annotations

import contextlib
import csv
import getpass
import importlib.metadata
import math
import numbers
import os
import platform
import random
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = [
    "RunLogger",
    "Tracker",
    "TrackingWrapper",
    "default_tracking_uri",
    "reproducibility_params",
    "ui_command",
]

#: MLflow's limits (``mlflow.utils.validation``), repeated so this module imports fast.
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100

#: Retries of one store call when SQLite reports ``database is locked``.
LOCK_RETRIES = 12

#: Limits applied to HTTP tracking servers while this module calls them (unless the user
#: set the variables): fail within seconds instead of MLflow's minutes of back-off.
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}

#: Experiment tags: MLflow 3's UI opens an untagged experiment in its GenAI view (traces,
#: prompts); ``custom_model_development`` opens the model-training view (runs, charts).
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}

_ENV_LOCK = threading.RLock()
_REPO_ROOT = Path(__file__).resolve().parent.parent


def default_tracking_uri(cwd: str | os.PathLike[str] | None = None) -> str:
    """The tracking URI commgym uses when none is given.

    Args:
        cwd: directory holding the database (default: the current working directory).

    Returns:
        ``$MLFLOW_TRACKING_URI`` when set, else MLflow's local SQLite store
        ``sqlite:///<absolute cwd>/mlflow.db``.
    """
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    base = Path(cwd if cwd is not None else os.getcwd()).resolve()
    return f"sqlite:///{(base / 'mlflow.db').as_posix()}"


def ui_command(uri: str | None = None) -> str:
    """The ``mlflow ui`` command line that shows the runs stored at ``uri``.

    Args:
        uri: tracking URI (default: :func:`default_tracking_uri`).

    Returns:
        e.g. ``mlflow ui --backend-store-uri sqlite:////home/me/mlflow.db --host 127.0.0.1``.
    """
    uri = uri if uri is not None else default_tracking_uri()
    return f"mlflow ui --backend-store-uri {shlex.quote(uri)} --host 127.0.0.1"


def reproducibility_params() -> dict[str, str]:
    """What reproduces a run: library versions, git commit, command line, host.

    Returns:
        Flat string dict with keys ``version.python``, ``version.torch``,
        ``version.numpy``, ``version.gymnasium``, ``version.stable-baselines3``,
        ``version.mlflow`` (``"not installed"`` when missing), ``git.commit``
        (``"unknown"`` outside a git checkout), ``git.dirty``, ``command`` (``sys.argv``,
        shell-quoted) and ``hostname``.
    """
    out: dict[str, str] = {"version.python": platform.python_version()}
    for dist in ("torch", "numpy", "gymnasium", "stable-baselines3", "mlflow"):
        try:
            out[f"version.{dist}"] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[f"version.{dist}"] = "not installed"
    out["git.commit"] = _git("rev-parse", "HEAD") or "unknown"
    status = _git("status", "--porcelain", "--untracked-files=no")
    out["git.dirty"] = "unknown" if status is None else str(bool(status)).lower()
    out["command"] = shlex.join(sys.argv)
    out["hostname"] = socket.gethostname()
    return out


def _git(*args: str) -> str | None:
    try:
        res = subprocess.run(
            ["git", *args],
            cwd=_REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _is_lock_error(err: BaseException) -> bool:
    text = str(err).lower()
    return "database is locked" in text or "database table is locked" in text


def _is_remote(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


@contextlib.contextmanager
def _http_limits(active: bool) -> Iterator[None]:
    """Apply :data:`HTTP_LIMITS` to MLflow's HTTP client for the duration of a call.

    MLflow reads these limits from the environment at request time and has no
    per-client setting, so remote calls are serialised under a lock and the variables
    the user did not set are set only while they run.
    """
    if not active:
        yield
        return
    with _ENV_LOCK:
        added = [k for k in HTTP_LIMITS if k not in os.environ]
        for k in added:
            os.environ[k] = HTTP_LIMITS[k]
        try:
            yield
        finally:
            for k in added:
                os.environ.pop(k, None)


@contextlib.contextmanager
def _sqlite_init_lock(uri: str, timeout_s: float = 120.0) -> Iterator[None]:
    """Serialise opening a SQLite store across processes (``<db>.lock``, ``flock``).

    Opening a fresh store runs MLflow's schema migrations; two processes migrating the
    same file at once leave it half-migrated for good (``table _alembic_tmp_experiments
    already exists``), which no retry repairs. Holding an exclusive lock while the store
    is opened lets the first process create the schema and the others find it done.
    Other URIs, and platforms without ``fcntl``, take no lock.
    """
    if not uri.startswith("sqlite:///"):
        yield
        return
    try:
        import fcntl
    except ImportError:  # Windows: no flock; concurrent first opens are not protected
        yield
        return
    db = Path(uri[len("sqlite:///") :].split("?", 1)[0])
    if not db.parent.is_dir():
        yield  # let MLflow report the bad path
        return
    with open(str(db) + ".lock", "a") as f:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not lock {db}.lock in {timeout_s:g} s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _probe_server(uri: str, timeout_s: float) -> str | None:
    """``None`` when an MLflow server answers at ``uri``, else the error text."""
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            resp.read(64)
    except urllib.error.HTTPError:
        return None  # something answered over HTTP (auth, proxy): let MLflow decide
    except (OSError, ValueError) as err:
        return f"{type(err).__name__}: {err}"
    return None


class Tracker:
    """Opens MLflow runs in one experiment through an explicit ``MlflowClient``.

    Creating the experiment is race-safe: when several processes create it at once, the
    losers catch MLflow's "already exists" error and read the winner's id. Opening a
    SQLite store holds an exclusive file lock (``<db>.lock``) so that concurrent
    processes never run MLflow's schema migrations on a fresh database at the same time;
    ``database is locked`` errors are retried with back-off.
    For SQLite stores new experiments keep artifacts next to the database
    (``<db dir>/mlartifacts``) rather than in ``./mlruns`` of whatever the working
    directory is.

    If the store cannot be reached (an ``http://`` server that does not answer within
    ``connect_timeout_s``, an unwritable database), the tracker warns once and becomes a
    no-op: :attr:`enabled` is ``False`` and :meth:`start_run` returns loggers that drop
    everything. Training is never stopped by tracking.

    Args:
        tracking_uri: MLflow tracking URI (default: :func:`default_tracking_uri`).
        experiment: experiment name (created when missing).
        connect_timeout_s: how long an HTTP tracking server may take to answer the
            initial health probe, seconds.
        enabled: ``False`` makes a no-op tracker that touches no store (dry runs,
            ``--no-track``).

    Attributes:
        tracking_uri: the resolved URI.
        experiment_id: the experiment id, or ``None`` when disabled.
        client: the ``MlflowClient`` (``None`` when disabled).
        lock_retries: store calls retried because SQLite said ``database is locked``.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "commgym",
        *,
        connect_timeout_s: float = 3.0,
        enabled: bool = True,
    ) -> None:
        self.tracking_uri = tracking_uri if tracking_uri is not None else default_tracking_uri()
        self.experiment = experiment
        self.remote = _is_remote(self.tracking_uri)
        self.client: Any = None
        self.experiment_id: str | None = None
        self.lock_retries = 0
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()
        if not enabled:
            return
        if self.remote:
            err = _probe_server(self.tracking_uri, connect_timeout_s)
            if err is not None:
                self._warn(
                    "connect",
                    f"MLflow tracking server {self.tracking_uri} is unreachable ({err}); "
                    "tracking is disabled for this run, training continues",
                )
                return
        try:
            self._open()
        except Exception as err:  # tracking must never stop training
            self.client = None
            self.experiment_id = None
            self._warn(
                "connect",
                f"cannot open MLflow store {self.tracking_uri} "
                f"({type(err).__name__}: {err}); tracking is disabled, training continues",
            )

    @property
    def enabled(self) -> bool:
        """Whether runs are actually recorded."""
        return self.experiment_id is not None

    def _open(self) -> None:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        last: Exception | None = None
        for attempt in range(LOCK_RETRIES):
            try:
                with _http_limits(self.remote), _sqlite_init_lock(self.tracking_uri):
                    self.client = MlflowClient(tracking_uri=self.tracking_uri)
                    exp = self.client.get_experiment_by_name(self.experiment)
                    if exp is not None:
                        self.experiment_id = exp.experiment_id
                        self._mark_kind(exp.tags)
                        return
                    try:
                        self.experiment_id = self.client.create_experiment(
                            self.experiment,
                            artifact_location=self._artifact_location(),
                            tags=EXPERIMENT_TAGS,
                        )
                        return
                    except MlflowException:
                        # lost the creation race (or the name is taken): re-read below
                        exp = self.client.get_experiment_by_name(self.experiment)
                        if exp is None:
                            raise
                        self.experiment_id = exp.experiment_id
                        return
            except Exception as err:
                # concurrent initialisation of a fresh SQLite store fails in several
                # ways (locked, "table ... already exists", half-migrated schema)
                last = err
                if self.remote or attempt == LOCK_RETRIES - 1:
                    break
                time.sleep(min(1.0, 0.05 * 2**attempt) * (0.5 + random.random()))
        assert last is not None
        raise last

    def _mark_kind(self, tags: Mapping[str, str]) -> None:
        """Tag an experiment created before :data:`EXPERIMENT_TAGS` existed (once)."""
        for key, value in EXPERIMENT_TAGS.items():
            if key not in tags:
                self.client.set_experiment_tag(self.experiment_id, key, value)

    def _artifact_location(self) -> str | None:
        if self.tracking_uri.startswith("sqlite:///"):
            db = Path(self.tracking_uri[len("sqlite:///") :])
            if db.is_absolute() or db.parent != Path():
                return (db.resolve().parent / "mlartifacts").as_uri()
        return None

    def _warn(self, kind: str, message: str) -> None:
        with self._warn_lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    def call(self, kind: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one store call with lock retries; on failure warn once per kind, return None.

        Args:
            kind: short name of the operation (deduplicates warnings).
            fn: the ``MlflowClient`` method.
            *args: its positional arguments.
            **kwargs: its keyword arguments.

        Returns:
            ``fn``'s result, or ``None`` if it failed (after a warning).
        """
        if not self.enabled:
            return None
        for attempt in range(LOCK_RETRIES):
            try:
                with _http_limits(self.remote):
                    return fn(*args, **kwargs)
            except Exception as err:  # logging must never kill training
                if _is_lock_error(err) and attempt < LOCK_RETRIES - 1:
                    self.lock_retries += 1
                    time.sleep(min(1.0, 0.02 * 2**attempt) * (0.5 + random.random()))
                    continue
                self._warn(
                    f"{kind}:{type(err).__name__}",
                    f"MLflow {kind} failed ({type(err).__name__}: {err}); "
                    "continuing without it (further failures of this kind are not reported)",
                )
                return None
        return None  # pragma: no cover - the loop always returns

    def start_run(
        self,
        name: str,
        *,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
        parent_run_id: str | None = None,
    ) -> RunLogger:
        """Create a run (``RUNNING``) and return its logger (a context manager).

        Args:
            name: run name shown in the UI.
            params: logged with :meth:`RunLogger.log_params` (nested dicts flattened).
            tags: extra tags.
            parent_run_id: makes this a nested child run: the ``mlflow.parentRunId`` tag
                is set explicitly (an inherited ``MLFLOW_RUN_ID`` is ignored).

        Returns:
            A :class:`RunLogger`; a no-op one when the tracker is disabled or the run
            could not be created (after a warning).
        """
        all_tags = {
            "mlflow.source.name": sys.argv[0] if sys.argv and sys.argv[0] else "python",
            "mlflow.source.type": "LOCAL",
            "mlflow.user": _user(),
            "mlflow.runName": name,
        }
        all_tags.update(
            {str(k): _truncate(str(v), MAX_TAG_VAL_LENGTH) for k, v in (tags or {}).items()}
        )
        if parent_run_id is not None:
            all_tags["mlflow.parentRunId"] = str(parent_run_id)
        run_id = None
        if self.enabled:
            run = self.call(
                "create_run",
                self.client.create_run,
                self.experiment_id,
                run_name=name,
                tags=all_tags,
            )
            run_id = None if run is None else run.info.run_id
        logger = RunLogger(self, run_id, name)
        if params:
            logger.log_params(params)
        return logger


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return "unknown"


def _truncate(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: limit - 3] + "..."


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
        tracker: the owning :class:`Tracker`.
        run_id: MLflow run id, or ``None`` for a no-op logger.
        name: run name.
        flush_every: buffered metric points that trigger a batch send.
    """

    def __init__(
        self, tracker: Tracker, run_id: str | None, name: str = "", *, flush_every: int = 500
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
        flat = _flatten(params)
        items = []
        for k, v in flat.items():
            s = str(v)
            if len(s) > MAX_PARAM_VAL_LENGTH:
                warnings.warn(
                    f"param {k!r} is {len(s)} characters, truncated to MLflow's limit of "
                    f"{MAX_PARAM_VAL_LENGTH}",
                    stacklevel=2,
                )
                s = _truncate(s, MAX_PARAM_VAL_LENGTH)
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

        items = [RunTag(str(k), _truncate(str(v), MAX_TAG_VAL_LENGTH)) for k, v in tags.items()]
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


class TrackingWrapper(gym.Wrapper):
    """Logs every decision of a ``commgym/AllReduce-v0`` env to a :class:`RunLogger`.

    After each ``step`` it logs, with ``step`` = the running decision count over all
    episodes (1 after the first decision):

    =========================  ==========================================================
    metric                     source
    =========================  ==========================================================
    ``env/reward``             the step's reward
    ``env/train_time_s``       ``info["train_time_s"]`` (training time in the episode, s)
    ``comm/bytes_per_step``    ``measured["bytes_per_step"]`` (B per iteration)
    ``comm/step_time_s``       ``measured["step_time_s"]``
    ``comm/comm_wait_s``       ``measured["comm_wait_s"]``
    ``comm/compress_s``        ``measured["compress_s"]``
    ``comm/compression_error`` ``measured["compression_error"]`` (when not ``None``)
    ``train/loss``             ``measured["train_loss"]``
    ``train/eval_loss``        ``measured["eval_loss"]``
    ``train/eval_acc``         ``measured["eval_acc"]``
    ``train/grad_norm``        ``measured["grad_norm"]``
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

    Args:
        env: the env (``AllReduceEnv`` or anything with the same ``info`` shape).
        run: where to log.
        prefix: prepended to every metric name (``"eval"`` gives ``eval/env/reward``).
        log_decisions: log the per-decision metrics above (``False``: learning curve only).
    """

    def __init__(
        self, env: gym.Env, run: RunLogger, prefix: str = "", *, log_decisions: bool = True
    ) -> None:
        super().__init__(env)
        self.run = run
        self.log_decisions = bool(log_decisions)
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.rows: list[dict[str, Any]] = []
        self.decisions = 0
        self.episodes = 0
        self._ep_return = 0.0
        self._ep_length = 0
        self._closed = False

    def reset(self, **kwargs: Any):  # noqa: D102
        self._ep_return = 0.0
        self._ep_length = 0
        return self.env.reset(**kwargs)

    def step(self, action: Any):  # noqa: D102
        obs, reward, terminated, truncated, info = self.env.step(action)
        try:
            self._record(action, reward, terminated, truncated, info)
        except Exception as err:  # logging must never kill training
            self.run.tracker._warn(
                f"wrapper:{type(err).__name__}",
                f"TrackingWrapper could not record a step ({type(err).__name__}: {err})",
            )
        return obs, reward, terminated, truncated, info

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

    def _record(self, action, reward, terminated, truncated, info) -> None:
        self.decisions += 1
        self._ep_length += 1
        r = _scalar(reward)
        self._ep_return += r if r is not None else 0.0
        m: Mapping[str, Any] = info.get("measured") or {}
        act: Mapping[str, Any] = info.get("action") or {}
        comp_idx = self._menu_index(action, info)
        metrics = {
            "env/reward": r,
            "env/train_time_s": _scalar(info.get("train_time_s")),
            "comm/bytes_per_step": _scalar(m.get("bytes_per_step")),
            "comm/step_time_s": _scalar(m.get("step_time_s")),
            "comm/comm_wait_s": _scalar(m.get("comm_wait_s")),
            "comm/compress_s": _scalar(m.get("compress_s")),
            "comm/compression_error": _scalar(m.get("compression_error")),
            "train/loss": _scalar(m.get("train_loss")),
            "train/eval_loss": _scalar(m.get("eval_loss")),
            "train/eval_acc": _scalar(m.get("eval_acc")),
            "train/grad_norm": _scalar(m.get("grad_norm")),
            "action/compression": comp_idx,
            "action/bucket_mb": _scalar(act.get("bucket_mb")),
            "action/sync_period": _scalar(act.get("sync_period")),
        }
        if self.log_decisions:
            self.run.log_metrics(
                {self.prefix + k: v for k, v in metrics.items()}, step=self.decisions
            )

        idx = _action_indices(action)
        row: dict[str, Any] = {
            "decision": self.decisions,
            "episode": self.episodes,
            "episode_decision": info.get("decision", self._ep_length),
            "train_time_s": info.get("train_time_s"),
            "reward": reward,
            "action": " ".join(map(str, idx)) if idx is not None else str(action),
            "config": info.get("config"),
            "compression": act.get("compression"),
            "compression_index": comp_idx,
            "bucket_mb": act.get("bucket_mb"),
            "sync_period": act.get("sync_period"),
        }
        for k, v in m.items():
            key = f"decision_{k}" if k == "train_time_s" else k
            row[key] = v if not isinstance(v, list | tuple) else " ".join(map(str, v))
        row["terminated"] = bool(terminated)
        row["truncated"] = bool(truncated)
        row["reason"] = info.get("reason")
        if "failure" in info:
            row["failure"] = info["failure"]
        self.rows.append(row)

        if terminated or truncated:
            self.run.log_metrics(
                {
                    self.prefix + "episode/return": self._ep_return,
                    self.prefix + "episode/length": self._ep_length,
                },
                step=self.episodes if self.log_decisions else self.decisions,
            )
            self.episodes += 1
            self._ep_return = 0.0
            self._ep_length = 0

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
                self.run.tracker._warn(
                    f"wrapper-close:{type(err).__name__}",
                    f"TrackingWrapper could not save decisions.csv ({type(err).__name__}: {err})",
                )
        super().close()
