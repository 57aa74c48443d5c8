"""Bad input on the command line: one ``error:`` line, exit 2, nothing created."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from commgym.agents import StaticAgent
from commgym.agents.base import LayoutEnv
from commgym.env.net import host
from commgym.env.spaces import ActionMenu
from tests.experiments.cli_helpers import cli


def _tree(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _assert_one_line_exit_2(proc, *needles: str) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "garbage.zip").write_bytes(b"\x00garbage, not a zip")
    return tmp_path


#: ``commgym evaluate`` of a valid preset on the smoke scenario (rows add the bad part).
_EVALUATE = ["evaluate", "--config", "smoke", "--policy", "static:ddp-default"]

CASES = {
    "output-dir under a file": (
        ["train", "--config", "smoke", "--output-dir", "a-file/out"],
        ("--output-dir", "a-file", "not a folder"),
    ),
    "output-dir on a pseudo file system": (
        ["train", "--config", "smoke", "--output-dir", "/proc/commgym-out"],
        (
            "--output-dir '/proc/commgym-out'",
            "not writable",
            "/proc is the proc pseudo file system",
        ),
    ),
    "evaluate: missing policy": (
        ["evaluate", "--config", "smoke", "--policy", "missing.zip"],
        ("missing.zip", "does not exist", "(--policy)"),
    ),
    "evaluate: garbage policy": (
        ["evaluate", "--config", "smoke", "--policy", "garbage.zip"],
        ("garbage.zip", "not a zip"),
    ),
    "replay: missing policy names the accepted forms": (
        ["replay", "--policy", "static-fp16-dense"],
        ("static-fp16-dense", "policy file saved by `commgym train`", "static:fp16-dense"),
    ),
    "replay: garbage policy names the accepted forms": (
        ["replay", "--policy", "garbage.zip"],
        ("not a zip", "static:ddp-default"),
    ),
    "unreachable tracking server": (
        ["train", "--config", "smoke", "--tracking-uri", "http://127.0.0.1:1"],
        ("http://127.0.0.1:1", "unreachable"),
    ),
    # what click rejects while parsing: the same one line (no usage box), the flag named
    "out of range: --seeds -1": (["leaderboard", "--seeds", "-1"], ("--seeds", "equal to 1")),
    # training seeds derive from --seed above the evaluation seeds: a negative one is refused
    "out of range: --seed -1": (["train", "--seed", "-1"], ("--seed", "equal to 0")),
    "out of range: --world-size 0": (
        ["train", "--config", "smoke", "--world-size", "0"],
        ("--world-size", "equal to 1"),
    ),
    "not a number": (["replay", "--policy", "static:ddp-default", "--steps", "abc"], ("--steps",)),
    "unknown option": (["train", "--seedz", "1"], ("--seedz", "--seed")),
    "unknown command": (["trian"], ("trian", "train")),
    "missing option": (["evaluate"], ("--policy",)),
    # values the config checks: the flag that sets them is named
    "bad value: --time-budget-s": (
        ["train", "--config", "smoke", "--time-budget-s", "-1"],
        ("time_budget_s", "--time-budget-s"),
    ),
    "bad value: --env": (
        ["train", "--config", "smoke", "--env", "simulator"],
        ("env_kind", "--env"),
    ),
    "--env sim without a target to calibrate to": (
        ["train", "--config", "smoke", "--env", "sim"],
        ("--target-loss", "--calibration PATH"),
    ),
    "fine-tuning an agent that has none": (
        ["train", "--config", "slow-link", "--agent", "bayesopt", "--fine-tune-episodes", "2"],
        ("--fine-tune-episodes 0",),
    ),
    # unknown names
    "unknown agent": (["train", "--config", "smoke", "--agent", "ppoo"], ("ppoo", "ppo")),
    "unknown baseline": (
        [*_EVALUATE, "--baselines", "nosuch"],
        ("nosuch", "--baselines"),
    ),
    "unknown workload": (
        ["train", "--config", "smoke", "--workload", "nosuch"],
        ("nosuch", "mlp-digits", "--workload"),
    ),
    "unknown scenario": (["train", "--config", "nosuch"], ("nosuch", "smoke", "(--config)")),
    "unknown leaderboard scenario": (
        ["leaderboard", "--scenarios", "slow-link,nosuch"],
        ("nosuch", "(--scenarios)"),
    ),
    # static presets off the scenario's action menu
    "off-menu preset as --agent": (
        ["train", "--config", "smoke", "--agent", "static:int8/3MB/H1"],
        ("int8/3MB/H1", "int8/4MB/H1"),
    ),
    "off-menu preset in --baselines": (
        [*_EVALUATE, "--baselines", "static:int8/3MB/H1"],
        ("int8/3MB/H1", "--baselines"),
    ),
    "off-menu preset as evaluate's --policy": (
        ["evaluate", "--config", "smoke", "--policy", "static:int8/3MB/H1"],
        ("int8/3MB/H1", "int8/4MB/H1", "--policy"),
    ),
    "off-menu preset as replay's --policy": (
        ["replay", "--policy", "static:int8/3MB/H1"],
        ("int8/3MB/H1", "int8/4MB/H1", "--policy"),
    ),
    "off-menu preset in a leaderboard scenario": (
        ["leaderboard", "--scenarios", "slow-link", "--agents", "ppo,static:int8/4MB/H1"],
        ("slow-link", "fp16/25MB/H4", "--agents"),
    ),
}

#: The hosts the network rows fake (``host.probe_host``), so that they run on every host:
#: the newcomer's (root, tbf rate shaping, no sch_netem) and one without the privileges.
_NO_NETEM = host.HostFeatures(
    True, "ok", False, "kernel lacks the netem qdisc (CONFIG_NET_SCH_NETEM)"
)
_NO_ROOT = host.HostFeatures(False, "needs root (CAP_NET_ADMIN) for network namespaces")
#: Case name -> the host it runs on (the real one for every other case).
HOSTS: dict[str, host.HostFeatures] = {}
for _cmd in (["train", "--config", "smoke"], ["replay", "--policy", "static:ddp-default"],
             ["collect"], _EVALUATE):  # fmt: skip
    _name = f"delay without sch_netem: {_cmd[0]}"
    CASES[_name] = (
        [*_cmd, "--network", "5gbit:10ms"],
        ("--network", "5gbit:10ms", "delay/jitter/loss", "--drop-impairments"),
    )
    HOSTS[_name] = _NO_NETEM
    _name = f"network without privileges: {_cmd[0]}"
    CASES[_name] = ([*_cmd, "--network", "100mbit"], ("--network", "needs root", "loopback"))
    HOSTS[_name] = _NO_ROOT
CASES["a scenario's network without privileges"] = (
    ["leaderboard", "--scenarios", "slow-link"],
    ("slow-link", "needs root"),
)
HOSTS["a scenario's network without privileges"] = _NO_ROOT


def _invoke(args: list[str], cwd, monkeypatch):
    """The CLI in-process (one import for all cases), in ``cwd``, without MLflow settings."""
    from typer.testing import CliRunner

    from commgym.experiments.cli import app

    monkeypatch.chdir(cwd)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    res = CliRunner().invoke(app, args)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return subprocess.CompletedProcess(args, res.exit_code, res.stdout, res.stderr)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_exit_2_and_creates_nothing(workdir, case, monkeypatch):
    args, needles = CASES[case]
    if case in HOSTS:
        monkeypatch.setattr(host, "probe_host", lambda: HOSTS[case])
    before = _tree(workdir)
    proc = _invoke(args, workdir, monkeypatch)
    _assert_one_line_exit_2(proc, *needles)
    assert _tree(workdir) == before  # no mlflow.db, no commgym-out, no probe left
    assert "open the UI" not in proc.stdout and "127.0.0.1:1" not in proc.stdout


def test_policy_for_another_menu_is_refused_before_anything_is_created(workdir, monkeypatch):
    menu = ActionMenu(compression=("none", "fp16"))
    policy = StaticAgent(LayoutEnv(menu), preset="fp16-dense").save(workdir / "other.zip")
    before = _tree(workdir)
    proc = _invoke(["evaluate", "--config", "smoke", "--policy", str(policy)], workdir, monkeypatch)
    _assert_one_line_exit_2(proc, "action menu")
    assert _tree(workdir) == before


def test_console_script_gives_one_line_without_traceback(workdir):
    """The real entry point (``python -m``): same line, no traceback."""
    proc = cli(["evaluate", "--config", "smoke", "--policy", "garbage.zip"], workdir, 180)
    _assert_one_line_exit_2(proc, "not a zip")
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run the CLI as an unprivileged user",
)
def test_read_only_output_dir_for_an_unprivileged_user():
    import tempfile
    from pathlib import Path

    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run(
        [*drop, sys.executable, "-c", "import commgym.experiments.cli"],
        cwd="/tmp", capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if probe.returncode != 0:  # e.g. an interpreter or install under root's 0700 home
        pytest.skip(f"commgym not importable by an unprivileged user: {probe.stderr[-200:]}")
    ro = Path(tempfile.mkdtemp(prefix="commgym-ro-", dir="/tmp"))  # pytest's tmp is 0700
    ro.chmod(0o555)
    proc = subprocess.run(
        [*drop, sys.executable, "-m", "commgym.experiments.cli", "train", "--config", "smoke",
         "--output-dir", str(ro / "out"), "--tracking-uri", f"sqlite:///{ro}/mlflow.db"],
        cwd=ro, capture_output=True, text=True, timeout=180, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
    )  # fmt: skip
    try:
        _assert_one_line_exit_2(proc, "not writable", "Permission denied")
        assert list(ro.iterdir()) == []
    finally:
        ro.rmdir()
