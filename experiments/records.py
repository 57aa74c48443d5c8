"""Run records: one folder per recorded run, written by the command that ran it.

``--record DIR`` on ``train``, ``evaluate``, ``leaderboard`` and the ``bench`` commands
(:func:`record_option`) makes the command write ``DIR/<date>_<time>_<command>/``:

* ``output.txt``: what the command printed (stdout and stderr of the command's process,
  progress bars rendered as their final state, colours dropped); the ranks' own output
  goes where it always goes;
* the tables and data it wrote (``.md``, ``.csv``, ``.json``, ``.txt`` files of its output
  folder that the run created or changed; a benchmark's ``--json`` lands in the record);
* ``run.json``: what reproduces it and what it ran on: commit (and whether the tree was
  dirty), full argv, working folder, start and end (UTC), wall seconds, how it ended,
  machine (cores, CPU model, memory, host), the load average sampled during the run,
  library versions, and ``reproduce``: the command line that runs it again.

``DIR/README.md`` is the index of every record there, newest first, current or
superseded (:func:`write_index`, ``commgym results index``): a record is superseded by
a newer one of the same ``topic`` (its command line without ``--record``,
``--output-dir`` and ``--policy-dir``), or by one that names it in ``supersedes``. A
record transcribed from elsewhere (the README's dated reports) says so in
``transcribed``; its ``notes.md`` holds the report as it was written.

Records are reproduced by their ``run.json``, not by the test suite.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import inspect
import io
import json
import os
import platform
import re
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = [
    "LoadSampler",
    "Recording",
    "index_markdown",
    "machine",
    "read_records",
    "record_option",
    "render_terminal",
    "versions",
    "write_index",
]

#: Where the repository keeps its records (relative to the checkout's root).
RESULTS = Path(__file__).resolve().parent / "results"
#: Files of a command's output folder that a record keeps (figures and models stay out).
KEPT_SUFFIXES = (".md", ".csv", ".json", ".txt")
#: Largest output file a record copies, bytes (a decisions CSV of a long run can be large).
MAX_FILE_BYTES = 5_000_000
#: Options left out of a record's topic: where it wrote, not what it ran.
_NOT_TOPIC = ("--record", "--output-dir", "--policy-dir", "--json")
#: Libraries whose versions a record names.
_LIBRARIES = (
    "torch", "numpy", "gymnasium", "stable-baselines3", "scikit-learn", "mlflow", "ray",
    "numba", "triton",
)  # fmt: skip


# -- what a run ran on ------------------------------------------------------------------------
def versions() -> dict[str, str]:
    """Python's and the libraries' versions (``"not installed"`` where missing)."""
    out = {"python": platform.python_version()}
    for dist in ("commgym", *_LIBRARIES):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def machine() -> dict[str, Any]:
    """The host: cores (online and usable by this process), CPU model, memory, OS."""
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gb = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = round(int(line.split()[1]) / 2**20, 1)
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return {
        "hostname": platform.node(),
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "cpu": cpu or platform.processor(),
        "memory_gb": mem_gb,
        "os": platform.platform(),
        "gpu": _gpu(),
    }


def _gpu() -> str | None:
    """The first CUDA device's name, if torch is loaded and sees one (never imports torch)."""
    torch = sys.modules.get("torch")
    try:
        return torch.cuda.get_device_name(0) if torch and torch.cuda.is_available() else None
    except Exception:
        return None


class LoadSampler:
    """Samples the 1-minute load average every ``every_s`` seconds while it runs (a thread)."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = []
        self.at_start = list(os.getloadavg())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="record-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.every_s):
                return

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the load figures of a ``run.json``."""
        self._stop.set()
        self._thread.join(5)
        samples = self.samples or [os.getloadavg()[0]]
        return {
            "at_start_1_5_15min": [round(x, 2) for x in self.at_start],
            "at_end_1_5_15min": [round(x, 2) for x in os.getloadavg()],
            "during_1min": {
                "min": round(min(samples), 2),
                "mean": round(sum(samples) / len(samples), 2),
                "max": round(max(samples), 2),
                "samples": len(samples),
                "every_s": self.every_s,
            },
        }


