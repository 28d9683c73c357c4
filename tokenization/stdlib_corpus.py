"""The built-in corpus: the running Python's standard library, so tfkit works with no download.

Two flavours, addressed as `stdlib:code` and `stdlib:docs` (optionally `:train` / `:valid`):

- `code`: every standard-library `*.py` source file, one document per file.
- `docs`: the module, class and function docstrings of those files (English prose), one document per
  docstring, extracted with `ast` (never imported, so nothing runs) and cleaned with `inspect.cleandoc`.

Why this corpus: it is present wherever tfkit runs, is a few MB of real prose and real code, and is the
same for everyone on the same Python version, which makes tutorials and CI reproducible.

Test suites, IDLE, site-packages and the lib2to3 test data are excluded (they hold intentionally broken or
non-representative files). Files are sorted by relative path, and the train/valid split is decided per
*file* by a stable hash of that path (sha256, not Python's salted `hash`), so the split is identical
across runs and machines and no file contributes to both sides.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import io
import sys
import sysconfig
import tokenize
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from ..errors import DataError

FLAVOURS = ("code", "docs")
SPLITS = ("train", "valid")
VALID_PERCENT = 5  # files whose path hash falls in the lowest 5 of 100 buckets form the valid split
MIN_DOCSTRING_CHARS = 40  # shorter docstrings ("Return x.") are noise rather than prose
EXCLUDED_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"})
EXTRACTION_VERSION = "1"  # bump when the extraction rules change, so cached shards are rebuilt


def stdlib_root() -> Path:
    """Folder of the running interpreter's standard library (the base install, also inside a venv)."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_valid_file(rel_path: str) -> bool:
    """Deterministic split membership by a stable hash of the file's path relative to the stdlib root."""
    bucket = int(hashlib.sha256(rel_path.encode("utf-8")).hexdigest()[:8], 16) % 100
    return bucket < VALID_PERCENT


@lru_cache(maxsize=1)
def source_files() -> tuple[tuple[str, Path], ...]:
    """(relative path, absolute path) of every included `*.py` file, sorted by relative path."""
    root = stdlib_root()
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if EXCLUDED_DIRS.intersection(rel.parts[:-1]):
            continue
        out.append((rel.as_posix(), path))
    out.sort()
    return tuple(out)


def read_source(path: Path) -> str | None:
    """Decode with the file's declared encoding (PEP 263); None for files that cannot be read."""
    try:
        data = path.read_bytes()
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (OSError, SyntaxError, UnicodeDecodeError, LookupError):
        return None


def docstrings(source: str) -> list[str]:
    """Module, class and function docstrings in source order, cleaned, without the short ones."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    definitions = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    nodes = [tree] + [n for n in _statements(tree) if isinstance(n, definitions)]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    out = []
    for node in nodes:
        doc = ast.get_docstring(node, clean=False)
        if doc:
            doc = inspect.cleandoc(doc).strip()
            if len(doc) >= MIN_DOCSTRING_CHARS:
                out.append(doc)
    return out


STATEMENT_LISTS = ("body", "orelse", "finalbody", "handlers", "cases")


def _statements(tree: ast.AST) -> Iterator[ast.AST]:
    """Every statement (and except / case clause) under `tree`, never descending into expressions: a
    class or function definition is always a statement, and expressions are most of a module's nodes,
    so this finds what `ast.walk` would at a fraction of the cost."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for name in STATEMENT_LISTS:
            children = getattr(node, name, None)
            if isinstance(children, list):
                stack.extend(children)
                yield from children


def _iter_documents(flavour: str) -> Iterator[tuple[bool, str]]:
    """(is_valid, text) for every document of a flavour, reading and parsing files only as they are reached."""
    for rel, path in source_files():
        source = read_source(path)
        if source is None or not source.strip():
            continue
        valid = is_valid_file(rel)
        if flavour == "code":
            yield valid, source
        else:
            yield from ((valid, d) for d in docstrings(source))


_DOCUMENTS: dict[str, tuple[tuple[bool, str], ...]] = {}  # flavour -> every document, once fully read


def _documents(flavour: str) -> Iterator[tuple[bool, str]]:
    """(is_valid, text) for every document of a flavour: from memory once a reader has gone through them all,
    else read as the caller goes (a reader that stops early parses only the files it reached)."""
    if flavour in _DOCUMENTS:
        yield from _DOCUMENTS[flavour]
        return
    seen = []
    for doc in _iter_documents(flavour):
        seen.append(doc)
        yield doc
    _DOCUMENTS[flavour] = tuple(seen)


def parse_spec(spec: str) -> tuple[str, str | None]:
    """`stdlib:docs[:train|:valid]` -> (flavour, split or None); DataError naming the spec otherwise."""
    parts = spec.split(":")
    if parts[0] != "stdlib" or len(parts) not in (2, 3) or parts[1] not in FLAVOURS:
        raise DataError(
            f"corpus {spec!r}: expected stdlib:code or stdlib:docs, optionally followed by :train or :valid"
        )
    split = parts[2] if len(parts) == 3 else None
    if split is not None and split not in SPLITS:
        raise DataError(f"corpus {spec!r}: unknown split {split!r}, expected train or valid")
    return parts[1], split


def stdlib_documents(spec: str) -> list[str]:
    """Documents of a `stdlib:...` spec, in deterministic order (sorted files, source order inside)."""
    return list(iter_stdlib_documents(spec))


def iter_stdlib_documents(spec: str) -> Iterator[str]:
    """`stdlib_documents` as they are read: the `docs` flavour runs every standard-library file through
    `ast` (seconds of CPU), so a reader that needs the first megabyte should not wait for all of it."""
    flavour, split = parse_spec(spec)
    return (text for valid, text in _documents(flavour) if split is None or valid == (split == "valid"))


def stdlib_fingerprint(spec: str) -> str:
    """Cache key material: what determines the documents without reading them."""
    parse_spec(spec)
    return f"{spec}|python={sys.version}|root={stdlib_root()}|files={len(source_files())}|v{EXTRACTION_VERSION}"
