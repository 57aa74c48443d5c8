"""torchrun's agent forked from commgym's launcher behaves as the same command under Popen.

Real torchrun agents and real ranks: the rank here is a small script (no torch import, so a
launch costs a fraction of a second), and the cluster tests start real gloo ranks through
:class:`~commgym.env.cluster.Cluster`, forked by their agent or fresh.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from commgym.collectives import CommConfig, WorkerFailed
from commgym.env import launcher
from commgym.env.cluster import Cluster, LaunchConfig

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

RANK = textwrap.dedent(
    """
    import json, os, sys, tempfile, time
    out, world = sys.argv[1], int(os.environ["WORLD_SIZE"])
    with open(out + ".part" + os.environ["RANK"], "w") as f:
        json.dump({"cwd": os.getcwd(), "marker": os.environ.get("LAUNCHER_MARKER"),
                   "tmp": tempfile.gettempdir(), "pid": os.getpid(),
                   "sid": os.getsid(0), "world": os.environ["WORLD_SIZE"]}, f)
    os.replace(out + ".part" + os.environ["RANK"], out + "." + os.environ["RANK"])
    # torchrun ends every rank once one fails: a failing rank leaves only after all have
    # written (on a loaded machine a peer may still be starting when it exits)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(
        os.path.exists(out + "." + str(r)) for r in range(world)
    ):
        time.sleep(0.05)
    sys.exit(int(sys.argv[2]))
    """
)


def _run(tmp_path: Path, code: int, nproc: int = 2, via: str = "launcher"):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    out = tmp_path / f"out-{via}-{code}"
    cmd = [
        *TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), "--max-restarts", "0",
        "--monitor-interval", "0.2", str(script), str(out), str(code),
    ]  # fmt: skip
    scratch = tmp_path / f"tmp-{via}-{code}"
    scratch.mkdir()
    env = dict(os.environ, LAUNCHER_MARKER=f"m-{via}", TMPDIR=str(scratch))
    log = tmp_path / f"log-{via}-{code}.txt"
    if via == "launcher":
        proc, how = launcher.start_agent(cmd, env, str(log))
        assert how == "forked"
    else:
        with open(log, "wb") as f:
            proc = subprocess.Popen(
                cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )
    status = proc.wait(timeout=120)
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(nproc)]
    return proc, status, ranks, scratch, log


def test_a_forked_agent_runs_its_ranks_as_popen_would(tmp_path, monkeypatch):
    """Same environment, working directory, TMPDIR, session and exit status as under Popen."""
    monkeypatch.chdir(tmp_path)
    for code in (0, 3):
        proc, status, ranks, scratch, log = _run(tmp_path, code)
        _, ref_status, ref_ranks, ref_scratch, _ = _run(tmp_path, code, via="popen")
        assert isinstance(proc, launcher.ForkedAgent)
        assert (status == 0) == (code == 0) and (ref_status == 0) == (code == 0)
        assert status == ref_status, log.read_text()[-2000:]
        for r, ref_r in zip(ranks, ref_ranks, strict=True):
            assert r["marker"] == "m-launcher" and ref_r["marker"] == "m-popen"
            assert r["cwd"] == ref_r["cwd"] == str(tmp_path)
            assert r["tmp"] == str(scratch) and ref_r["tmp"] == str(ref_scratch)
            assert r["world"] == ref_r["world"] == "2"
            # torchrun puts each rank in a session of its own either way
            assert (r["sid"] == r["pid"]) == (ref_r["sid"] == ref_r["pid"])
        # the agent's own output (torchrun's log lines) went to the log file
        if code:
            assert "exitcode" in log.read_text()


def test_a_forked_agent_leads_its_session_and_its_kill_is_reported(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(300)\n")
    cmd = [*TORCHRUN, "--standalone", "--nproc-per-node", "2", str(script)]
    proc, how = launcher.start_agent(cmd, dict(os.environ), str(tmp_path / "log.txt"))
    assert how == "forked" and proc.poll() is None
    deadline = time.monotonic() + 60
    ranks: list[int] = []
    while time.monotonic() < deadline and len(ranks) < 2:
        out = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=False
        )
        ranks = [int(p) for p in out.stdout.split()]
        time.sleep(0.1)
    assert len(ranks) == 2
    assert os.getsid(proc.pid) == proc.pid  # its own session, as Popen(start_new_session)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    for pid in ranks:  # torchrun's own ranks: its agent's death is not theirs (as with Popen)
        os.kill(pid, signal.SIGKILL)


def test_a_dead_launcher_is_replaced_and_its_agents_end_reported(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(300)\n")
    cmd = [*TORCHRUN, "--standalone", "--nproc-per-node", "1", str(script)]
    proc, _ = launcher.start_agent(cmd, dict(os.environ), str(tmp_path / "log.txt"))
    old = launcher.launcher_pid()
    os.kill(old, signal.SIGKILL)
    while Path(f"/proc/{old}").exists() and "Z" not in Path(f"/proc/{old}/stat").read_text():
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    # the launcher that forked it is gone: its status is unknown, not a hang
    assert proc.wait(timeout=30) == -1
    fast = tmp_path / "ok.py"
    fast.write_text("pass\n")
    again, how = launcher.start_agent(
        [*TORCHRUN, "--standalone", "--nproc-per-node", "1", str(fast)],
        dict(os.environ),
        str(tmp_path / "log3.txt"),
    )
    assert how == "forked" and launcher.launcher_pid() not in (None, old)
    assert again.wait(timeout=60) == 0


def test_the_launcher_exits_with_its_driver(tmp_path):
    """A driver killed with SIGKILL leaves no launcher; its ranks exit on their own."""
    driver = textwrap.dedent(
        """
        import os, signal, sys
        from commgym.env.cluster import Cluster, LaunchConfig
        from commgym.env import launcher
        c = Cluster(2, LaunchConfig(timeout_s=30))
        c.start()
        print(launcher.launcher_pid(), c.launched_by, *c.pids, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", driver], capture_output=True, text=True, timeout=120, check=False
    )
    words = out.stdout.split()
    assert len(words) == 4 and words[1] == "forked", out.stderr[-2000:]
    pids = [int(words[0]), *map(int, words[2:])]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.2)
    left = [p for p in pids if Path(f"/proc/{p}").exists()]
    assert not left, f"still running after the driver died: {left}"