# -- what a run printed -----------------------------------------------------------------------
_CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


def render_terminal(raw: str) -> str:
    """The text a terminal would show after ``raw``: what rich's live bars leave on screen.

    Handles what rich's live display writes (carriage return, erase line, cursor up, hide
    and show cursor) and drops every other escape sequence (colours).
    """
    lines = [""]
    pos = 0
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\x1b":
            m = _CSI.match(raw, i)
            if m is None:
                i += 1
                continue
            arg, op = m.groups()
            if op == "A":  # cursor up n
                for _ in range(int(arg or 1)):
                    if len(lines) > 1:
                        lines.pop()
                pos = min(pos, len(lines[-1]))
            elif op == "K":  # erase line (rich erases the whole line)
                lines[-1] = ""
                pos = 0
            i = m.end()
            continue
        if ch == "\r":
            pos = 0
        elif ch == "\n":
            lines.append("")
            pos = 0
        else:
            line = lines[-1]
            lines[-1] = line[:pos] + ch + line[pos + 1 :]
            pos += 1
        i += 1
    return "\n".join(line.rstrip() for line in lines).rstrip() + "\n"


class _Tee(io.TextIOBase):
    """A text stream that writes to ``stream`` and to ``copy`` (a terminal stays a terminal)."""

    def __init__(self, stream: Any, copy: Any) -> None:
        self.stream, self.copy = stream, copy

    def write(self, text: str) -> int:
        self.stream.write(text)
        with contextlib.suppress(ValueError):  # copy closed: the record has ended
            self.copy.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        with contextlib.suppress(ValueError):
            self.copy.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")


