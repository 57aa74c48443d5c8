"""Launch settings reach every rank by one route: the ``launch`` message after the hello.

Real torchrun gloo ranks. The ranks are started with contradicting ``COMMGYM_*``
variables in their environment, so a rank that still read one would report it.
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from commgym.collectives import CommConfig, WorkerFailed
from commgym.env import AllReduceEnv, EnvConfig, LaunchConfig
from commgym.env.cluster import Cluster
from tests.experiments.readme_commands import fill, template

ROOT = Path(__file__).resolve().parents[2]

#: Values a rank would pick up if it still read launch settings from its environment.
POISON = {
    "COMMGYM_BACKEND": "nccl",
    "COMMGYM_TIMEOUT_S": "1",
    "COMMGYM_THREADS": "3",
    "COMMGYM_WORKLOAD_MODULES": "no_such_module_anywhere",
}

PROBE = {"workload_modules": ("tests.env.launch_workload",), "workload": "launch-probe"}


def _check_ready(hello: list[dict], config: LaunchConfig, world_size: int) -> None:
    assert [h["rank"] for h in hello] == list(range(world_size))
    for h in hello:
        assert h["type"] == "ready"
        assert h["backend"] == config.backend  # what the process group runs
        assert h["device"] == "cpu"
        assert h["threads"] == config.threads_per_rank  # torch.get_num_threads()
        assert h["timeout_s"] == config.timeout_s  # passed to init_process_group
        assert h["workload_modules"] == list(config.workload_modules)


def test_env_config_reaches_every_rank_by_the_launch_message(monkeypatch):
    monkeypatch.chdir(ROOT)  # ranks import tests.env.launch_workload from here
    cfg = EnvConfig(
        world_size=2, steps_per_decision=2, time_budget_s=60.0, timeout_s=77.0,
        threads_per_rank=2, batch_size=16, lr=0.03, **PROBE,
    )  # fmt: skip
    launch = cfg.launch_config()
    assert launch == LaunchConfig(
        backend="gloo", timeout_s=77.0, threads_per_rank=2, batch_size=16, lr=0.03, **PROBE
    )
    for key, value in POISON.items():
        monkeypatch.setenv(key, value)
    env = AllReduceEnv(cfg)
    try:
        _, info = env.reset(seed=0)
        _check_ready(env.cluster.hello, launch, 2)
        sent: list[dict] = []
        inner = env.cluster.command

        def spy(msg, timeout_s=None):
            sent.append(msg)
            return inner(msg, timeout_s)

        env.cluster.command = spy
        env.reset(seed=1)
        env.step(env.menu.default_action())
        # per-episode and per-decision commands carry only what changes
        assert set(sent[0]) == {"cmd", "seed", "config"}
        assert set(sent[1]) == {"cmd", "config", "steps"}
        assert info["eval_loss"] > 0
    finally:
        env.close()


def test_reset_uses_the_launch_workload_batch_and_lr(monkeypatch):
    monkeypatch.chdir(ROOT)
    config = LaunchConfig(timeout_s=60.0, batch_size=8, lr=0.02, **PROBE)
    for key, value in POISON.items():
        monkeypatch.setenv(key, value)
    cluster = Cluster(2, config)
    try:
        _check_ready(cluster.start(), config, 2)
        replies = cluster.command({"cmd": "reset", "seed": 0, "config": CommConfig().to_dict()})
        assert [(r["batch_size"], r["lr"]) for r in replies] == [(8, 0.02)] * 2
    finally:
        cluster.close()


def test_a_rank_that_cannot_apply_the_config_fails_the_start(monkeypatch):
    monkeypatch.chdir(ROOT)
    cluster = Cluster(2, LaunchConfig(timeout_s=60.0, workload_modules=("no_such_module_x",)))
    try:
        with pytest.raises(WorkerFailed, match="no_such_module_x"):
            cluster.start()
        assert not cluster.alive
    finally:
        cluster.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_started_by_the_user_get_the_config(monkeypatch):
    """The README's route for ranks on other hosts: only the key and --control at launch."""
    monkeypatch.chdir(ROOT)
    config = LaunchConfig(timeout_s=45.0, threads_per_rank=2)
    cluster = Cluster(2, config, launch=False, control_host="127.0.0.1", start_timeout_s=240)
    result: list = []
    starter = threading.Thread(target=lambda: result.append(cluster.start()), daemon=True)
    starter.start()
    deadline = time.monotonic() + 30
    while cluster._listener is None and time.monotonic() < deadline:
        time.sleep(0.05)
    host, port = cluster.control_address
    # the README's command line, its placeholders filled (a README edit that breaks it fails)
    given, words = fill(
        template("-m commgym.env.worker"),
        {
            "<cluster.authkey_hex>": cluster.authkey_hex,
            "N": "1",
            "P": "2",
            "HOST:PORT": f"127.0.0.1:{_free_port()}",
            "<env host>:<cluster.control_address port>": f"{host}:{port}",
        },
    )
    assert words[0] == "torchrun" and set(given) == {"COMMGYM_AUTHKEY"}
    cmd = [sys.executable, "-m", "torch.distributed.run", *words[1:]]
    env = {**os.environ, **POISON, **given}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        starter.join(240)
        assert result, "the ranks started by hand did not get ready"
        _check_ready(result[0], config, 2)
        replies = cluster.command({"cmd": "allreduce_bench", "sizes_bytes": [4096], "repeats": 1})
        assert len(replies) == 2
    finally:
        cluster.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0


def _commgym_variables(root: Path) -> dict[str, list[str]]:
    """Every string constant naming a ``COMMGYM_*`` variable, by file (AST, not grep)."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith("COMMGYM_")
                and node.value.replace("_", "").isalnum()
            ):
                found.setdefault(str(path.relative_to(ROOT)), []).append(node.value)
    return found


def test_no_setting_is_read_from_commgym_variables_but_the_key():
    found = {}
    for package in ("env", "experiments"):
        found.update(_commgym_variables(ROOT / package))
    names = {name for names in found.values() for name in names}
    assert names == {"COMMGYM_AUTHKEY"}, found
    # the key is written by the cluster's launch and read by the rank, nowhere else (the
    # launcher names it among the variables a rank reads after it starts: LAUNCH_KEYS)
    assert sorted(found) == ["env/cluster.py", "env/launcher.py", "env/worker.py"], found


def test_a_killed_processs_scratch_folder_is_removed_by_the_next_one():
    """A SIGKILLed driver or actor cannot remove its launch folder; the next launch does."""
    from commgym.env.cluster import scratch_dir

    code = (
        "import sys, time\n"
        "from commgym.env.cluster import scratch_dir\n"
        "d = scratch_dir('cluster'); (d / 'torchrun.log').write_text('x')\n"
        "print(d, flush=True); time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        killed = Path(proc.stdout.readline().strip())
        assert killed.is_dir() and killed.name.startswith(f"commgym-cluster-{proc.pid}-")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    mine = scratch_dir("cluster")  # this process runs: its folder stays
    try:
        assert not killed.exists(), "the killed process's folder was left behind"
        assert mine.is_dir() and mine.name.startswith(f"commgym-cluster-{os.getpid()}-")
    finally:
        shutil.rmtree(mine, ignore_errors=True)