def test_a_cluster_launch_is_forked_and_commands_reach_its_ranks():
    c = Cluster(2, LaunchConfig(timeout_s=60))
    try:
        hello = c.start()
        assert c.launched_by == "forked"
        assert sorted(h["rank"] for h in hello) == [0, 1]
        assert c.launch_command[:3] == TORCHRUN
        agent = c._procs[0]
        assert os.getsid(agent.pid) == agent.pid
    finally:
        c.close()
    assert not c.alive


def _train(extra_env: dict[str, str] | None = None, fork_ranks: bool = True):
    """Hello, sessions, names and two decisions' losses of a 2-rank cluster."""
    config = CommConfig(compression="int8", sync_period=2).to_dict()
    c = Cluster(
        2,
        LaunchConfig(workload="mlp-digits", timeout_s=60),
        extra_env=extra_env,
        fork_ranks=fork_ranks,
    )
    try:
        hello = c.start()
        sessions = [os.getsid(pid) == pid for pid in c.pids]
        names = [Path(f"/proc/{pid}/comm").read_text().strip() for pid in c.pids]
        c.command({"cmd": "reset", "seed": 7, "config": config})
        losses = []
        for _ in range(2):
            replies = c.command({"cmd": "step", "config": config, "steps": 4})
            losses.append([(r["train_loss"], r["eval_loss"]) for r in replies])
        # a forked rank keeps SIGTERM's default: it dies, and the next command says so
        os.kill(c.pids[1], signal.SIGTERM)
        with pytest.raises(WorkerFailed):
            c.command({"cmd": "step", "config": config, "steps": 1})
        return hello, sessions, names, losses
    finally:
        c.close()


def test_a_clusters_ranks_are_forked_and_train_bit_identically_to_fresh_ones():
    """Ranks forked by their agent: own sessions, named, default signals, the same training."""
    hello, sessions, names, forked = _train()
    assert [h["forked"] for h in hello] == [True, True]
    assert sessions == [True, True] and names == [launcher.RANK_COMM] * 2
    hello, sessions, names, fresh = _train(fork_ranks=False)
    assert [h["forked"] for h in hello] == [False, False]
    assert sessions == [True, True] and launcher.RANK_COMM not in names
    assert forked == fresh
    # a variable read at import that the launcher did not start with: fresh interpreters; one
    # that no import reads: forked (torchrun gives each rank the launch's environment)
    hello, *_ = _train({"TRITON_INTERPRET": "1"})
    assert [h["forked"] for h in hello] == [False, False]
    hello, *_, tagged = _train({"LAUNCH_PROBE_TAG": "x"})
    assert [h["forked"] for h in hello] == [True, True] and tagged == forked
    # what scikit-learn's import (Intel OpenMP's; torch ships GNU's) and torch's inductor set
    # in a driver: no import reads them
    runtime = {"KMP_DUPLICATE_LIB_OK": "True", "KMP_INIT_AT_FORK": "FALSE"}
    hello, *_ = _train({**runtime, "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_probe"})
    assert [h["forked"] for h in hello] == [True, True]


def test_a_launcher_that_does_not_answer_is_dropped_and_the_launch_runs_under_popen(
    tmp_path, monkeypatch
):
    fast = tmp_path / "ok.py"
    fast.write_text("pass\n")
    cmd = [*TORCHRUN, "--standalone", "--nproc-per-node", "1", str(fast)]
    first, how = launcher.start_agent(cmd, dict(os.environ), str(tmp_path / "log1.txt"))
    assert how == "forked" and first.wait(timeout=60) == 0
    stuck = launcher.launcher_pid()
    os.kill(stuck, signal.SIGSTOP)  # alive, but answers nothing
    try:
        monkeypatch.setattr(launcher, "ANSWER_TIMEOUT_S", 1.0)
        proc, how = launcher.start_agent(cmd, dict(os.environ), str(tmp_path / "log2.txt"))
        # the same command under Popen instead, and the silent launcher is not used again
        # (a late answer would have been taken for the next launch's)
        assert how == "popen" and proc.wait(timeout=60) == 0
        assert launcher.launcher_pid() is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stuck, signal.SIGCONT)
    monkeypatch.setattr(launcher, "ANSWER_TIMEOUT_S", 120.0)
    again, how = launcher.start_agent(cmd, dict(os.environ), str(tmp_path / "log3.txt"))
    assert how == "forked" and launcher.launcher_pid() not in (None, stuck)
    assert again.wait(timeout=60) == 0
