"""README.md and docs/ are a contract: every command they show runs, small, as a newcomer runs it.

The commands come from the pages themselves (README.md, then docs/*.md) and the table of how
each is run is
:data:`tests.experiments.readme_commands.COMMANDS` (see that module). Commands that feed each
other (``commgym train`` leaves the policy that ``commgym evaluate --policy
commgym-out/policy.zip`` reads) run one after another in README order in one working folder;
two such folders run side by side, one command at a time each, so that both CPU cores work.
``experiments/`` of the checkout is linked into each folder, so the README's script paths
resolve as from the repository root. ``commgym`` is the console script of the environment
running the tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.experiments.cli_helpers import (
    alive,
    console_script_context,
    descendants,
    free_port,
    run_console_script,
    start_cli,
)
from tests.experiments.readme_commands import (
    COMMANDS,
    IDENTITY,
    REPO,
    SNIPPETS,
    Mention,
    NotInCI,
    Run,
    RunBy,
    argv,
    expand,
    help_commands,
    python_snippets,
    readme_commands,
    snippet,
)

#: The module behind the ``commgym`` console script.
MODULE = "commgym.experiments.cli"
#: Longest a README command may run here, seconds.
TIMEOUT_S = 1800
#: Working folders whose commands run side by side (the CI machines have 2 cores).
LANES = 2

#: (key, runnable form) of every Run row, in README order.
ROWS = [(k, f) for k, row in COMMANDS.items() if isinstance(row, Run) for f in expand(k)]
#: Tests that read what a README row left behind (its output, folder, MLflow store) instead of
#: running the same command again; each is parametrized by ``form`` like the runner's test.
ROW_READERS = ("test_readme_command_runs", "test_train_row_records_and_fits_the_surrogate_first")


def _program(name: str) -> list[str]:
    """What runs a README program: this environment's, never a PATH lookup."""
    if name == "commgym":
        script = Path(sys.executable).with_name("commgym")  # the console script, if installed
        return [str(script)] if script.exists() else [sys.executable, "-m", MODULE]
    if name == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run"]
    if name == "python":
        return [sys.executable]
    if name == "ray":  # the ray extra's console script, beside this interpreter
        return [str(Path(sys.executable).with_name("ray"))]
    raise ValueError(f"the README runner does not run {name!r}")


def _netem() -> tuple[bool, str]:
    from commgym.env.net import netem_available

    return netem_available()


def _words(key: str, form: str) -> list[str]:
    """The argument list of ``form`` with row ``key``'s size flags appended."""
    flags = COMMANDS[key].flags.replace("{port}", str(free_port()))
    return argv(form, flags.replace("{repo}", str(REPO)))


def _loopback(words: list[str]) -> list[str]:
    """``words`` without their ``--network SPEC`` (the command on unshaped loopback links)."""
    at = words.index("--network")
    return words[:at] + words[at + 2 :]


def _chains(keys: list[str]) -> list[list[str]]:
    """``keys`` (README order) grouped by what feeds what (``after``), each group in order."""
    group = {k: k for k in keys}

    def find(k: str) -> str:
        while group[k] != k:
            k = group[k]
        return k

    for k in keys:
        for before in COMMANDS[k].after:
            group[find(k)] = find(before)
    chains: dict[str, list[str]] = {}
    for k in keys:
        chains.setdefault(find(k), []).append(k)
    return list(chains.values())


