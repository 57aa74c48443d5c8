"""Run the ``commgym`` CLI as a process of its own, isolated from inherited MLflow settings.

A command's process is forked from one server that imported commgym, torch, MLflow and
stable-baselines3 once (Python's ``forkserver``, :func:`console_script_context`), instead of
paying those imports (2.5-5 s of CPU) in every command the suite runs; the process still
gets its own argv, working folder, environment, output and exit status, and ends as an
interpreter does (non-daemon threads joined, ``atexit`` handlers run). Where a command's
environment differs from the server's in a variable read at interpreter start or import
(:func:`commgym.env.launcher.import_env`, e.g. ``TRITON_INTERPRET``), it runs in a fresh
interpreter instead, as it does where a test needs the process itself (signals, its tree).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from commgym.env.launcher import RANK_COMM, import_env

#: The module behind the ``commgym`` console script (``python -m`` runs it too).
MODULE = "commgym.experiments.cli"

#: What a ``commgym`` process imports before its command runs (preloaded once, see
#: :func:`console_script_context`).
PRELOAD = (
    "commgym.experiments.cli",
    "commgym.experiments.train",
    "commgym.experiments.leaderboard",
    "commgym.experiments.replay",
    "commgym.experiments.collect",
    "commgym.env.surrogate",
    "mlflow",
    "tests.experiments.cli_helpers",
)

#: The server this module started: ``"pid"`` and ``"env"`` (its environment when it started,
#: what its imports read); empty before.
_SERVER: dict[str, Any] = {}


def console_script_context() -> Any:
    """A multiprocessing context whose processes fork from one server that imported commgym.

    Python's ``forkserver``: a pristine interpreter started once (with this process's
    environment and ``sys.path``) that imported :data:`PRELOAD` and runs no thread; each
    process is a fork of it. The server is started here, so that its environment is known
    (:func:`forked_like_fresh`).

    The forkserver is one per process: a server another library started first imported
    nothing of ours (stable-baselines3's ``SubprocVecEnv`` starts it with the default
    preload, ``__main__`` only; in a full run every command then paid its imports, found
    from the process table). Such a server is stopped, and ours started, here.
    """
    import multiprocessing
    from multiprocessing import forkserver

    ctx = multiprocessing.get_context("forkserver")
    server = forkserver._forkserver  # the process's one server (no public handle)
    if _SERVER.get("pid") is None or server._forkserver_pid != _SERVER["pid"]:
        # not ours (another library's, or none): the children it forked live on without it
        server._stop()
        ctx.set_forkserver_preload(list(PRELOAD))
        forkserver.ensure_running()
        _SERVER.update(pid=server._forkserver_pid, env=dict(os.environ))
    return ctx


def forked_like_fresh(env: dict[str, str]) -> bool:
    """Whether a process forked from the server in ``env`` is what a fresh one would be:
    the server's environment and ``env`` agree in every variable an import reads."""
    return "env" in _SERVER and import_env(_SERVER["env"]) == import_env(env)


