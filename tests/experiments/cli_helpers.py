"""Run the ``commgym`` CLI in a subprocess, isolated from inherited MLflow settings."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time

from commgym.env.launcher import RANK_COMM


def cli(args: list[str], cwd, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m commgym.experiments.cli *args`` in ``cwd``; never inherits an MLflow run."""
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("MLFLOW_RUN_ID", None)
    return subprocess.run(
        [sys.executable, "-m", "commgym.experiments.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


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