class Lane:
    """A working folder whose README commands run one after another.

    ``commgym`` commands run as processes forked from a server that imported commgym once
    (:func:`~tests.experiments.cli_helpers.console_script_context`), each through the
    console script's entry point with its own argv, folder, environment and output; other
    programs (``torchrun``) run as subprocesses of this interpreter.
    """

    def __init__(self, root: Path, ctx) -> None:
        self.root = root
        root.mkdir()
        (root / "experiments").symlink_to(REPO / "experiments", target_is_directory=True)
        (root / "logs").mkdir()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        self.ctx = ctx
        self.ran = 0

    def run(self, words: list[str]) -> subprocess.CompletedProcess[str]:
        """Run one command line here; its exit status and output (stdout and stderr)."""
        self.ran += 1
        if words[0] != "commgym":
            return subprocess.run(
                _program(words[0]) + words[1:], cwd=self.root, env=self.env,
                capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
            )  # fmt: skip
        log = self.root / "logs" / f"{self.ran:02d}.txt"
        p = self.ctx.Process(
            target=run_console_script, args=(words[1:], str(self.root), self.env, str(log))
        )
        p.start()
        p.join(TIMEOUT_S)
        if p.is_alive():  # SIGTERM first: the command cleans up as on Ctrl-C
            p.terminate()
            p.join(60)
            p.kill()
            p.join()
        return subprocess.CompletedProcess(words, p.exitcode, log.read_text(), "")


class Session:
    """Runs the README's commands: each chain in one lane, lanes side by side.

    Started for the forms the test session selected (and what feeds them); a test waits for
    its form's outcome: a finished process, a skip reason, or the exception of a check.
    """

    def __init__(self, root: Path, forms: set[str]) -> None:
        ctx = console_script_context()
        self.lanes = [Lane(root / f"lane{i}", ctx) for i in range(LANES)]
        needed = {k for k, f in ROWS if f in forms}
        while missing := {b for k in needed for b in COMMANDS[k].after} - needed:
            needed |= missing  # and what feeds them
        keys = [k for k in COMMANDS if k in needed]
        # the selected forms, and the first (plain) form of each command that feeds one
        self.wanted = set(forms) | {expand(b)[0] for k in needed for b in COMMANDS[k].after}
        self.network = _netem()
        self.outcomes: dict[str, Future] = {f: Future() for k in keys for f in expand(k)}
        #: form -> the lane folder it ran in
        self.folders: dict[str, Path] = {}
        plans: list[list[str]] = [[] for _ in self.lanes]
        for chain in sorted(_chains(keys), key=len, reverse=True):  # longest chains first
            min(plans, key=len).extend(chain)
        for plan in plans:
            plan.sort(key=list(COMMANDS).index)  # README order within a lane
        self.pool = ThreadPoolExecutor(LANES)
        for lane, plan in zip(self.lanes, plans, strict=True):
            self.pool.submit(self._run_lane, lane, plan)

    def _run_lane(self, lane: Lane, keys: list[str]) -> None:
        forms = [(k, f) for k in keys for f in expand(k)]
        for _, form in forms:
            if form not in self.wanted:
                self.outcomes[form].set_result("not selected in this test session")
        forms = [(k, f) for k, f in forms if f in self.wanted]
        try:
            for key, form in forms:
                self.folders[form] = lane.root
                self.outcomes[form].set_result(self._outcome(lane, key, form))
        finally:  # a broken lane must not leave a test waiting
            for _, form in forms:
                if not self.outcomes[form].done():
                    self.outcomes[form].set_result(RuntimeError("its lane stopped before it"))

    def _outcome(self, lane: Lane, key: str, form: str) -> object:
        row = COMMANDS[key]
        failed = [b for b in row.after if not self.succeeded(expand(b)[0])]
        ok, why = self.network
        if failed:
            before = self.outcomes[expand(failed[0])[0]]
            skipped = before.result() if before.done() else None
            if isinstance(skipped, str):  # skipped here for a reason: so is what it feeds
                return f"prerequisite {failed[0]!r} skipped: {skipped}"
            return RuntimeError(f"prerequisite {failed[0]!r} failed")
        if row.needs and importlib.util.find_spec(row.needs) is None:
            return f"needs the {row.needs} module (pip install 'commgym[{row.needs}]')"
        words = _words(key, form)
        if row.needs_network(form) and not ok:
            if row.shaped:  # its links are what it is about: nothing to run on loopback
                return f"network emulation unavailable here ({why})"
            words = _loopback(words)  # the same command on unshaped loopback links
        try:
            return _serve(lane, words) if row.server else lane.run(words)
        except Exception as err:  # the test re-raises it
            return err

    def succeeded(self, form: str) -> bool:
        """Whether ``form`` already ran and exited 0 (prerequisites run earlier in a lane)."""
        done = self.outcomes[form]
        result = done.result() if done.done() else None
        return isinstance(result, subprocess.CompletedProcess) and result.returncode == 0

    def outcome(self, form: str) -> object:
        """Waits for ``form``: a finished process, a skip reason, the exception of a check,
        or ``True`` for a check that passed."""
        return self.outcomes[form].result()