# -- one recorded run -------------------------------------------------------------------------
def _git(*args: str) -> str | None:
    import subprocess

    try:
        res = subprocess.run(
            ["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True,
            text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def topic(argv: Sequence[str]) -> str:
    """What a run ran, from its argv: the command line without where it wrote."""
    words, out = list(argv), []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        name = w.split("=", 1)[0]
        if name in _NOT_TOPIC:
            skip = "=" not in w
            continue
        out.append(w)
    return shlex.join(out)


def _slug(argv: Sequence[str]) -> str:
    """``leaderboard-flaky-link``: the command words and a scenario or config, filename-safe."""
    words = []
    for w in argv:  # the command's words, up to its first option
        if w.startswith("-"):
            break
        words.append(w)
    for flag in ("--scenarios", "--config", "--compressors", "--profiles"):
        if flag in argv and argv.index(flag) + 1 < len(argv):
            words.append(Path(argv[argv.index(flag) + 1].split(",")[0]).stem)
            break
    return re.sub(r"[^A-Za-z0-9.-]+", "-", "-".join(words)).strip("-")[:60] or "run"


class Recording:
    """A context manager that records the command running inside it into ``root/<name>/``.

    Args:
        root: the records folder (created if missing).
        argv: the full command line, program first (``["commgym", "leaderboard", ...]``).
        outputs: folders whose new or changed kept files (:data:`KEPT_SUFFIXES`) are
            copied into the record at the end (missing ones are skipped).
        load_every_s: period of the load-average samples.

    Attributes:
        folder: the record's folder (set on entry).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        argv: Sequence[str],
        outputs: Sequence[str | os.PathLike[str]] = (),
        load_every_s: float = 5.0,
    ) -> None:
        self.root = Path(root)
        self.argv = list(argv)
        self.outputs = [Path(p) for p in outputs]
        self.load_every_s = load_every_s
        self.folder: Path | None = None

    def __enter__(self) -> Recording:
        self.started = datetime.now(UTC)
        self.t0 = time.time()
        name = f"{self.started:%Y-%m-%d_%H%M%S}_{_slug(self.argv[1:])}"
        self.root.mkdir(parents=True, exist_ok=True)
        folder, n = self.root / name, 1
        while folder.exists():
            n += 1
            folder = self.root / f"{name}-{n}"
        folder.mkdir()
        self.folder = folder
        self._raw = open(folder / ".output.raw", "w", encoding="utf-8")
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = _Tee(sys.stdout, self._raw)  # type: ignore[assignment]
        sys.stderr = _Tee(sys.stderr, self._raw)  # type: ignore[assignment]
        self._load = LoadSampler(self.load_every_s)
        self._commit = _git("rev-parse", "HEAD")
        status = _git("status", "--porcelain", "--untracked-files=no")
        self._dirty = None if status is None else bool(status)
        return self

    def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
        assert self.folder is not None
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = self._streams
        self._raw.close()
        raw = self.folder / ".output.raw"
        (self.folder / "output.txt").write_text(render_terminal(raw.read_text(encoding="utf-8")))
        raw.unlink()
        files = self._copy_outputs()
        ended = "ok"
        if kind is not None:
            code = getattr(err, "exit_code", getattr(err, "code", None))
            if code in (0, None) and issubclass(kind, SystemExit):
                ended = "ok"
            elif issubclass(kind, KeyboardInterrupt):
                ended = f"interrupted ({err or 'Ctrl-C'})"
            else:
                ended = f"failed ({kind.__name__}{f': exit status {code}' if code else ''})"
        commit = self._commit or "unknown"
        argv = self.argv
        run = {
            "command": shlex.join(argv),
            "argv": argv,
            "topic": topic(argv),
            "cwd": os.getcwd(),
            "commit": commit,
            "dirty": self._dirty,
            "started": self.started.isoformat(timespec="seconds"),
            "ended": datetime.now(UTC).isoformat(timespec="seconds"),
            "wall_s": round(time.time() - self.t0, 1),
            "exit": ended,
            "machine": {**machine(), "load_average": self._load.stop()},
            "versions": versions(),
            "files": ["output.txt", *files],
            # run from ``cwd`` in a checkout of ``commit`` (installed as the README says)
            "reproduce": f"git checkout {commit[:12]} && {shlex.join(argv)}",
        }
        (self.folder / "run.json").write_text(json.dumps(run, indent=2) + "\n")
        print(f"recorded: {self.folder} (run.json, {len(run['files'])} files)", file=sys.stderr)

    def _copy_outputs(self) -> list[str]:
        """Copy the kept files the run created or changed under its output folders."""
        assert self.folder is not None
        copied: list[str] = []
        for base in self.outputs:
            if not base.is_dir():
                continue
            for path in sorted(base.rglob("*")):
                if (
                    path.is_file()
                    and path.suffix in KEPT_SUFFIXES
                    and path.stat().st_mtime >= self.t0 - 1
                    and path.stat().st_size <= MAX_FILE_BYTES
                    and self.folder not in path.parents
                ):
                    rel = path.relative_to(base)
                    dest = self.folder / rel
                    if dest.exists():  # two output folders with the same file name
                        dest = self.folder / f"{base.name}-{rel}"
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, dest)
                    copied.append(str(dest.relative_to(self.folder)))
        return copied


# -- the --record option ----------------------------------------------------------------------
#: Help of ``--record``.
RECORD_HELP = (
    "Record this run: a folder under DIR (e.g. experiments/results/) with what it printed, "
    "its tables and JSON, and run.json (commit, argv, date, machine, load, versions, the "
    "command that reproduces it)."
)


def record_option(
    outputs: Callable[[dict[str, Any]], Sequence[str | os.PathLike[str]]] = lambda kw: (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command ``--record DIR`` (decorate the command above its ``own_options``).

    The command runs inside :class:`Recording` when ``--record`` is given. A ``json_path``
    parameter left unset (a benchmark's ``--json``) is pointed into the record.

    Args:
        outputs: the command's keyword arguments -> the folders whose files the record
            keeps (``overrides`` included for a config command).
    """
    import typer

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(func)
        option = inspect.Parameter(
            "record",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, "--record", metavar="DIR", help=RECORD_HELP),
            annotation=str | None,
        )
        params = list(sig.parameters.values())
        at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
        params.insert(at, option)
        params.sort(key=lambda p: p.kind)  # keyword-only after the others

        @functools.wraps(func)
        def command(*args: Any, record: str | None = None, **kwargs: Any) -> Any:
            if record is None:
                return func(*args, **kwargs)
            with Recording(record, ["commgym", *sys.argv[1:]], outputs(kwargs)) as rec:
                if "json_path" in kwargs and kwargs["json_path"] is None:
                    kwargs["json_path"] = str(rec.folder / "results.json")
                return func(*args, **kwargs)

        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        return command

    return decorate


# -- the index --------------------------------------------------------------------------------
def read_records(root: str | os.PathLike[str] = RESULTS) -> list[tuple[Path, dict[str, Any]]]:
    """Every record under ``root`` (folders with a ``run.json``), newest first."""
    found = []
    for path in Path(root).glob("*/run.json"):
        with contextlib.suppress(ValueError):
            found.append((path.parent, json.loads(path.read_text())))
    return sorted(found, key=lambda r: (r[1].get("started", ""), r[0].name), reverse=True)


def _superseded(records: list[tuple[Path, dict[str, Any]]]) -> dict[str, str]:
    """Record name -> the newer record that supersedes it."""
    out: dict[str, str] = {}
    seen: dict[str, str] = {}
    for folder, run in records:  # newest first
        for old in run.get("supersedes", []):
            out.setdefault(old, folder.name)
        key = run.get("topic") or topic(run.get("argv", []))
        if key in seen:
            out.setdefault(folder.name, seen[key])
        else:
            seen[key] = folder.name
    return out


def _title(folder: Path, run: dict[str, Any]) -> str:
    if run.get("title"):
        return str(run["title"])
    notes = folder / "notes.md"
    if notes.exists():
        for line in notes.read_text().splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    return run.get("topic") or run.get("command", "")


def _measured_on(run: dict[str, Any]) -> str:
    m = run.get("machine", {})
    load = m.get("load_average", {})
    during = load.get("during_1min") if isinstance(load, dict) else None
    if during:
        load_text = f"load {during['mean']:.1f} (max {during['max']:.1f})"
    else:
        load_text = str(m.get("load", "load not recorded"))
    cores = m.get("cores")
    where = f"{cores} cores" if cores else "cores not recorded"
    if m.get("gpu"):
        where += f", {m['gpu']}"
    return f"{where}, {load_text}"


def index_markdown(root: str | os.PathLike[str] = RESULTS) -> str:
    """The index of ``root``'s records (what ``commgym results index`` writes)."""
    records = read_records(root)
    superseded = _superseded(records)
    lines = [
        "# Recorded runs",
        "",
        "Generated by `commgym results index` from each record's `run.json`; do not edit by",
        "hand. Newest first. A record is written by the command that ran (`--record DIR` on",
        "`train`, `evaluate`, `leaderboard` and `bench ...`); `transcribed` ones were copied",
        "from the README's dated reports of commit 8918342 (figures as recorded there).",
        "Reproduce a record with its `run.json`'s `reproduce` command.",
        "",
        "| date (UTC) | record | what | measured on | commit | source | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for folder, run in records:
        date = str(run.get("started", ""))[:16].replace("T", " ")
        source = "transcribed" if run.get("transcribed") else "recorded"
        by = superseded.get(folder.name)
        status = f"superseded by [{by}]({by}/)" if by else "**current**"
        title = _title(folder, run).replace("|", "\\|")
        lines.append(
            f"| {date} | [{folder.name}]({folder.name}/) | {title} | {_measured_on(run)} | "
            f"`{str(run.get('commit', 'unknown'))[:7]}` | {source} | {status} |"
        )
    if not records:
        lines.append("| | (no records yet) | | | | | |")
    return "\n".join(lines) + "\n"


def write_index(root: str | os.PathLike[str] = RESULTS) -> Path:
    """Write ``root/README.md`` (:func:`index_markdown`); its path."""
    out = Path(root) / "README.md"
    out.write_text(index_markdown(root))
    return out
