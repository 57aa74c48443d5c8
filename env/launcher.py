"""Start torchrun's agent by forking it from a process that imported torchrun once.

A launch runs torchrun's own agent, ``python -m torch.distributed.run ...`` (on an emulated
network one agent per network namespace, each behind ``ip netns exec``), which then starts
the ranks. A fresh agent interpreter spends 1.4-2.0 s importing torch before it starts its
first rank (measured on 2026-12-07 on this project's 2-core machine: a third of a 2-rank
environment's launch, paid again by every launch and by every namespace's agent).

The launcher is one helper process per driver (started on the first launch, ``python -P
.../launcher.py``) that imports ``torch.distributed.run`` once and forks a fresh agent for
each launch: the same code with the same argv (``torch.distributed.run.main(argv)``), the
same environment, working directory and log file, in a session of its own, as
``subprocess.Popen(..., start_new_session=True)`` would give, and in the named network
namespace as ``ip netns exec`` would put it. Only the import is shared (the pattern of
:mod:`multiprocessing`'s forkserver, which cannot be used here as is: it would re-import the
driver's ``__main__`` in every child, a Ray worker's among them).

What can fail stays visible: a launcher that died is replaced at the next launch; one that
cannot start, or does not answer a launch within :data:`ANSWER_TIMEOUT_S` (it is then killed
and replaced next time), leaves that launch to a plain ``subprocess.Popen`` of the same
command (:func:`start_agent` says which ran); a forked agent's exit status comes back as a
child's would (``returncode``, negative for a signal).

The ranks of an environment's cluster (``-m commgym.env.worker``, under one ``--standalone``
agent or one agent per namespace of an emulated network) are forked too: the launcher also
imports the worker once, and a forked agent runs torchrun's own ``run`` with the worker as a
function entrypoint and torchrun's ``fork`` start method (the path ``torchrun --run-path``
takes with ``spawn``), so each rank starts without its 2.0-2.5 s interpreter and torch import
(nor the 1.2-2.2 s of ``torch._dynamo`` its first optimizer imports: :data:`RANK_IMPORTS`). A
forked rank gets what ``python -u -m commgym.env.worker`` would: torchrun's per-rank
variables over the launch's environment, the launch's working directory first on
``sys.path``, its agent's network namespace, a session of its own, the default signal
dispositions (not the agent's handlers) and line-buffered output; its ``/proc/PID/comm``
reads ``commgym-rank`` (its command line and ``/proc/PID/environ`` are the launcher's). Where
the launch's environment differs from the launcher's own in a variable read at interpreter
start or import (:data:`IMPORT_ENV_PREFIXES`, e.g. ``TRITON_INTERPRET``), what the launcher
imported could differ from what a rank would, so the agent starts its ranks as fresh
interpreters, as it does with ``fork_ranks=False``.

The driver ends its launcher at exit; a driver killed outright closes the launcher's socket,
and the launcher exits on that. Agents it forked run on until their ranks exit, as agents
started with ``Popen`` would, and a Ctrl-C at the terminal reaches the driver only (the
launcher has its own session), which ends its launches itself.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

__all__ = [
    "ForkedAgent",
    "close_launcher",
    "import_env",
    "launcher_pid",
    "pid_runs",
    "start_agent",
]

#: how often the launcher reaps exited agents when no request arrives, seconds
_REAP_EVERY_S = 0.05
#: how long a launch waits for the launcher's answer (its first includes its torch import)
ANSWER_TIMEOUT_S = 120.0
#: where ``ip netns`` keeps its named network namespaces
_NETNS_DIR = Path("/var/run/netns")
#: ``CLONE_NEWNET`` from ``<sched.h>``: ``setns(2)``'s namespace type
_CLONE_NEWNET = 0x40000000
#: the module a forked agent forks as its ranks instead of running it in fresh interpreters
WORKER_MODULE = "commgym.env.worker"
#: what the launcher imports for its forked ranks: the worker, and what every rank's first
#: reset and step import (torch's optimizers import ``torch._dynamo`` at their first param
#: group, 1.2-2.2 s of CPU with what it brings: Triton, SciPy, SymPy; the CPU kernels numba)
RANK_IMPORTS = (WORKER_MODULE, "torch._dynamo", "commgym.collectives.kernels.cpu_kernels")
#: Environment variables read when an interpreter starts or torch, numpy, Triton, numba or
#: a BLAS/OpenMP runtime is imported or loaded (by name prefix): a launch whose values differ
#: from the launcher's own gets fresh ranks (e.g. ``TRITON_INTERPRET=1``)
IMPORT_ENV_PREFIXES = (
    "PYTHON", "LD_", "TORCH", "PYTORCH", "TRITON", "NUMBA", "LLVMLITE", "CUDA", "NPY_", "SCIPY",
    "SYMPY", "MKL", "KMP_", "OMP_", "GOMP", "OPENBLAS", "GOTOBLAS",
)  # fmt: skip
#: Of those, the ones libraries set in a driver after its launcher started, which no import
#: reads: scikit-learn's import sets the two ``KMP_`` ones (``os.environ.setdefault``; they
#: tune Intel's OpenMP runtime, which a forked rank has already loaded or never will: torch's
#: Linux wheels ship GNU OpenMP), torch's inductor its cache folder for its subprocesses (read
#: when it compiles), ``ray.init`` the driver's ``PYTHONBREAKPOINT`` (read when
#: ``breakpoint()`` is called). Without them a driver that imported scikit-learn (Bayesian
#: optimisation, the digits loader), ran an SB3 learner or started Ray would get fresh ranks
#: for the rest of its life.
IMPORT_ENV_EXEMPT = frozenset(
    {"KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK", "TORCHINDUCTOR_CACHE_DIR", "PYTHONBREAKPOINT"}
)
#: The variables a cluster's launch sets for its ranks over the driver's environment: their
#: control key, scratch folder (``TMPDIR``) and thread count (:mod:`commgym.env.cluster`). A
#: rank reads them only after it starts, so ranks forked from a process that imported the
#: worker in another environment still get them.
LAUNCH_KEYS = frozenset({"TMPDIR", "COMMGYM_AUTHKEY", "OMP_NUM_THREADS"})
#: ``/proc/PID/comm`` of a forked rank (15 bytes at most)
RANK_COMM = "commgym-rank"


class ForkedAgent:
    """A torchrun agent forked by the launcher, with the part of ``Popen``'s API a cluster uses.

    Attributes:
        pid: the agent's process id; it leads its own session (``pid`` is its process
            group), as an agent under ``Popen(start_new_session=True)`` does (torchrun starts
            each rank in a session of its own either way).
        returncode: ``None`` while it runs; its exit status after (``-N`` for signal ``N``;
            ``-1`` where the launcher died before reporting it).
    """

    def __init__(self, launcher: _Launcher, pid: int) -> None:
        self._launcher = launcher
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status if the agent has exited, else ``None`` (never blocks)."""
        if self.returncode is None:
            self.returncode = self._launcher.exit_status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the agent to exit and return its status.

        Raises:
            subprocess.TimeoutExpired: it still runs after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["torchrun agent", str(self.pid)], timeout)
            self._launcher.wait_for_exit(0.05)
        return self.returncode  # type: ignore[return-value]


