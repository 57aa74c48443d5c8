"""SIGTERM to a running ``commgym`` command cleans up exactly as Ctrl-C does.

SIGTERM to ``commgym ui`` (server stopped, port freed, exit 143) is checked where the docs
show the command: the ``commgym ui`` row of tests/experiments/test_readme_commands.py.
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from mlflow import MlflowClient

from commgym.env.net import netem_available
from tests.experiments.cli_helpers import alive, descendants, start_cli


def _names() -> str:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    return ns + links


ok, why = netem_available()


@pytest.mark.skipif(not ok, reason=f"network emulation unavailable here: {why}")
def test_sigterm_to_train_on_emulated_network_leaves_nothing(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    proc, out = start_cli(
        ["train", "--config", "smoke", "--network", "100mbit", "--timesteps", "100000",
         "--tracking-uri", uri, "--output-dir", str(tmp_path / "out")],
        tmp_path,
    )  # fmt: skip
    name = out.wait_for(r"namespaces \((\S+)\*\)", 400).group(1)
    out.wait_for("training ppo on real ranks", 120)
    time.sleep(1.0)  # inside agent.learn, ranks busy
    ranks = descendants(proc.pid)
    assert ranks and name in _names()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 128 + signal.SIGTERM, out.text[-3000:]
    assert "stopped by SIGTERM" in out.text
    assert name not in _names(), "namespaces, veths and bridge must be gone"
    assert not alive(ranks), "rank processes left behind"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("commgym-smoke")
    runs = client.search_runs([exp.experiment_id])
    assert runs and all(r.info.status in ("KILLED", "FAILED") for r in runs), [
        (r.info.run_name, r.info.status) for r in runs
    ]


#: a finaliser that runs Python code after the signal arrives: its handler then runs inside
#: the finaliser, where what it raises is only printed (``Exception ignored in ...``)
_SWALLOWING_FINALISER = """
import os, signal, sys, time
from commgym.experiments.cli import install_signal_handlers

install_signal_handlers()

class Finalised:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # backward jumps: the eval loop runs pending handlers here
            pass

Finalised()
try:
    for _ in range(50):
        time.sleep(0.1)
except KeyboardInterrupt as err:
    print("stopped by", type(err).__name__, err)
    sys.exit(143)
print("still running")
"""


def test_a_sigterm_whose_handler_ran_inside_a_finaliser_still_stops_the_command():
    """A signal handler runs at the next bytecode boundary of the main thread, which may be
    inside a ``__del__`` or a weakref callback; there the Terminated it raises is swallowed.
    The command must still stop (the signal is delivered again), not go on training."""
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _SWALLOWING_FINALISER],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 143, done.stdout + done.stderr
    assert "stopped by Terminated SIGTERM" in done.stdout
    assert "Exception ignored" not in done.stderr
