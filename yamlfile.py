"""Every YAML file tfkit reads (recipes, lab specs, a run's recipe.yaml), through one guarded loader: the safe
loader only (plain types, never Python objects), and a document too large to walk (aliases expanding into
millions of values, nesting past what the checks can recurse through) refused as `AliasBomb` before any code
walks it.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_YAML_NODES = 100_000  # a recipe has ~70 keys; YAML aliases can make 9 lines expand to 9**8 values
MAX_YAML_DEPTH = 100  # a recipe nests 3 levels; thousands of [[[...]]] overflow Python's stack downstream


class AliasBomb(ValueError):
    """A YAML document too large to walk: aliases expanding beyond MAX_YAML_NODES values, or values nested
    beyond MAX_YAML_DEPTH levels."""


def check_expansion(value: Any, limit: int = MAX_YAML_NODES) -> None:
    """Raise AliasBomb when `value`, with every alias expanded, holds more than `limit` values.

    The loader shares one object per anchor, so loading a "billion laughs" document is cheap; what is not
    is everything that walks it afterwards (the type checks, the message quoting a bad value: 25 MB for
    9**7 values, 33 s and 1.8 GB for 9**8). The walk stops as soon as it passes the limit."""
    count, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > limit:
            raise AliasBomb(f"its YAML aliases expand to more than {limit:,} values (expected a recipe of a few "
                            "dozen keys; write the values out instead of repeating anchors)")
        if depth > MAX_YAML_DEPTH:  # what walks the value afterwards (checks, messages) recurses
            raise AliasBomb(f"its values nest more than {MAX_YAML_DEPTH} levels deep (expected a recipe of "
                            "sections of keys)")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in (*item.keys(), *item.values()))
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)


def safe_load(text: str) -> Any:
    """`yaml.safe_load` through libyaml's C parser where PyYAML has it: the same safe loader (plain types
    only, no Python objects), ten times faster, which `tfkit recipes list` (every bundled recipe) notices.
    Invalid YAML is parsed again by the pure-Python loader, whose errors name the offending character.
    A document whose aliases expand beyond MAX_YAML_NODES values raises AliasBomb (`check_expansion`)."""
    try:
        try:
            value = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader
        except yaml.YAMLError as exc:
            if "nesting depth" in str(getattr(exc, "problem", "")):  # libyaml's own limit: no slow second parse
                raise RecursionError from None
            value = yaml.safe_load(text)
    except RecursionError:  # the constructor recurses once per nesting level
        raise AliasBomb(f"its values nest more than {MAX_YAML_DEPTH} levels deep (expected a recipe of sections "
                        "of keys)") from None
    check_expansion(value)
    return value

