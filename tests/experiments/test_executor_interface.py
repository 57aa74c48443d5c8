"""One executor interface (DESIGN rule 14, STYLE 7f): no ``None`` executor, no local/Ray twins.

Reads the source tree: a branch on ``executor is None`` / ``is not None`` or a function
written twice, once for each executor (``_compare_on_ray``, ``record_on_ray``, ...), fails
here; the executors answer the same protocol; the old module path still imports, warning.
"""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    p
    for package in ("collectives", "env", "agents", "experiments")
    for p in sorted((ROOT / package).rglob("*.py"))
]
NONE_BRANCH = re.compile(r"\bexecutor\s+is\s+(not\s+)?None\b|\bexecutor\s*[!=]=\s*None\b")
TWIN = re.compile(r"^\s*def\s+(\w*_on_ray|\w+_on_local|\w*_locally)\b", re.M)


def test_no_branch_on_a_missing_executor():
    found = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in SOURCES
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if NONE_BRANCH.search(line)
    ]
    assert not found, "code above the executor asks which one it has:\n" + "\n".join(found)


def test_no_local_and_ray_twin_functions():
    found = [
        f"{p.relative_to(ROOT)}: def {m.group(1)}"
        for p in SOURCES
        for m in TWIN.finditer(p.read_text())
    ]
    assert not found, "a function written again for one executor:\n" + "\n".join(found)


def test_the_checks_see_what_they_forbid(tmp_path):
    assert NONE_BRANCH.search("    if executor is not None:")
    assert NONE_BRANCH.search("env = None if executor is None else x")
    assert TWIN.search("def record_on_ray(\n") and TWIN.search("def _compare_on_ray(\n")
    assert not TWIN.search("def run_on(\n")


def test_open_executor_never_gives_none():
    from commgym.experiments.config import load_run_config
    from commgym.experiments.executors import Executor, LocalExecutor, open_executor

    with open_executor(load_run_config(None)) as executor:
        assert isinstance(executor, LocalExecutor)
        assert isinstance(executor, Executor)


def test_both_executors_answer_every_protocol_method():
    from commgym.experiments.executors import Executor, LocalExecutor, RayExecutor

    methods = [n for n in dir(Executor) if not n.startswith("_") or n in ("__enter__", "__exit__")]
    assert {"play", "search", "tune", "record", "start", "release"} <= set(methods)
    for cls in (LocalExecutor, RayExecutor):
        missing = [n for n in methods if not hasattr(cls, n)]
        assert not missing, (cls.__name__, missing)


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("commgym.experiments.executor", "commgym.experiments.executors", "open_executor"),
        ("commgym.agents.replay", "commgym.agents.scheduler", "CommScheduler"),
    ],
)
def test_an_old_module_path_imports_with_a_deprecation_warning(old, new, name):
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
