"""The MLflow store: where runs go (:class:`Tracker`) and what reproduces a run.

Also the failure-tolerant plumbing (SQLite lock retries, HTTP limits) every call goes
through.
"""

from __future__ import annotations

import contextlib
import getpass
import importlib.metadata
import os
import platform
import random
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from commgym.experiments.tracking.run import MAX_TAG_VAL_LENGTH, RunLogger, truncate

#: Retries of one store call when SQLite reports ``database is locked``.
LOCK_RETRIES = 12

#: Limits applied to HTTP tracking servers while this module calls them (unless the user
#: set the variables): fail within seconds instead of MLflow's minutes of back-off.
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}

#: Experiment tags: MLflow 3's UI opens an untagged experiment in its GenAI view (traces,
#: prompts); ``custom_model_development`` opens the model-training view (runs, charts).
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}

_ENV_LOCK = threading.RLock()
_REPO_ROOT = Path(__file__).resolve().parents[2]


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


def _is_lock_error(err: BaseException) -> bool:
    text = str(err).lower()
    return "database is locked" in text or "database table is locked" in text


def is_remote(uri: str) -> bool:
    """Whether ``uri`` names a tracking server (``http(s)://``) rather than a local store."""
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


def probe_server(uri: str, timeout_s: float) -> str | None:
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


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return "unknown"


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
        self.remote = is_remote(self.tracking_uri)
        self.client: Any = None
        self.experiment_id: str | None = None
        self.lock_retries = 0
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()
        if not enabled:
            return
        if self.remote:
            err = probe_server(self.tracking_uri, connect_timeout_s)
            if err is not None:
                self.warn(
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
            self.warn(
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

    def warn(self, kind: str, message: str) -> None:
        """Warn (``RuntimeWarning``) once per ``kind`` of problem; logging goes on."""
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
                self.warn(
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
            {str(k): truncate(str(v), MAX_TAG_VAL_LENGTH) for k, v in (tags or {}).items()}
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