class _Launcher:
    """The driver's side of one launcher process (see the module docstring)."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair()
        self._proc = subprocess.Popen(
            # run as a file (-P: without its folder on sys.path), not as a module of
            # commgym.env, whose package import the launcher does not need
            [sys.executable, "-P", os.path.abspath(__file__), str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C at the terminal is the driver's to handle
        )
        theirs.close()
        # kept for shutdown(): close() alone would not end the connection while the reader
        # thread is blocked in recv() on it, and the launcher would never see it end
        self._sock = mine
        self._conn = Connection(os.dup(mine.fileno()))
        self._pid = os.getpid()
        #: the launcher process's id
        self.pid = self._proc.pid
        self._request = threading.Lock()  # one launch request at a time
        self._cond = threading.Condition()
        self._exits: dict[int, int] = {}
        self._started: list[int | str] = []
        self.dead = False
        threading.Thread(target=self._read, name="commgym-launcher", daemon=True).start()
        # the driver leaves no launcher behind when it exits (on SIGKILL the launcher sees
        # its socket close and exits by itself)
        atexit.register(self.close)

    def close(self) -> None:
        """End the launcher (agents it forked run on, as Popen's would); idempotent."""
        if self._pid != os.getpid():
            return  # a forked copy of the driver: the launcher is its parent's
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        # nothing in the launcher needs a graceful end (it may still be importing torch,
        # and would only see the socket end after that): agents it forked are in their own
        # sessions and are not touched
        self._proc.kill()
        self._proc.wait()

    def _read(self) -> None:
        try:
            while True:
                kind, value = self._conn.recv()
                with self._cond:
                    if kind == "exit":
                        self._exits[value[0]] = value[1]
                    else:  # "started" (a pid) or "failed" (why)
                        self._started.append(value if kind == "started" else str(value))
                    self._cond.notify_all()
        except (EOFError, OSError):
            with self._cond:
                self.dead = True
                self._cond.notify_all()

    def spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        log_path: str,
        netns: str | None,
        fork_ranks: bool = True,
    ) -> ForkedAgent | None:
        """Fork one agent running ``torch.distributed.run.main(argv)``; ``None`` if it cannot."""
        with self._request:
            if self.dead:
                return None
            try:
                self._conn.send(
                    {
                        "argv": argv,
                        "env": env,
                        "cwd": os.getcwd(),
                        "log": log_path,
                        "netns": netns,
                        "fork_ranks": fork_ranks,
                    }
                )
            except (OSError, ValueError):
                return None
            with self._cond:
                # the launcher imports torchrun before it answers the first request
                self._cond.wait_for(lambda: self._started or self.dead, ANSWER_TIMEOUT_S)
                if not self._started:
                    # no answer: a late one would be taken for the next request's, so this
                    # launcher is done (the next launch starts another)
                    self.dead = True
                    with contextlib.suppress(OSError):
                        self._proc.kill()
                    return None
                answer = self._started.pop(0)
        if isinstance(answer, str):
            return None
        return ForkedAgent(self, answer)

    def exit_status(self, pid: int) -> int | None:
        with self._cond:
            if pid in self._exits:
                return self._exits.pop(pid)
            if self.dead and not pid_runs(pid):
                return -1  # the launcher died before it could report this agent's status
            return None

    def wait_for_exit(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait(timeout)

    def usable(self) -> bool:
        return not self.dead and self._pid == os.getpid()


def pid_runs(pid: int) -> bool:
    """Whether process ``pid`` runs (any user's); an exited one not yet reaped does not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


#: this process's launcher (at most one; replaced when it died or this process forked)
_LAUNCHER: list[_Launcher] = []
_LAUNCHER_LOCK = threading.Lock()


def _launcher() -> _Launcher | None:
    """This process's launcher, started if there is none (or it died); ``None`` if it cannot."""
    with _LAUNCHER_LOCK:
        if not _LAUNCHER or not _LAUNCHER[0].usable():
            _LAUNCHER.clear()
            with contextlib.suppress(OSError):
                _LAUNCHER.append(_Launcher())
        return _LAUNCHER[0] if _LAUNCHER else None


def close_launcher() -> None:
    """End this process's launcher; the next launch starts another, in the environment then.

    Agents it forked run on, as under Popen; the status of one still running when it ends is
    reported as ``-1``. A driver whose environment changed in a variable read at import since
    its launcher started (its agents then start fresh ranks) gets forked ranks again.
    """
    with _LAUNCHER_LOCK:
        if _LAUNCHER:
            _LAUNCHER.pop().close()


def launcher_pid() -> int | None:
    """The process id of this process's launcher, or ``None`` before the first launch."""
    with _LAUNCHER_LOCK:
        return _LAUNCHER[0].pid if _LAUNCHER and _LAUNCHER[0].usable() else None


def start_agent(
    cmd: list[str], env: dict[str, str], log_path: str, *, fork_ranks: bool = True
) -> tuple[ForkedAgent | subprocess.Popen[bytes], str]:
    """Start ``cmd`` (``python -m torch.distributed.run ...``) in a session of its own.

    Args:
        cmd: the agent's full command line; forked from the launcher when it is
            ``[sys.executable, "-m", "torch.distributed.run", *argv]``, or that behind
            ``ip netns exec NAME`` (the child then joins the network namespace ``NAME`` as
            ``ip netns exec`` does, ``setns(2)``), else run with Popen.
        env: its whole environment.
        log_path: file that receives its stdout and stderr (appended to).
        fork_ranks: let a forked agent fork its ``-m commgym.env.worker`` ranks (module
            docstring); False starts them as fresh interpreters.

    Returns:
        ``(process, how)``: a :class:`ForkedAgent` or a ``subprocess.Popen``, and
        ``"forked"`` or ``"popen"``.
    """
    netns = None
    if cmd[:3] == ["ip", "netns", "exec"] and len(cmd) > 3:
        netns, cmd_in_ns = cmd[3], cmd[4:]
    else:
        cmd_in_ns = cmd
    prefix = [sys.executable, "-m", "torch.distributed.run"]
    known_ns = netns is None or _NETNS_DIR.joinpath(netns).exists()
    if cmd_in_ns[: len(prefix)] == prefix and known_ns:
        launcher = _launcher()
        if launcher is not None:
            agent = launcher.spawn(cmd_in_ns[len(prefix) :], env, log_path, netns, fork_ranks)
            if agent is not None:
                return agent, "forked"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc, "popen"


# -- the launcher process -------------------------------------------------------------


def _agent(request: dict[str, Any], keep: list[int]) -> None:
    """In the forked child: become the agent ``python -m torch.distributed.run`` would be."""
    code = 1
    try:
        os.setsid()  # its own session, as Popen(start_new_session=True) gives
        for fd in keep:
            os.close(fd)  # the parent waits for this (setsid done) before it answers
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 1)  # from here on what goes wrong is in the launch's log
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        if request["netns"] is not None:
            _join_netns(request["netns"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile

        tempfile.tempdir = None  # TMPDIR is this launch's; the launcher's may be cached
        sys.argv = ["torch.distributed.run", *request["argv"]]
        import torch.distributed.run as torchrun

        if request.get("fork_ranks", True) and _forks_ranks(request["env"]):
            _fork_ranks(torchrun)
        torchrun.main(request["argv"])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _forks_ranks(env: dict[str, str]) -> bool:
    """Whether ranks forked from this process would start as fresh ones in ``env`` would.

    The launcher imported the worker with its own environment; a launch whose environment
    differs from it in a variable that the interpreter's start or an import reads
    (:data:`IMPORT_ENV_PREFIXES`; :data:`LAUNCH_KEYS` aside, which a rank reads
    after it starts) gets fresh interpreters. Other differences (``PYTEST_CURRENT_TEST``, a
    tag) reach a forked rank as they would a fresh one: torchrun sets its environment.
    """
    if not _START_ENV or WORKER_MODULE not in sys.modules:
        return False
    return import_env(_START_ENV) == import_env(env)


def import_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that an interpreter's start or an import may read.

    Those named by :data:`IMPORT_ENV_PREFIXES`, less :data:`IMPORT_ENV_EXEMPT` and the
    :data:`LAUNCH_KEYS` (a rank reads them after it starts). Two processes whose
    ``import_env`` agree import the same way: a fork of one is what a fresh interpreter in
    the other's environment would be.
    """
    return {
        k: v
        for k, v in env.items()
        if k.startswith(IMPORT_ENV_PREFIXES) and k not in LAUNCH_KEYS and k not in IMPORT_ENV_EXEMPT
    }


def _fork_ranks(torchrun: Any) -> None:
    """Make this agent's ``torchrun.run`` fork ``-m commgym.env.worker`` ranks (module doc).

    torchrun's ``run`` builds its launch from ``config_from_args``: for a worker started as
    ``python -u -m commgym.env.worker ARGS`` the entrypoint becomes :func:`_rank` with ``ARGS``
    and the start method ``fork``; any other entrypoint is left as torchrun made it.
    """
    from_args = torchrun.config_from_args

    def config_from_args(args: Any) -> tuple[Any, Any, list[Any]]:
        config, cmd, cmd_args = from_args(args)
        if cmd == sys.executable and list(cmd_args[:3]) == ["-u", "-m", WORKER_MODULE]:
            config.start_method = "fork"
            return config, _rank, list(cmd_args[3:])
        return config, cmd, cmd_args

    torchrun.config_from_args = config_from_args


def _rank(*argv: str) -> None:
    """A forked rank: run ``python -u -m commgym.env.worker *argv`` without the interpreter start.

    Runs in torchrun's worker process (its ``fork`` start method), whose environment torchrun
    has set for this rank.
    """
    os.setsid()  # torchrun's Popen starts each rank in a session of its own
    # the agent's handlers (they raise torchrun's SignalException) are not a rank's
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(Exception):  # the name ps and top show; its cmdline is ours
        import ctypes

        ctypes.CDLL(None).prctl(15, RANK_COMM.encode(), 0, 0, 0)  # PR_SET_NAME
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.reconfigure(line_buffering=True)  # -u: a rank's lines reach the log
    if not os.environ.get("PYTHONSAFEPATH"):
        sys.path.insert(0, os.getcwd())  # -m: the working directory first
    worker = sys.modules[WORKER_MODULE]
    sys.argv = [str(worker.__file__), *argv]
    worker.FORKED = True
    code = worker.main(list(argv))
    if code:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)  # a rank's exit status, as under Popen (a returned value is not one)


def _join_netns(name: str) -> None:
    """Move this process into the named network namespace, as ``ip netns exec`` does.

    ``ip netns exec`` also gives the command a mount namespace with ``/sys`` remounted and
    ``/etc/netns/NAME`` bound over ``/etc``; an agent and its ranks read neither (gloo finds
    its interface with ``getifaddrs``, over netlink, which is per network namespace).
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(_NETNS_DIR / name, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name!r}: {os.strerror(err)}")
    finally:
        os.close(fd)


#: the launcher's environment when it imported the worker (empty outside the launcher)
_START_ENV: dict[str, str] = {}


def _serve(fd: int) -> int:
    """The launcher's loop: fork an agent per request, report each agent's exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch.distributed.run  # noqa: F401 - the import every forked agent shares

    _START_ENV.update(os.environ)
    # the imports every forked rank shares (where commgym cannot be imported here, ranks
    # start as fresh interpreters and fail there, with their traceback in the launch log)
    with contextlib.suppress(Exception):
        for module in RANK_IMPORTS:
            importlib.import_module(module)

    conn = Connection(fd)
    children: set[int] = set()
    while True:
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                with contextlib.suppress(OSError):
                    conn.send(("exit", (pid, os.waitstatus_to_exitcode(status))))
        if not wait([conn], timeout=_REAP_EVERY_S):
            continue
        try:
            request = conn.recv()
        except (EOFError, OSError):
            # the driver is gone or closed us: nothing here needs a graceful shutdown (an
            # interpreter that imported torch takes a while to tear down)
            os._exit(0)
        try:
            ready_r, ready_w = os.pipe()
            pid = os.fork()
        except OSError as e:
            conn.send(("failed", f"fork: {e}"))
            continue
        if pid == 0:
            os.close(ready_r)
            conn.close()
            _agent(request, [ready_w])
        os.close(ready_w)
        os.read(ready_r, 1)  # EOF once the child is in its own session (a kill reaches it)
        os.close(ready_r)
        children.add(pid)
        conn.send(("started", pid))


if __name__ == "__main__":
    sys.exit(_serve(int(sys.argv[1])))