@pytest.fixture(scope="module")
def session(request, tmp_path_factory):
    selected = {
        item.callspec.params["form"]
        for item in request.session.items
        if getattr(item, "originalname", None) in ROW_READERS
    }
    runner = Session(tmp_path_factory.mktemp("readme"), selected)
    yield runner
    runner.pool.shutdown(wait=True)


# -- the table is complete -----------------------------------------------------------------
def test_every_readme_and_help_command_is_in_the_table():
    shown = list(dict.fromkeys(readme_commands() + help_commands()))
    missing = [c for c in shown if c not in COMMANDS]
    stale = [k for k in COMMANDS if k not in shown]
    assert not missing, (
        "README.md, docs/ or a --help text shows commands that "
        "tests/experiments/readme_commands.py "
        f"does not say how to run (add a row to COMMANDS): {missing}"
    )
    assert not stale, f"COMMANDS rows README.md and docs/ no longer show (remove them): {stale}"


def test_the_readmes_test_command_is_the_one_ci_runs():
    """README's second set-up command and .ci/run's test line are the same text."""
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    at = next(i for i, line in enumerate(ci) if "README test command" in line)
    command = ci[at + 1].strip()
    assert command == 'pip install torch==2.13.0 -e ".[dev,kernels]" && python -m pytest'
    assert f"```bash\n{command}\n```" in (REPO / "README.md").read_text()


def test_a_new_readme_command_fails_the_table_check():
    text = (REPO / "README.md").read_text() + "\n```bash\ncommgym train --agent nosuch\n```\n"
    assert "commgym train --agent nosuch" in readme_commands(text)
    assert "commgym train --agent nosuch" not in COMMANDS


def test_mentions_and_delegated_rows_point_at_runnable_ones():
    for key, row in COMMANDS.items():
        if isinstance(row, Mention):
            assert isinstance(COMMANDS.get(row.of), Run | RunBy), (key, row.of)
        elif isinstance(row, RunBy):
            path, name = row.test.split("::")
            source = (REPO / path).read_text()
            assert f"def {name}(" in source and "readme_commands" in source, row.test
        elif isinstance(row, NotInCI):
            assert row.reason.strip(), key


def test_size_flags_keep_what_the_command_is():
    """A row's size flags never swap the scenario, agent, model or network it was written with."""
    for key, form in ROWS:
        written = {w for w in argv(form) if w.startswith("--")}
        added = {w for w in argv("", COMMANDS[key].flags) if w.startswith("--")}
        assert not written & added & set(IDENTITY), (form, sorted(written & added))


def test_every_python_snippet_is_run_or_has_a_twin():
    snippets = python_snippets()
    for code in snippets:
        keys = [k for k in SNIPPETS if k in code]
        assert len(keys) == 1, f"python block without one SNIPPETS key: {code[:200]}"
    assert len(snippets) == len(SNIPPETS)


# -- every command runs --------------------------------------------------------------------
def _finished(session, form: str) -> object:
    """``form``'s outcome once its lane ran it: skips for a skip reason, re-raises a check's
    exception; a finished process or ``True`` (a check that passed in its lane)."""
    outcome = session.outcome(form)
    if isinstance(outcome, str):
        pytest.skip(outcome)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


