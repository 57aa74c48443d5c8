"""Run records (``--record DIR``) and their generated index (``commgym results index``)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from commgym.experiments.records import (
    RESULTS,
    Recording,
    index_markdown,
    read_records,
    record_option,
    render_terminal,
    topic,
)

REPO = Path(__file__).resolve().parents[2]


def test_live_bars_render_as_their_final_state():
    raw = (
        "start\n\x1b[?25l  bar 1/3\r\x1b[2K  bar 2/3\r\x1b[2K  bar 3/3\n"
        "\x1b[31mred\x1b[0m table\n"
        "two-line live\nsecond\r\x1b[2K\x1b[1A\x1b[2Kfinal live\nend\n"
    )
    assert render_terminal(raw) == "start\n  bar 3/3\nred table\nfinal live\nend\n"


def test_a_recording_keeps_output_new_files_and_what_reproduces_it(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.csv").write_text("stale\n")
    old = (out / "old.csv").stat().st_mtime - 100
    import os

    os.utime(out / "old.csv", (old, old))
    monkeypatch.chdir(tmp_path)
    argv = ["commgym", "leaderboard", "--scenarios", "a/flaky.yaml", "--record", "r"]
    argv += ["--seeds", "2"]
    with Recording(tmp_path / "r", argv, [out], load_every_s=0.05) as rec:
        print("a table")
        (out / "sub").mkdir()
        (out / "sub" / "leaderboard-x.md").write_text("| x |\n")
        (out / "fig.png").write_bytes(b"png")
    folder = rec.folder
    assert folder.parent == tmp_path / "r" and folder.name.endswith("_leaderboard-flaky")
    assert (folder / "output.txt").read_text() == "a table\n"
    assert (folder / "sub" / "leaderboard-x.md").exists()
    assert not (folder / "old.csv").exists() and not (folder / "fig.png").exists()
    run = json.loads((folder / "run.json").read_text())
    assert run["argv"] == argv and run["exit"] == "ok"
    assert run["topic"] == "commgym leaderboard --scenarios a/flaky.yaml --seeds 2"
    assert re.fullmatch(r"[0-9a-f]{40}", run["commit"])
    assert run["reproduce"].startswith(f"git checkout {run['commit'][:12]} && commgym ")
    assert run["machine"]["cores"] >= 1 and run["machine"]["load_average"]["during_1min"]["samples"]
    assert run["versions"]["torch"] and run["files"] == ["output.txt", "sub/leaderboard-x.md"]
    assert type(sys.stdout).__name__ != "_Tee" and type(sys.stderr).__name__ != "_Tee"


def test_a_failed_run_is_recorded_as_failed(tmp_path):
    with pytest.raises(RuntimeError), Recording(tmp_path, ["commgym", "train"]) as rec:
        raise RuntimeError("ranks died")
    assert json.loads((rec.folder / "run.json").read_text())["exit"] == "failed (RuntimeError)"


def test_the_record_option_runs_the_command_inside_a_recording(tmp_path, monkeypatch):
    app = typer.Typer()
    seen = {}

    @app.command()
    @record_option(lambda kw: [kw["out"]])
    def bench(out: str = "o", json_path: str | None = None) -> None:
        seen["json"] = json_path
        Path(out).mkdir(exist_ok=True)
        Path(out, "t.csv").write_text("1\n")
        print("measured")

    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(app, ["--help"]).output.count("--record") == 1
    res = CliRunner().invoke(app, ["--record", "rec"])
    assert res.exit_code == 0, res.output
    [folder] = (tmp_path / "rec").iterdir()
    assert Path(seen["json"]).resolve() == folder / "results.json"
    assert (folder / "t.csv").exists() and "measured" in (folder / "output.txt").read_text()
    res = CliRunner().invoke(app, [])
    assert res.exit_code == 0 and seen["json"] is None
    assert len(list((tmp_path / "rec").iterdir())) == 1


#: The commands whose runs are recorded (a new benchmark adds ``@record_option()`` and a name here).
RECORDED = ("train", "evaluate", "leaderboard", "bench sync", "bench kernels", "bench env",
            "bench netem", "bench collectives", "bench surrogate", "bench surrogate-holdout",
            "bench executor", "bench sim", "calibrate-sim")  # fmt: skip


def test_every_recorded_command_offers_record():
    from typer.main import get_command

    from commgym.experiments.cli import app

    root = get_command(app)
    for path in (name.split() for name in RECORDED):
        cmd = root
        for name in path:
            cmd = cmd.commands[name]
        assert any("--record" in p.opts for p in cmd.params), path


def _fake(root: Path, name: str, started: str, argv: list[str], **extra) -> None:
    (root / name).mkdir(parents=True)
    run = {"started": started, "argv": argv, "topic": topic(argv), "commit": "abc1234def",
           "machine": {"cores": 2, "load_average": {"during_1min": {"mean": 1.0, "max": 2.0}}},
           **extra}  # fmt: skip
    (root / name / "run.json").write_text(json.dumps(run))


def test_the_index_is_newest_first_and_marks_superseded_records(tmp_path):
    lb = ["commgym", "leaderboard", "--scenarios", "flaky-link", "--seeds", "3"]
    _fake(tmp_path, "a", "2026-12-01T10:00:00+00:00", [*lb, "--output-dir", "x"])
    _fake(tmp_path, "b", "2026-12-02T10:00:00+00:00", [*lb, "--record", "r"])
    _fake(tmp_path, "c", "2026-12-03T10:00:00+00:00", ["commgym", "bench", "env"],
          supersedes=["d"], transcribed={"from": "README.md"})  # fmt: skip
    _fake(tmp_path, "d", "2026-11-30T10:00:00+00:00", ["commgym", "bench", "env", "--json", "j"])
    text = index_markdown(tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| 2026")]
    assert [r.split("|")[2].strip()[1:2] for r in rows] == ["c", "b", "a", "d"]
    assert "**current**" in rows[0] and "transcribed" in rows[0]
    assert "**current**" in rows[1] and "superseded by [b]" in rows[2]
    assert "superseded by [c]" in rows[3]
    assert [f.name for f, _ in read_records(tmp_path)] == ["c", "b", "a", "d"]


def test_results_index_command_writes_the_index(tmp_path):
    from commgym.experiments.cli import app

    _fake(tmp_path, "a", "2026-12-01T10:00:00+00:00", ["commgym", "train"])
    res = CliRunner().invoke(app, ["results", "index", "--dir", str(tmp_path)])
    assert res.exit_code == 0 and "1 records" in res.output
    assert (tmp_path / "README.md").read_text() == index_markdown(tmp_path)


def test_the_repositorys_index_is_generated_not_written_by_hand():
    assert (RESULTS / "README.md").read_text() == index_markdown(RESULTS), (
        "experiments/results/README.md is stale: run `commgym results index`"
    )


def test_every_record_names_its_commit_and_command():
    found = read_records(RESULTS)
    assert found
    for folder, run in found:
        assert run.get("commit") and run.get("reproduce") and run.get("argv"), folder.name
        assert run.get("machine", {}).get("cores"), folder.name
        for name in run.get("files", []):
            assert (folder / name).exists(), (folder.name, name)


def test_every_record_that_readme_and_docs_link_exists():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    linked = set()
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]*experiments/results/[^)#\s]+)", page.read_text()):
            if not target.endswith("README.md"):  # the index itself
                linked.add((page.name, (page.parent / target).resolve()))
    assert linked
    for page, target in sorted(linked):
        assert target.is_dir() and (target / "run.json").exists(), (page, target)
