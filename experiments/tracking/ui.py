"""The MLflow UI server's lifecycle (``commgym ui``): start, wait until it answers, stop.

:func:`serve_ui` starts ``mlflow ui`` on 127.0.0.1 in its own process group (so stopping
it reaches uvicorn's workers, not only the launcher), waits under a spinner until
``/health`` answers, prints the URL of the latest experiment's runs in the model-training
view (:func:`ui_landing`), and stops the whole group when it returns or is interrupted
(:func:`stop_group`). The server's own log lines go to a file (:func:`ui_log_path`).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["UI_VIEW", "port_free", "serve_ui", "stop_group", "ui_landing", "ui_log_path"]


def port_free(port: int) -> bool:
    """Whether ``port`` on 127.0.0.1 can be bound (no server listens there)."""
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stop_group(proc: Any, timeout_s: float = 10.0) -> None:
    """SIGTERM the server's process group (uvicorn and its workers), SIGKILL if it lingers."""
    import subprocess

    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue


#: The UI's model-training view. MLflow 3's UI takes the view (GenAI or machine
#: learning) from this URL parameter, else from the browser's last choice (GenAI on a
#: first visit); it does not read the experiment's ``mlflow.experimentKind`` tag.
UI_VIEW = "workflowType=machine_learning"


def ui_log_path(uri: str, port: int) -> Path:
    """Where the server's log lines go: beside a SQLite store, else in the temp folder."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///") :].split("?", 1)[0]).parent / "mlflow-ui.log"
    return Path(tempfile.gettempdir()) / f"commgym-mlflow-ui-{port}.log"


def _api(base: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One MLflow REST call (POST with ``body``, else GET), its JSON answer."""
    import json
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{base}/api/2.0/mlflow/{path}", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read() or b"{}")


def ui_landing(base: str) -> tuple[str, str | None]:
    """The URL that opens the runs of the experiment with the latest run, and its name.

    Asks the running server (its REST API); without any run, the experiments list. Both
    open in the model-training view (:data:`UI_VIEW`).

    Returns:
        ``(url, experiment name or None)``.
    """
    experiments = _api(base, "experiments/search?max_results=1000").get("experiments", [])
    by_id = {e["experiment_id"]: e["name"] for e in experiments}
    runs = _api(
        base,
        "runs/search",
        {"experiment_ids": list(by_id), "order_by": ["attributes.start_time DESC"],
         "max_results": 1},
    ).get("runs", []) if by_id else []  # fmt: skip
    if not runs:
        return f"{base}/#/?{UI_VIEW}", None
    exp_id = runs[0]["info"]["experiment_id"]
    return f"{base}/#/experiments/{exp_id}/runs?{UI_VIEW}", by_id.get(exp_id)


def serve_ui(uri: str, port: int, workers: int, log_path: Path) -> int:
    """Run the MLflow UI for ``uri`` on 127.0.0.1:``port`` until it exits; its exit status.

    Says when the server answers (its start takes from seconds to minutes on a busy
    machine) and prints where to open it; the whole process group is stopped on the way
    out (Ctrl-C, SIGTERM or SIGHUP included).

    Raises:
        RuntimeError: the server exited before answering (the message names its log).
    """
    import subprocess
    import time
    import urllib.request

    from commgym.experiments.progress import console, phase

    cmd = [
        sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
        "--uvicorn-opts", "--no-access-log",
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with log_path.open("ab") as log:
        # own process group: stopping it reaches uvicorn's workers, not only the launcher
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    try:
        with phase(f"starting the MLflow UI for {uri}"):
            while proc.poll() is None:
                try:
                    with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    time.sleep(0.5)
        if proc.poll() is not None:
            raise RuntimeError(
                f"the MLflow UI exited with status {proc.returncode} before answering; "
                f"its log: {log_path}"
            )
        try:
            url, experiment = ui_landing(base)
        except (OSError, ValueError, KeyError):  # an old server: its home page still works
            url, experiment = f"{base}/#/?{UI_VIEW}", None
        what = f"runs of experiment {experiment!r}" if experiment else "no runs yet"
        console.print(f"MLflow UI ready: [bold]{url}[/bold]  ({what}; Ctrl-C to stop)")
        console.print(f"server log: {log_path}")
        return proc.wait()
    finally:
        stop_group(proc)
