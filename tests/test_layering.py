"""The layers of the package, read from the source with `ast`: cli -> lab -> evaluation -> trainer -> checkpoints ->
models -> tokenization -> root modules. A lower layer never imports a higher one (imports inside functions included), and every
rename or temporary folder goes through files.py, the one room for file safety.

Each checker is also run on a bad snippet, so a checker that can no longer fail is itself a failure."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root is the `tfkit` package
ROOT_MODULES = tuple(sorted(p.name for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "__main__.py")))
SUBPACKAGES = tuple(sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "benchmarks"))
# Highest first: a layer may import the layers after it (and the root modules), never one before it.
LAYERS = ("cli", "lab", "evaluation", "trainer", "checkpoints", "models", "tokenization")
DATA_PACKAGES = ("recipes",)  # YAML shipped in the wheel; no code to layer
FORBIDDEN_CALLS = {("os", "replace"), ("os", "rename"), ("shutil", "move"), ("tempfile", "mkdtemp")}


def modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def package_modules() -> list[Path]:
    return sorted(ROOT.glob("*.py")) + modules(*SUBPACKAGES)


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def imported(tree: ast.Module, path: Path) -> set[str]:
    """Every absolute module name the module at `path` imports, anywhere in it; `from X import y` adds both
    X and X.y (y may be a submodule: `from .. import trainer`)."""
    package = ["tfkit", *path.relative_to(ROOT).parent.parts]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            names |= {stem, *(f"{stem}.{alias.name}" for alias in node.names)}
    return names


def imports_of(tree: ast.Module, path: Path, subpackages: tuple[str, ...]) -> list[str]:
    """The imports of `path` that reach into any of `subpackages` of tfkit."""
    return sorted(name for name in imported(tree, path)
                  if any(name == f"tfkit.{sub}" or name.startswith(f"tfkit.{sub}.") for sub in subpackages))


def renames(tree: ast.Module) -> list[str]:
    """Calls that rename or stage files by themselves: os.replace/os.rename/shutil.move/tempfile.mkdtemp
    (also imported bare), any `.rename(...)`, and a `.replace(x)` with one argument and no keyword
    (Path.replace; str.replace takes two, dataclasses.replace keywords)."""
    found = []
    bare = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            bare |= {alias.asname or alias.name for alias in node.names if (node.module, alias.name) in FORBIDDEN_CALLS}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            path_replace = func.attr == "replace" and len(node.args) == 1 and not node.keywords
            if func.attr == "rename" or (owner, func.attr) in FORBIDDEN_CALLS or path_replace:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(func, ast.Name) and func.id in bare:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_models_and_tokenization_import_neither_the_trainer_nor_the_cli() -> None:
    found = {str(p.relative_to(ROOT)): bad for p in modules("checkpoints", "models", "tokenization")
             if (bad := imports_of(parse(p), p, ("trainer", "cli")))}
    assert found == {}


def test_every_subpackage_has_its_layer() -> None:
    assert sorted(set(SUBPACKAGES) - set(DATA_PACKAGES)) == sorted(LAYERS)


def test_each_layer_imports_only_the_layers_below_it() -> None:
    found = {str(p.relative_to(ROOT)): bad for i, layer in enumerate(LAYERS) for p in modules(layer)
             if (bad := imports_of(parse(p), p, LAYERS[:i]))}
    assert found == {}


def test_root_modules_import_no_subpackage() -> None:
    found = {name: bad for name in ROOT_MODULES
             if (bad := imports_of(parse(ROOT / name), ROOT / name, SUBPACKAGES))}
    assert found == {}


def test_only_files_py_renames_or_makes_temporary_folders() -> None:
    checked = [p for p in package_modules() if p != ROOT / "files.py"]
    assert ROOT / "checkpoints" / "weights.py" in checked and ROOT / "cli" / "evaluate.py" in checked
    found = {str(p.relative_to(ROOT)): bad for p in checked if (bad := renames(parse(p)))}
    assert found == {}


def test_the_checkers_catch_bad_code() -> None:
    """Each checker fails on a snippet that breaks its rule, wherever in the module the line is."""
    path = ROOT / "models" / "example.py"
    lazy = ast.parse("def f():\n    from ..trainer.checkpoint import TRAINER_STATE\n")
    assert imports_of(lazy, path, ("trainer", "cli")) == ["tfkit.trainer.checkpoint",
                                                          "tfkit.trainer.checkpoint.TRAINER_STATE"]
    for source in ("from .. import cli", "import tfkit.cli.main", "from tfkit.trainer import run"):
        assert imports_of(ast.parse(source), path, ("trainer", "cli")), source
    trainer_module = ROOT / "trainer" / "example.py"
    assert imports_of(ast.parse("from ..lab.engine import run"), trainer_module, LAYERS[:3]) == [
        "tfkit.lab.engine", "tfkit.lab.engine.run"]
    assert imports_of(ast.parse("from .errors import ConfigError\nfrom .layout import WEIGHTS"), ROOT / "files.py",
                      SUBPACKAGES) == []
    assert imports_of(ast.parse("from .models.hf_names import EXPORT_ARCHITECTURE"), ROOT / "files.py",
                      SUBPACKAGES) == ["tfkit.models.hf_names", "tfkit.models.hf_names.EXPORT_ARCHITECTURE"]
    for source in ("os.replace(a, b)", "os.rename(a, b)", "shutil.move(a, b)", "tempfile.mkdtemp(dir=d)",
                   "tmp.rename(out)", "Path(tmp).rename(out)", "f.replace(out / f.name)",
                   "from tempfile import mkdtemp\nmkdtemp()", "def f():\n    os.replace(a, b)"):
        assert renames(ast.parse(source)), source
    for source in ('text.replace("[MASK]", mask)', "dataclasses.replace(cfg, n_kv_heads=2)", "os.path.join(a, b)"):
        assert renames(ast.parse(source)) == [], source


# --- no import cycles: imports at module level, inside functions and under TYPE_CHECKING alike ----------------


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(["tfkit", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def import_graph(sources: dict[str, tuple[Path, ast.Module]]) -> dict[str, set[str]]:
    """module -> the package's modules it imports, anywhere in it (at module level, inside functions, under
    TYPE_CHECKING). `from X import y` is an edge to X.y when that is a module, else to X (the names it holds)."""
    graph = {}
    for name, (path, tree) in sources.items():
        edges = set()
        for imported_name in imported(tree, path):
            parts = imported_name.split(".")
            while parts and ".".join(parts) not in sources:
                parts.pop()
            if parts and ".".join(parts) != name:
                edges.add(".".join(parts))
        graph[name] = edges
    return graph


def package_graph() -> dict[str, set[str]]:
    paths = package_modules() + modules("benchmarks")
    return import_graph({module_name(p): (p, parse(p)) for p in paths})


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other round a circle (strongly connected, by Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while not group or member != node:
                member = stack.pop()
                group.add(member)
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def circle_path(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """One circle of a group, to name it: the shortest path from its first module back to it (breadth first)."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node] & members):
            if nxt == start:
                return paths[node] + [start]
            if nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    return group


