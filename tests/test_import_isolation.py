"""Package boundaries: what each package may import, checked on the source (AST).

A ``sys.modules`` check after ``import commgym.env`` misses an import placed inside a
function; reading every ``import`` statement of every module, wherever it sits, does not.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# third-party distributions each package may import (the standard library is always allowed)
ALLOWED = {
    # torch only, plus the kernel backends behind collectives.kernels: triton (GPU) and
    # numba/llvmlite with numpy arrays (fused CPU kernels)
    "collectives": {"torch", "triton", "numba", "llvmlite", "numpy"},
    # never stable-baselines3 or MLflow: the env must run without the agent/tracking stack
    "env": {"torch", "numpy", "gymnasium", "sklearn", "scipy", "joblib", "pyarrow", "pandas"},
}
FORBIDDEN = {
    "collectives": {"gymnasium", "stable_baselines3", "mlflow", "sklearn", "commgym.env"},
    "env": {"stable_baselines3", "mlflow", "commgym.agents", "commgym.experiments"},
}


def imported_modules(package: str) -> dict[str, set[str]]:
    """Every module named by an import statement (top level or nested) per source file."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in (
                "import_module",
                "__import__",
            ):
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names.add(arg.value)
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_its_dependencies(package):
    bad = []
    for path, names in imported_modules(package).items():
        for name in names:
            top = name.split(".")[0]
            if top == "commgym":
                if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[package]):
                    bad.append((path, name))
                continue
            if top in sys.stdlib_module_names or top == "__future__":
                continue
            if top in FORBIDDEN[package] or top not in ALLOWED[package]:
                bad.append((path, name))
    assert not bad, f"{package} imports outside its allowed set {sorted(ALLOWED[package])}: {bad}"


def test_collectives_does_not_import_env():
    for path, names in imported_modules("collectives").items():
        assert not any(n.startswith("commgym.env") for n in names), path


def test_checker_sees_imports_inside_functions(tmp_path, monkeypatch):
    pkg = tmp_path / "env"
    pkg.mkdir()
    (pkg / "lazy.py").write_text(
        "def f():\n    import mlflow\n    return importlib.import_module('stable_baselines3')\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert imported_modules("env") == {"env/lazy.py": {"mlflow", "stable_baselines3"}}