@pytest.mark.timeout(TIMEOUT_S + 120)  # it waits for its command (and its lane's before it)
@pytest.mark.parametrize(("key", "form"), ROWS, ids=[f for _, f in ROWS])
def test_readme_command_runs(session, key, form):
    outcome = _finished(session, form)
    if outcome is True:  # a check that ran in its lane (commgym ui)
        return
    out = outcome.stdout + outcome.stderr
    assert outcome.returncode == 0, f"{form}\n{out[-6000:]}"
    for text in COMMANDS[key].expect:
        assert text in out, (text, out[-4000:])


@pytest.mark.timeout(TIMEOUT_S + 120)
@pytest.mark.parametrize("form", ["commgym train"])
def test_train_row_records_and_fits_the_surrogate_first(session, form):
    """The README's first command, without a surrogate file: real decisions are recorded,
    fitted and logged to MLflow with the parent run, then PPO learns on the fit."""
    from mlflow import MlflowClient

    outcome = _finished(session, form)
    out = outcome.stdout + outcome.stderr
    assert outcome.returncode == 0, out[-6000:]
    assert "recording real decisions for the surrogate" in out and "16/16 decisions" in out
    client = MlflowClient(tracking_uri=f"sqlite:///{session.folders[form] / 'mlflow.db'}")
    exp = client.get_experiment_by_name("commgym")
    trains = [
        r
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("commgym.command") == "train"
        and r.data.params.get("env_kind") == "surrogate"
        and "surrogate.joblib" in {a.path for a in client.list_artifacts(r.info.run_id)}
    ]  # the lane's later commands log to the same store
    assert trains, "no train run logged the recorded decisions and their fit"
    names = {a.path for a in client.list_artifacts(trains[0].info.run_id)}
    assert {"transitions.csv", "transitions.bench.json"} <= names, names
    assert "sim2real/gap" in trains[0].data.metrics


