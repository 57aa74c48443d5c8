r"""Launch worker ranks with torchrun and drive them over an authenticated control plane.

The environment process owns a :class:`multiprocessing.connection.Listener` bound to a
port the OS picks (port 0, so several environments on one host never race for a port)
and authenticated with a random per-cluster key (HMAC challenge, stdlib). Ranks are
started by ``torchrun`` as ordinary subprocesses in their own session (so the whole
tree can be killed at once) and each rank connects back, says hello, receives the
cluster's :class:`LaunchConfig` (the one route by which settings reach a rank: backend,
timeouts, threads, workload), initialises ``torch.distributed`` from it and then executes
commands (see :mod:`commgym.env.worker`). Only the key and the listener's address are
given at launch, because a rank needs them to reach the listener at all.

Ranks started by the user elsewhere join the same way: run on every node::

    COMMGYM_AUTHKEY=<hex key> torchrun --nnodes N --nproc-per-node P \\
        --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        -m commgym.env.worker --control ENV_HOST:ENV_PORT

with ``Cluster(..., launch=False, control_host="0.0.0.0")`` on the environment side
(``cluster.control_address`` and ``cluster.authkey_hex`` give the values to use).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import asdict, dataclass, fields
from multiprocessing.connection import Connection, Listener, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from commgym.collectives.checks import check_int
from commgym.collectives.errors import CollectiveTimeout, CommgymError, WorkerFailed
from commgym.env.launcher import ForkedAgent, pid_runs, start_agent

if TYPE_CHECKING:  # pragma: no cover
    from commgym.env.net import EmulatedNetwork

__all__ = ["Cluster", "LaunchConfig", "scratch_dir"]

#: c10d rendezvous port inside rank 0's private network namespace (no other user).
_RDZV_PORT = 29400

_LIVE: weakref.WeakSet[Cluster] = weakref.WeakSet()


def scratch_dir(kind: str) -> Path:
    """A new private temp folder ``commgym-<kind>-<pid>-XXXXXXXX``; stale ones removed first.

    The process that makes a folder removes it when done, but one killed with SIGKILL (a
    Ray actor whose node or driver is lost, a driver killed from a shell) cannot; the next
    call of the same kind on this machine removes every ``commgym-<kind>-<pid>-*`` folder
    whose ``pid`` no longer runs. A folder whose pid runs (the owner, or a process that
    reused its number) is left alone.

    Args:
        kind: what the folder is for (``cluster``: a launch's log and torchrun's temp
            files; ``record``: a recording stream's files).

    Returns:
        The new folder (mode 0700, in :func:`tempfile.gettempdir`).
    """
    root = Path(tempfile.gettempdir())
    prefix = f"commgym-{kind}-"
    for old in root.glob(f"{prefix}*-*"):
        pid = old.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not pid_runs(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root))


@atexit.register
def _kill_all_at_exit() -> None:  # pragma: no cover - interpreter shutdown
    for cluster in list(_LIVE):
        cluster.kill()


#: Characters of the launcher log kept in memory once its file is removed.
_LOG_KEEP_CHARS = 20_000


@dataclass(frozen=True)
class LaunchConfig:
    """Settings every rank receives once, after its hello and before ``init_process_group``.

    The cluster sends it as the ``launch`` message (:meth:`to_message`); the rank rebuilds
    it with :meth:`from_message`. Per-episode and per-decision commands then carry only
    what changes (seed, communication configuration, iteration count). Field names are
    those of :class:`~commgym.env.EnvConfig`, which builds its own with
    :meth:`~commgym.env.EnvConfig.launch_config`.

    Attributes:
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank, ``LOCAL_RANK``).
        timeout_s: collective timeout of the process group, seconds; also the default
            deadline of every command on the environment side.
        threads_per_rank: ``torch.set_num_threads`` in each rank.
        workload_modules: modules every rank imports first (where custom workloads are
            registered).
        workload: workload the ``reset`` command builds (``None``: the cluster only runs
            the benchmark commands).
        batch_size: per-rank batch size (``None``: the workload's default).
        lr: learning rate (``None``: the workload's default).
        shards: how the training set is split over ranks: ``"iid"`` (a seeded random
            permutation dealt round-robin) or ``"label-skew"`` / ``"label-skew:<f>"``
            (non-IID: samples sorted by label into ``world_size`` blocks; each sample goes
            to its block's rank with probability ``f``, default 1, else to a uniformly
            random rank), see :func:`commgym.env.workloads.shard_indices`.

    Raises:
        ValueError: bad ``backend``, ``timeout_s``, ``threads_per_rank``, ``batch_size``
            or ``lr``.
    """

    backend: str = "gloo"
    timeout_s: float = 120.0
    threads_per_rank: int = 1
    workload_modules: tuple[str, ...] = ()
    workload: str | None = None
    batch_size: int | None = None
    lr: float | None = None
    shards: str = "iid"

    def __post_init__(self) -> None:
        from commgym.env.workloads.shards import parse_shards

        parse_shards(self.shards)  # raises with the valid forms
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {self.backend!r}")
        if isinstance(self.timeout_s, bool) or not (
            isinstance(self.timeout_s, int | float) and self.timeout_s > 0
        ):
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        for name in ("threads_per_rank", "batch_size"):
            v = getattr(self, name)
            if v is None and name == "batch_size":
                continue
            check_int(name, v, 1)
        if self.lr is not None and not (isinstance(self.lr, int | float) and self.lr > 0):
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        object.__setattr__(self, "timeout_s", float(self.timeout_s))
        object.__setattr__(self, "workload_modules", tuple(self.workload_modules))

    def to_message(self) -> dict[str, Any]:
        """The ``launch`` command: ``{"cmd": "launch", "config": {field: value}}``."""
        return {"cmd": "launch", "config": asdict(self)}

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> LaunchConfig:
        """Inverse of :meth:`to_message`.

        Raises:
            ValueError: ``msg`` is not a ``launch`` command, or holds unknown fields.
        """
        if not isinstance(msg, dict) or msg.get("cmd") != "launch":
            raise ValueError(f"expected the launch command first, got {msg!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(msg["config"]) - known)
        if unknown:
            raise ValueError(f"unknown launch fields {unknown}; valid: {sorted(known)}")
        return cls(**msg["config"])


class Cluster:
    """A set of ``world_size`` worker ranks launched with torchrun.

    Args:
        world_size: number of ranks (>= 1).
        config: what every rank receives before it joins the process group (backend,
            timeout, threads, workload); ``config.timeout_s`` is also the default deadline
            of every command. Default: ``LaunchConfig()`` (gloo, 120 s, 1 thread).
        launch: start ranks locally with ``torchrun --standalone``; with False, ranks
            are expected to be started by the user (see the module docstring).
        control_host: address the control listener binds to (loopback by default).
        start_timeout_s: deadline for all ranks to connect.
        extra_env: environment variables added for the ranks.
        network: an :class:`~commgym.env.net.EmulatedNetwork`: rank ``k`` runs in the
            network namespace ``k`` as its own torchrun agent (``--nnodes W --node-rank
            k``, c10d rendezvous at rank 0's address), i.e. the multi-node code path over
            shaped links; the control listener binds to the bridge address.
        fork_ranks: an agent on this machine forks its ranks from a process that imported
            the worker (:mod:`commgym.env.launcher`; each rank's ``hello`` says ``forked``);
            False starts every rank as a fresh interpreter.

    Raises:
        ValueError: bad ``world_size``, or ``config`` is not a :class:`LaunchConfig`.
    """

    def __init__(
        self,
        world_size: int,
        config: LaunchConfig | None = None,
        *,
        launch: bool = True,
        control_host: str = "127.0.0.1",
        start_timeout_s: float = 180.0,
        extra_env: dict[str, str] | None = None,
        network: EmulatedNetwork | None = None,
        fork_ranks: bool = True,
    ) -> None:
        check_int("world_size", world_size, 1)
        config = LaunchConfig() if config is None else config
        if not isinstance(config, LaunchConfig):
            raise ValueError(f"config must be a LaunchConfig, got {config!r}")
        self.world_size = world_size
        self.config = config
        self.launch = launch
        self.control_host = control_host
        self.start_timeout_s = float(start_timeout_s)
        self.extra_env = dict(extra_env or {})
        self.network = network
        self.fork_ranks = bool(fork_ranks)
        if network is not None:
            if network.world_size != world_size:
                raise ValueError(
                    f"network has {network.world_size} namespaces, world_size is {world_size}"
                )
            self.control_host = network.bridge_address
        self._authkey = secrets.token_bytes(32)
        self._listener: Listener | None = None
        self._procs: list[subprocess.Popen[bytes] | ForkedAgent] = []
        self._conns: list[Connection] = []
        self.hello: list[dict[str, Any]] = []
        self._log_path: Path | None = None
        self._scratch: Path | None = None
        self._last_log = ""
        self._alive = False
        #: argv of the (first) torchrun launcher started here; empty before :meth:`start`
        #: or when the user starts the ranks
        self.launch_command: list[str] = []
        #: how the (last) agent started: ``"forked"`` from commgym's launcher process or
        #: ``"popen"`` (the fallback where the launcher cannot start); see
        #: :mod:`commgym.env.launcher`
        self.launched_by = ""

    # -- lifecycle ------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """True while ranks are connected and the launcher (if any) is running."""
        if not self._alive:
            return False
        return all(p.poll() is None for p in self._procs)

    @property
    def timeout_s(self) -> float:
        """Default deadline of every command, seconds (``config.timeout_s``)."""
        return self.config.timeout_s

    @property
    def control_address(self) -> tuple[str, int]:
        """``(host, port)`` of the control listener (after :meth:`start`)."""
        if self._listener is None:
            raise RuntimeError("cluster not started")
        return self._listener.address  # type: ignore[return-value]

    @property
    def authkey_hex(self) -> str:
        """The control plane's key, for ranks started by the user (keep it secret)."""
        return self._authkey.hex()

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks (from their hello messages)."""
        return [int(h["pid"]) for h in self.hello]

    def start(self) -> list[dict[str, Any]]:
        """Open the listener, launch the ranks, wait for all of them, send the config.

        Every rank connects and says hello (rank, pid, host); then each receives
        :attr:`config` as the ``launch`` message, joins the process group with it and
        answers ``ready`` with what it applied (backend, device, threads, timeout).

        Returns:
            Per rank, ordered by rank, its hello merged with its ``ready`` reply.

        Raises:
            WorkerFailed: the launcher exited, ranks did not connect or get ready within
                ``start_timeout_s``, or a rank failed to apply the config (all processes
                are killed first).
        """
        if self._alive:
            return self.hello
        self.kill()
        self._listener = Listener((self.control_host, 0), authkey=self._authkey)
        host, port = self._listener.address
        _LIVE.add(self)
        if self.launch:
            # one scratch folder per launch: the launcher log and torchrun's own temp files
            # (TMPDIR), removed on kill() (or, if this process is SIGKILLed, by the next)
            self._scratch = scratch_dir("cluster")
            log = self._scratch / "torchrun.log"
            self._log_path = log
            env = dict(os.environ)
            env.update(self.extra_env)
            launch_vars = {  # commgym.env.launcher.LAUNCH_KEYS
                "TMPDIR": str(self._scratch),
                "COMMGYM_AUTHKEY": self._authkey.hex(),
                # read by the OpenMP runtime when a fresh rank starts, before any message
                # (a forked one has it applied by torch.set_num_threads at the launch message)
                "OMP_NUM_THREADS": str(self.config.threads_per_rank),
            }
            env.update(launch_vars)
            worker = ["-m", "commgym.env.worker", "--control", f"{host}:{port}"]
            if self.network is None:
                cmd = [
                    sys.executable, "-m", "torch.distributed.run",
                    "--standalone", "--nproc-per-node", str(self.world_size),
                    "--max-restarts", "0", "--monitor-interval", "0.2", *worker,
                ]  # fmt: skip
                launches = [(cmd, env)]
            else:
                launches = self.network.torchrun_commands(worker, env, rdzv_port=_RDZV_PORT)
            self.launch_command = list(launches[0][0])
            log.touch()
            for cmd, env_k in launches:
                # each agent (local or in a namespace) is forked from a process that imported
                # torchrun once (commgym.env.launcher: one torch import less per agent)
                proc, self.launched_by = start_agent(
                    cmd, env_k, str(log), fork_ranks=self.fork_ranks
                )
                self._procs.append(proc)
        conns: list[Connection] = []
        err: list[BaseException] = []

        def accept() -> None:
            try:
                while len(conns) < self.world_size:
                    conns.append(self._listener.accept())  # type: ignore[union-attr]
            except BaseException as e:
                err.append(e)

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        deadline = time.monotonic() + self.start_timeout_s
        while t.is_alive() and time.monotonic() < deadline:
            t.join(0.2)
            if any(p.poll() is not None for p in self._procs):
                break
        if t.is_alive() or err or len(conns) < self.world_size:
            exited = [p.returncode for p in self._procs if p.poll() is not None]
            why = (
                f"launcher exited with code {exited[0]}"
                if exited
                else f"only {len(conns)}/{self.world_size} ranks connected within "
                f"{self.start_timeout_s:.0f} s"
            )
            for c in conns:
                c.close()
            self.kill()
            raise WorkerFailed(f"cluster start failed: {why}{self._log_tail()}")
        hello: list[dict[str, Any] | None] = [None] * self.world_size
        by_rank: list[Connection | None] = [None] * self.world_size
        for c in conns:
            if not c.poll(self.start_timeout_s):
                self.kill()
                raise WorkerFailed(f"a rank connected but sent no hello{self._log_tail()}")
            msg = c.recv()
            rank = int(msg["rank"])
            if not (0 <= rank < self.world_size) or by_rank[rank] is not None:
                self.kill()
                raise WorkerFailed(f"unexpected hello {msg!r} for world size {self.world_size}")
            hello[rank] = msg
            by_rank[rank] = c
        self._conns = [c for c in by_rank if c is not None]
        self.hello = [h for h in hello if h is not None]
        self._alive = True
        try:
            ready = self.command(self.config.to_message(), timeout_s=self.start_timeout_s)
        except CommgymError as err:  # the cluster is already killed
            raise WorkerFailed(f"cluster start failed: {err}") from None
        self.hello = [{**h, **r} for h, r in zip(self.hello, ready, strict=True)]
        return self.hello

    def command(self, msg: dict[str, Any], timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Send ``msg`` to every rank and collect one reply per rank.

        Args:
            msg: a picklable dict with a ``"cmd"`` key (see :mod:`commgym.env.worker`).
            timeout_s: deadline for all replies (default: the cluster's ``timeout_s``).

        Returns:
            Replies ordered by rank.

        Raises:
            CollectiveTimeout: not every rank replied in time (the cluster is killed).
            WorkerFailed: a rank died, its launcher exited, or it replied with an error
                (the cluster is killed).
        """
        if not self.alive:
            raise WorkerFailed("cluster is not running (it failed earlier or was closed)")
        timeout = self.config.timeout_s if timeout_s is None else float(timeout_s)
        try:
            for c in self._conns:
                c.send(msg)
        except (OSError, EOFError) as e:
            self.kill()
            raise WorkerFailed(
                f"could not send {msg.get('cmd')!r} to a rank: {e}{self._log_tail()}"
            ) from None
        replies: dict[int, dict[str, Any]] = {}
        pending = {c: r for r, c in enumerate(self._conns)}
        deadline = time.monotonic() + timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                ranks = sorted(pending.values())
                self.kill()
                raise CollectiveTimeout(
                    f"ranks {ranks} did not answer {msg.get('cmd')!r} within {timeout:.1f} s "
                    f"(timeout_s); the cluster was killed{self._log_tail()}"
                )
            for c in wait(list(pending), timeout=min(left, 0.5)):
                rank = pending.pop(c)  # type: ignore[index]
                try:
                    reply = c.recv()  # type: ignore[union-attr]
                except (EOFError, OSError):
                    self.kill()
                    raise WorkerFailed(
                        f"rank {rank} died during {msg.get('cmd')!r} (connection closed)"
                        f"{self._log_tail()}"
                    ) from None
                if reply.get("type") == "error":
                    self.kill()
                    raise WorkerFailed(
                        f"rank {rank} failed in {msg.get('cmd')!r}:\n{reply.get('traceback')}"
                    )
                replies[rank] = reply
            exited = [p.returncode for p in self._procs if p.poll() is not None]
            if exited and pending:
                ranks = sorted(pending.values())
                code = exited[0]
                self.kill()
                raise WorkerFailed(
                    f"torchrun exited with code {code} while ranks {ranks} were running "
                    f"{msg.get('cmd')!r}{self._log_tail()}"
                )
        return [replies[r] for r in range(self.world_size)]

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask ranks to exit, then make sure nothing is left (safe to call twice).

        Every rank answers ``close`` once its process group is destroyed (nothing of it is
        left to tear down gracefully); then, or after ``timeout_s`` without an answer, the
        ranks' process tree is ended (:meth:`kill`). Waiting for the ranks' interpreters
        and torchrun's agent to exit on their own took 0.8-1.0 s a launch.
        """
        if self._alive:
            with contextlib.suppress(Exception):
                for c in self._conns:
                    c.send({"cmd": "close"})
                pending = list(self._conns)
                deadline = time.monotonic() + timeout_s
                while pending and (left := deadline - time.monotonic()) > 0:
                    for c in wait(pending, timeout=left):
                        pending.remove(c)  # type: ignore[arg-type]
                        with contextlib.suppress(EOFError, OSError):
                            c.recv()  # type: ignore[union-attr]
        self.kill()

    def kill(self) -> None:
        """Kill the ranks' whole process tree and release the listener (idempotent)."""
        self._alive = False
        for c in self._conns:
            with contextlib.suppress(Exception):
                c.close()
        self._conns = []
        procs, self._procs = self._procs, []
        for proc in procs:
            # Failure path: nothing in the ranks is worth a graceful shutdown (a hung or
            # stopped rank would ignore SIGTERM), so the whole session goes at once.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        if self.launch:  # ranks the user started elsewhere are not ours to kill
            for pid in self.pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self.hello = []
        if self._listener is not None:
            with contextlib.suppress(Exception):
                self._listener.close()
            self._listener = None
        if self._log_path is not None:
            # keep the end of the log in memory (failure messages quote it), drop the files
            with contextlib.suppress(OSError):
                self._last_log = self._log_path.read_text(errors="replace")[-_LOG_KEEP_CHARS:]
            self._log_path = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        _LIVE.discard(self)

    def log_text(self) -> str:
        """The launcher's combined stdout/stderr so far ('' when not launched here).

        After :meth:`kill` (the log file is removed then) the last 20,000 characters.
        """
        if self._log_path is None or not self._log_path.exists():
            return self._last_log
        return self._log_path.read_text(errors="replace")

    def _log_tail(self, n: int = 2000) -> str:
        text = self.log_text()
        return f"\n--- torchrun log (tail) ---\n{text[-n:]}" if text.strip() else ""

    def __del__(self) -> None:  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            self.kill()