def test_no_module_imports_itself_back_through_others():
    graph = package_graph()
    found = [f"{' -> '.join(circle_path(graph, g))} (a circle of {len(g)}: {', '.join(g)})" for g in circles(graph)]
    assert found == [], "import circles: " + "; ".join(found)


def test_the_cycle_checker_finds_a_circle_through_a_function_level_import():
    root = ROOT / "lab"
    sources = {"tfkit.lab.engine": "from .gates import check\n",
               "tfkit.lab.gates": "def f():\n    from .engine import x\n",  # inside a function: still an edge
               "tfkit.lab.plan": "from .spec import LabSpec\n", "tfkit.lab.spec": "from .expect import E\n",
               "tfkit.lab.expect": "", "tfkit.lab": "from . import plan\n"}
    trees = {name: (root / (name.split(".")[-1] + ".py"), ast.parse(text)) for name, text in sources.items()}
    trees["tfkit.lab"] = (root / "__init__.py", ast.parse(sources["tfkit.lab"]))
    graph = import_graph(trees)
    assert graph["tfkit.lab"] == {"tfkit.lab.plan"}  # `from . import plan`: the submodule, not the package
    assert circles(graph) == [["tfkit.lab.engine", "tfkit.lab.gates"]]
    graph["tfkit.lab.expect"] = {"tfkit.lab.plan"}
    groups = sorted(circles(graph))
    assert groups == [["tfkit.lab.engine", "tfkit.lab.gates"], ["tfkit.lab.expect", "tfkit.lab.plan", "tfkit.lab.spec"]]
    assert circle_path(graph, groups[1]) == ["tfkit.lab.expect", "tfkit.lab.plan", "tfkit.lab.spec", "tfkit.lab.expect"]
