"""A name that starts with `_` is its module's own: no other tfkit module imports it. What two modules share is
public in the module that owns it, named for what it is (`batches.PureDataset`, `readers.jsonl_records`), so a
reader sees from a module's names what other modules rely on, and a private helper can change freely.

Read from the source with `ast`, as tests/test_layering.py reads the layers; the checker is also run on bad
snippets, so a checker that can no longer fail is itself a failure."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root is the `tfkit` package
# tests may reach into a module's private helpers to check them; a virtualenv beside the package is not tfkit
PACKAGES = tuple(sorted(p.parent for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests"))


def package_modules() -> list[Path]:
    return sorted(ROOT.glob("*.py")) + sorted(p for package in PACKAGES for p in package.rglob("*.py"))


def private_imports(tree: ast.Module) -> list[str]:
    """`from X import _name` (or `import tfkit.x._mod`) of a tfkit module, anywhere in a module (a relative
    import, or one of `tfkit.`); dunder names (`__version__`) are public."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "tfkit"):
            module = "." * node.level + (node.module or "")
            parts = [*module.strip(".").split("."), *(alias.name for alias in node.names)]
            found += [f"line {node.lineno}: from {module} import {alias.name}" for alias in node.names
                      if _private(alias.name) or any(_private(part) for part in parts[:-len(node.names)])]
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {alias.name}" for alias in node.names
                      if alias.name.split(".")[0] == "tfkit" and any(map(_private, alias.name.split(".")))]
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_module_imports_another_modules_private_names() -> None:
    checked = package_modules()
    some = {ROOT / "jsonfile.py", ROOT / "tokenization" / "task_batches.py", ROOT / "benchmarks" / "run.py"}
    assert some <= set(checked)
    found = {str(p.relative_to(ROOT)): bad for p in checked
             if (bad := private_imports(ast.parse(p.read_text(encoding="utf-8"), filename=str(p))))}
    assert found == {}


def test_the_checker_catches_bad_code() -> None:
    """Each spelling of a private import is found, inside a function too; public and dunder names are not."""
    for source in ("from .batches import _pad", "from .batches import PureDataset, _pad",
                   "def f():\n    from ..tokenization.pairs import _jsonl_records\n",
                   "from tfkit.tokenization.stdlib_corpus import _docstrings", "from ._private import name",
                   "import tfkit.tokenization._private"):
        assert private_imports(ast.parse(source)), source
    for source in ("from .batches import PureDataset", "from .. import __version__", "from torch import _dynamo",
                   "import torch._dynamo", "from ..ranges import hints as _hints"):
        assert private_imports(ast.parse(source)) == [], source
