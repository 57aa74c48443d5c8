"""SIGTERM to a running ``commgym`` command cleans up exactly as Ctrl-C does."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from mlflow import MlflowClient

from commgym.env.net import netem_available


def _children(pid: int) -> set[int]:
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


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(p)
        except OSError:
            pass
    return alive


class _Reader:
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


def _start(args: list[str], cwd) -> tuple[subprocess.Popen, _Reader]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "commgym.experiments.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, _Reader(proc)


def _names() -> str:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    return ns + links


ok, why = netem_available()


@pytest.mark.skipif(not ok, reason=f"network emulation unavailable here: {why}")
def test_sigterm_to_train_on_emulated_network_leaves_nothing(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    proc, out = _start(
        ["train", "--config", "smoke", "--network", "100mbit", "--timesteps", "100000",
         "--tracking-uri", uri, "--output-dir", str(tmp_path / "out")],
        tmp_path,
    )  # fmt: skip
    name = out.wait_for(r"namespaces \((\S+)\*\)", 400).group(1)
    out.wait_for("training ppo on real ranks", 120)
    time.sleep(1.0)  # inside agent.learn, ranks busy
    ranks = _children(proc.pid)
    assert ranks and name in _names()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 128 + signal.SIGTERM, out.text[-3000:]
    assert "stopped by SIGTERM" in out.text
    assert name not in _names(), "namespaces, veths and bridge must be gone"
    assert not _alive(ranks), "rank processes left behind"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("commgym-smoke")
    runs = client.search_runs([exp.experiment_id])
    assert runs and all(r.info.status in ("KILLED", "FAILED") for r in runs), [
        (r.info.run_name, r.info.status) for r in runs
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_to_ui_stops_the_server(tmp_path):
    port = _free_port()
    proc, out = _start(
        ["ui", "--port", str(port), "--workers", "1", "--tracking-uri",
         f"sqlite:///{tmp_path}/mlflow.db"],
        tmp_path,
    )  # fmt: skip
    out.wait_for(rf"MLflow UI ready: http://127\.0\.0\.1:{port}", 400)
    server = _children(proc.pid)
    assert server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 128 + signal.SIGTERM, out.text[-3000:]
    deadline = time.monotonic() + 10
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(server), "MLflow server processes left behind"
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "port still served"
    assert "GET /" not in out.text  # request logging is off
