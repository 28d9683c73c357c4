"""Every third-party module the package imports is a declared dependency: a plain `pip install .` runs."""

import ast
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FILES = [*ROOT.glob("*.py"), *(p for d in ("cli", "models", "trainer", "tokenization")
                                       for p in (ROOT / d).rglob("*.py"))]
DISTRIBUTION = {"yaml": "pyyaml"}  # import name -> distribution name, where they differ


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def _imported_top_level(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"tfkit", "__future__"}


def test_package_imports_only_declared_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = _requirement_names(project["dependencies"])
    extras = project["optional-dependencies"]
    optional = _requirement_names(extras["plots"] + extras["data"] + extras["export"] + extras["trackers"])  # imported on use
    undeclared = {}
    for path in PACKAGE_FILES:
        for name in _imported_top_level(path):
            if DISTRIBUTION.get(name, name) not in required | optional:
                undeclared.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not undeclared, f"imported but not in [project.dependencies]: {undeclared}"


def test_the_library_never_needs_transformers():
    """transformers is a test extra (an independent reference), never a runtime need."""
    users = [str(p.relative_to(ROOT)) for p in PACKAGE_FILES if "transformers" in _imported_top_level(p)]
    assert users == []