def _serve(lane: Lane, words: list[str]) -> bool:
    """``commgym ui``: its URL opens the latest experiment's runs; server logs stay off."""
    port = int(words[words.index("--port") + 1])
    proc, out = start_cli(words[1:], lane.root, _program("commgym"))
    try:
        url = out.wait_for(r"MLflow UI ready: (\S+)", 900).group(1)
        m = re.fullmatch(
            rf"http://127\.0\.0\.1:{port}/#/experiments/(\d+)/runs\?workflowType=machine_learning",
            url,
        )
        assert m, url
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(base + "/", timeout=60) as resp:
            assert resp.status == 200 and b"<html" in resp.read().lower()
        api = f"{base}/api/2.0/mlflow"
        with urllib.request.urlopen(f"{api}/experiments/get?experiment_id={m[1]}") as resp:
            assert json.load(resp)["experiment"]["name"] == "commgym"
        body = json.dumps({"experiment_ids": [m[1]], "max_results": 100}).encode()
        req = urllib.request.Request(
            f"{api}/runs/search", body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            runs = json.load(resp)["runs"]
        tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
        assert any(t.get("commgym.command") == "train" for t in tags)
        log = out.wait_for(r"server log: (\S+)", 30).group(1)
        server = descendants(proc.pid)
        assert server
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
    assert rc == 128 + signal.SIGTERM, out.text[-3000:]
    deadline = time.monotonic() + 10
    while alive(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(server), "MLflow server processes left behind"
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "port still served"
    # the server's own lines went to its log, not the terminal
    assert "Uvicorn running" in Path(log).read_text()
    for line in ("Uvicorn", "INFO", "Started server process", "Security middleware"):
        assert line not in out.text, out.text[-3000:]
    return True


# -- every python snippet runs (or its twin does) ------------------------------------------
def test_environment_snippet_runs():
    namespace: dict = {}
    exec(compile(snippet("env = gymnasium.make("), "README.md", "exec"), namespace)
    assert namespace["obs"].shape == namespace["env"].observation_space.shape
    assert namespace["info"]["measured"]["bytes_per_step"] > 0


#: What a user's script holds before the collectives snippets: model, optimizer, data.
_PRELUDE = """
import torch
from torch.nn.parallel import DistributedDataParallel
torch.manual_seed(rank)  # different on purpose: construction broadcasts rank 0's
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
loader = [(torch.randn(4, 8, generator=g), torch.randint(4, (4,), generator=g)) for _ in range(3)]
loss_fn = torch.nn.functional.cross_entropy
"""

#: Before the DDP-hook snippet: the user's DDP model.
_DDP_MODEL = "ddp_model = DistributedDataParallel(model)\n"

#: After the DDP-hook snippet: training steps through the hook, as a user's loop does.
_DDP_STEP = """
for x, y in loader:
    opt.zero_grad()
    loss_fn(ddp_model(x), y).backward()
    opt.step()
"""


def rank_exec(rank: int, world: int, code: str) -> list[float]:
    """Run ``code`` on this rank (the pool's process group stands in for torchrun's)."""
    from unittest import mock

    import torch
    import torch.distributed as dist

    namespace = {"rank": rank}
    with mock.patch.object(dist, "init_process_group", lambda *a, **k: None):
        exec(compile(code, "README.md", "exec"), namespace)
    model = namespace["model"]
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


@pytest.mark.parametrize(
    ("key", "before", "after"),
    [
        ("sync = GradientSynchronizer(", "", ""),
        ("state, hook = ddp_comm_hook(", _DDP_MODEL, _DDP_STEP),
    ],
)
def test_collectives_snippet_runs_on_two_ranks(dist2, key, before, after):
    code = _PRELUDE + before + snippet(key) + after
    params = dist2.run(rank_exec, code)
    assert params[0] == params[1]  # replicas identical after the snippet's training steps


def test_scheduler_snippet_twin_follows_it():
    """The README's CommScheduler loop is train_real_loop.py's (run above); both examples
    shut down in the order the README documents."""
    twin = (REPO / "experiments" / "examples" / "train_real_loop.py").read_text()
    code = snippet("sched = CommScheduler(")
    calls = set(re.findall(r"\b(?:sched|torch|dist|gc)\.[\w.]+\(", code))
    missing = [c for c in sorted(calls) if c not in twin]
    assert not missing, f"the twin lacks the README loop's calls: {missing}"
    # the shutdown order both show: close, free the scheduler, meet, destroy the group
    order = ["sched.close()", "del sched", "gc.collect()", "dist.barrier()",
             "dist.destroy_process_group()"]  # fmt: skip
    minimal = (REPO / "experiments" / "examples" / "train_with_scheduler.py").read_text()
    for name, text in (("README", code), ("train_real_loop.py", twin),
                       ("train_with_scheduler.py", minimal)):  # fmt: skip
        at = [text.find(step) for step in order]
        assert -1 not in at and at == sorted(at), (name, dict(zip(order, at, strict=True)))


def test_the_docs_agent_list_is_the_registry_and_each_is_trained():
    """`--agent` "takes every agent of the registry (...)" (docs/quickstart.md): the list is the
    registry's, and
    tests/experiments/test_agents_train.py trains each of them through `train`."""
    from commgym.agents import AGENTS
    from tests.experiments.test_agents_train import NAMES, NEEDS_CALIBRATION

    text = " ".join((REPO / "docs" / "quickstart.md").read_text().split())
    claim = re.search(r"takes every agent of the registry \((.*?)\), or `--config", text)
    assert claim, "docs/quickstart.md: the list of what `commgym train --agent` takes is gone"
    listed = [s.split(":", 1)[0] for s in re.findall(r"`([^`]+)`", claim[1])]
    assert len(listed) == len(set(listed)) and set(listed) == set(AGENTS), sorted(
        set(listed) ^ set(AGENTS)
    )
    # trained through `train` there, but for agents that need a calibration record first
    # (refused without it there; trained by their own tests)
    assert {n.split(":", 1)[0] for n in NAMES} | NEEDS_CALIBRATION == set(AGENTS)