def _become(cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """This forked process takes the folder, environment and output files of a command."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for path, fd in ((out, 1), (err, 2)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(f, fd)
        os.close(f)


def _end_as_interpreter(run) -> None:
    """Run ``run()``, then end as an interpreter does: its exit status from ``SystemExit``,
    non-daemon threads joined, ``atexit`` handlers run (a forked process otherwise leaves
    them out; MLflow and commgym register some)."""
    import atexit

    code: Any = 0
    try:
        run()
    except SystemExit as e:
        code = e.code
    finally:
        threading._shutdown()  # what Py_FinalizeEx does before the atexit handlers
        atexit._run_exitfuncs()
    raise SystemExit(code)


def run_console_script(words: list[str], cwd: str, env: dict[str, str], log: str) -> None:
    """``commgym *words`` as the console script runs it, in a process of its own (forked).

    The target of :func:`console_script_context`'s processes: the working folder, the
    environment and argv of the command, stdout and stderr (file descriptors 1 and 2,
    the ranks' output included) into ``log``, then ``commgym.experiments.cli:main`` (the
    console script's entry point), whose ``SystemExit`` is the process's exit status.
    """
    with open(log, "wb"):  # empty it: stdout and stderr then both append to it
        pass
    _become(cwd, env, log, log)
    sys.argv = ["commgym", *words]
    from commgym.experiments.cli import main

    _end_as_interpreter(main)


def run_module(args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """``python -m commgym.experiments.cli *args`` in a process of its own (forked): the
    module runs as ``__main__`` with argv and ``sys.path[0]`` as ``-m`` sets them."""
    import runpy

    _become(cwd, env, out, err)
    sys.path[0] = cwd
    sys.argv = ["-m", *args]  # runpy puts the module's file first, as -m does
    # -m runs the module's code as __main__ only (a preloaded copy under its own name is
    # what -m would not have: runpy warns on stderr)
    sys.modules.pop(MODULE, None)
    _end_as_interpreter(lambda: runpy.run_module(MODULE, run_name="__main__", alter_sys=True))


def cli(args: list[str], cwd, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m commgym.experiments.cli *args`` in ``cwd``; never inherits an MLflow run.

    Forked from the preloaded server (module docstring), or a fresh interpreter where the
    environment's import-time variables differ from the server's.

    Raises:
        subprocess.TimeoutExpired: it ran past ``timeout_s`` (it is stopped: SIGTERM, then
            SIGKILL), as :func:`subprocess.run` raises.
    """
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("MLFLOW_RUN_ID", None)
    argv = [sys.executable, "-m", MODULE, *args]
    ctx = console_script_context()
    if not forked_like_fresh(env):
        return subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s,
            check=False,
        )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="commgym-cli-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        p = ctx.Process(target=run_module, args=(list(args), str(cwd), env, out, err))
        p.start()
        p.join(timeout_s)
        if p.is_alive():
            p.terminate()
            p.join(30)
            p.kill()
            p.join()
            raise subprocess.TimeoutExpired(argv, timeout_s, _read(out), _read(err))
        return subprocess.CompletedProcess(argv, p.exitcode, _read(out), _read(err))


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def cli_ok(args: list[str], cwd, timeout_s: float = 600) -> str:
    """Like :func:`cli` but asserts exit code 0 and returns stdout."""
    proc = cli(args, cwd, timeout_s)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":  # zombies are gone already, only not yet reaped
                parents[int(entry)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def cmdline(pid: int) -> str:
    """The command line of ``pid``, words joined by spaces ('' once it has gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_rank(pid: int) -> bool:
    """Whether ``pid`` is an environment rank: ``python -u -m commgym.env.worker``, or one its
    torchrun agent forked (named ``commgym-rank``; its command line is the launcher's)."""
    if "commgym.env.worker" in cmdline(pid):
        return True
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == RANK_COMM
    except OSError:
        return False


def ranks_among(pids) -> set[int]:
    """Those of ``pids`` that are environment ranks (:func:`is_rank`)."""
    return {pid for pid in pids if is_rank(pid)}


def namespaces_of(pids) -> set[str]:
    """The named network namespaces (``ip netns``) that the processes ``pids`` run in.

    Read from each process's ``/proc/PID/ns/net`` (a rank forked by its agent shows its
    launcher's environment in ``/proc/PID/environ``, not the launch's).
    """
    by_inode = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/var/run/netns"):
            with contextlib.suppress(OSError):
                by_inode[os.stat(f"/var/run/netns/{name}").st_ino] = name
    found = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            name = by_inode.get(os.stat(f"/proc/{pid}/ns/net").st_ino)
            if name is not None:
                found.add(name)
    return found


def networks_of(pids) -> set[str]:
    """The emulated networks the processes ``pids`` run in (namespaces ``<network>-r<rank>``)."""
    return {name.split("-")[0] for name in namespaces_of(pids)}


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (zombies count as gone)."""
    running = set()
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    running.add(p)
        except OSError:
            pass
    return running


class OutputReader:
    """Collects a process's merged output in a thread; waits for a pattern."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.text = ""
        self._proc = proc
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            self.text += line

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match:
        """The first match of ``pattern`` in the output; kills the process if none comes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = re.search(pattern, self.text)
            if m:
                return m
            if self._proc.poll() is not None:
                self._thread.join(5)
                break
            time.sleep(0.2)
        self._proc.kill()
        raise AssertionError(f"{pattern!r} never appeared; output:\n{self.text[-4000:]}")


def start_cli(
    args: list[str], cwd, program: list[str] | None = None
) -> tuple[subprocess.Popen, OutputReader]:
    """Start ``commgym *args`` in ``cwd`` (stdout and stderr merged), without MLflow settings.

    Args:
        args: the command's arguments.
        cwd: working folder.
        program: what runs ``commgym`` (default: ``python -m commgym.experiments.cli`` of
            this interpreter).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    program = program or [sys.executable, "-m", "commgym.experiments.cli"]
    proc = subprocess.Popen(
        [*program, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, OutputReader(proc)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
