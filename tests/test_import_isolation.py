"""Package boundaries: what each package may import, checked on the source (AST).

A ``sys.modules`` check after ``import commgym.env`` misses an import placed inside a
function; reading every ``import`` statement of every module, wherever it sits, does not.

Three rules: dependencies point one way (``collectives <- env <- agents <- experiments``,
each package with its allowed third-party set); no module imports another module's
``_private`` name (a helper used elsewhere wants a public home); no two modules import
each other, directly or in a ring (type-only imports under ``TYPE_CHECKING`` included:
they, too, say that two modules cannot be read apart).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = ("collectives", "env", "agents", "experiments")

# third-party distributions each package may import (the standard library is always allowed)
ALLOWED = {
    # torch only, plus the kernel backends behind collectives.kernels: triton (GPU) and
    # numba/llvmlite with numpy arrays (fused CPU kernels)
    "collectives": {"torch", "triton", "numba", "llvmlite", "numpy"},
    # never stable-baselines3 or MLflow: the env must run without the agent/tracking stack
    # threadpoolctl (scikit-learn's own dependency): the surrogate fit's OpenMP thread limit
    "env": {"torch", "numpy", "gymnasium", "sklearn", "scipy", "joblib", "pyarrow", "pandas",
            "threadpoolctl"},
    # the learning stack, never MLflow: tracking hooks in from experiments (wrappers)
    # ray: the optional extra commgym[ray] (env actors, RayVecEnv), imported inside functions
    # sb3_contrib: RecurrentPPO (the recurrent-ppo agent)
    "agents": {"torch", "numpy", "gymnasium", "stable_baselines3", "sb3_contrib", "sklearn",
               "scipy", "rich", "tqdm", "ray"},
    "experiments": {"torch", "numpy", "gymnasium", "stable_baselines3", "sklearn", "scipy",
                    "mlflow", "yaml", "rich", "typer", "tqdm", "matplotlib", "pandas",
                    "pyarrow", "joblib", "ray"},
}  # fmt: skip
FORBIDDEN = {
    "collectives": {"gymnasium", "stable_baselines3", "mlflow", "sklearn", "commgym.env",
                    "commgym.agents", "commgym.experiments"},
    "env": {"stable_baselines3", "mlflow", "commgym.agents", "commgym.experiments"},
    "agents": {"mlflow", "commgym.experiments"},
    "experiments": set(),
}  # fmt: skip


#: Folders of scripts that are not modules of a package, relative to the root: a record's
#: reproduction script (``experiments/results/<record>/*.py``, no ``__init__``, never imported
#: by commgym) may use whatever its measurement needs, e.g. numba for a kernel variant.
NOT_PACKAGE_CODE = (Path("experiments") / "results",)


def package_sources(package: str, root: Path | None = None) -> list[Path]:
    """The package's ``*.py`` files under ``root`` (default :data:`ROOT`), without the
    scripts of :data:`NOT_PACKAGE_CODE`."""
    root = ROOT if root is None else root
    skip = [root / p for p in NOT_PACKAGE_CODE]
    return [
        p
        for p in sorted((root / package).rglob("*.py"))
        if not any(p.is_relative_to(s) for s in skip)
    ]


def imported_modules(package: str) -> dict[str, set[str]]:
    """Every module named by an import statement (top level or nested) per source file."""
    found: dict[str, set[str]] = {}
    for path in package_sources(package):
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


def module_name(root: Path, path: Path) -> str:
    """``commgym.<package>.<...>`` of a source file (``__init__`` names its package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return "commgym." + ".".join(parts)


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the four packages by name."""
    return {
        module_name(root, path): path
        for package in PACKAGES
        if (root / package).is_dir()
        for path in package_sources(package, root)
    }


def import_edges(root: Path = ROOT) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Which package modules each module imports, and every private name it imports.

    ``from a.b import c`` names module ``a.b.c`` when that is a module, else ``a.b``;
    imports anywhere count (inside functions and ``TYPE_CHECKING`` blocks too).

    Returns:
        ``(module -> imported package modules, [(module, from module, _name), ...])``;
        private names of other distributions (``torch._utils``) are theirs to keep.
    """
    modules = package_modules(root)
    edges: dict[str, set[str]] = {m: set() for m in modules}
    private: list[tuple[str, str, str]] = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges[name].update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    target = sub if sub in modules else node.module
                    if target in modules and target != name:
                        edges[name].add(target)
                    own = node.module == "commgym" or node.module.startswith("commgym.")
                    if own and alias.name.startswith("_") and target != name:
                        private.append((name, node.module, alias.name))
    return edges, private


def rings(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_another_modules_private_names():
    _, private = import_edges()
    assert not private, (
        "private names imported across modules (give each a public home): "
        + ", ".join(f"{m} imports {src}.{n}" for m, src, n in private)
    )


def test_no_two_modules_import_each_other_directly_or_in_a_ring():
    edges, _ = import_edges()
    assert len(edges) > 50  # the whole package was read
    assert not rings(edges), rings(edges)


def test_ring_and_private_checkers_see_what_they_should(tmp_path, monkeypatch):
    pkg = tmp_path / "env"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from commgym.env.b import helper\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from commgym.env import c\n"
    )
    (pkg / "c.py").write_text("def f():\n    from commgym.env.a import _private\n")
    (pkg / "sub" / "d.py").write_text("import commgym.env.sub\n")
    edges, private = import_edges(tmp_path)
    assert edges["commgym.env.a"] == {"commgym.env.b"}
    assert edges["commgym.env.b"] == {"commgym.env.c"}  # type-only counts
    assert edges["commgym.env.sub.d"] == {"commgym.env.sub"}
    assert private == [("commgym.env.c", "commgym.env.a", "_private")]
    assert rings(edges) == [["commgym.env.a", "commgym.env.b", "commgym.env.c"]]
    (pkg / "c.py").write_text("x = 1\n")
    assert rings(import_edges(tmp_path)[0]) == []
