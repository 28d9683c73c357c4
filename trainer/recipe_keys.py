"""Every recipe key with its type, default and meaning, read from the section dataclasses themselves.

The meaning of a key is the comment on its line in the dataclass that defines it (`trainer/sections.py`,
`models/config.py`, `tokenization/spec.py`), so `tfkit recipes keys` can never drift from the code: a key
added without a comment fails tests/test_recipe_keys.py.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
import typing
from dataclasses import dataclass

from ..ranges import hints as type_hints


@dataclass(frozen=True)
class Key:
    name: str  # section.key
    type: str  # as annotated: int, float | None, ...
    default: object
    meaning: str  # the comment on the key's line in its dataclass


@functools.cache
def _comments(cls: type) -> dict[str, str]:
    """{field name: its comment} for the fields `cls` itself annotates (not its bases): the comment at the
    end of the field's line, else the block of comment lines right above it."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments = [tok for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT]
    by_line = {tok.start[0]: tok.string.lstrip("# ").strip() for tok in comments}
    alone = {tok.start[0] for tok in comments if tok.line.lstrip().startswith("#")}  # comment-only lines
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    out = {}
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above, line = [], node.lineno - 1
            while line in alone:  # comment-only lines directly above the field
                above.insert(0, by_line[line])
                line -= 1
            out[node.target.id] = by_line.get(node.lineno) or " ".join(above)
    return out


def _meaning(cls: type, name: str) -> str:
    """The comment of `name` in the first class of `cls`'s MRO that annotates it."""
    for klass in cls.__mro__:
        if dataclasses.is_dataclass(klass) and name in _comments(klass):
            return _comments(klass)[name]
    return ""


def recipe_keys(section: str | None = None) -> list[Key]:
    """Every key of every section (or of one), in the order a recipe file lists them."""
    from .recipe import SECTIONS, Recipe

    keys = []
    for name in SECTIONS if section is None else [section]:
        cls = type_hints(Recipe)[name]
        hints = type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            hint = hints[f.name]  # list[float] says what it holds; a bare __name__ would say only "list"
            kind = str(hint).replace("typing.", "") if typing.get_args(hint) else getattr(hint, "__name__", str(hint))
            keys.append(Key(f"{name}.{f.name}", kind, default, _meaning(cls, f.name)))
    return keys
