"""The built-in labelled dataset: standard-library docstrings labelled by the package they come from.

`stdlib:topics` (optionally `:train` / `:valid`) is a text-classification set that is present wherever
tfkit runs, so fine-tuning can be shown and tested with no download, as `stdlib:docs` does for
pretraining. Each example is one docstring of a module, class or function in one of `TOPICS` (the
extraction and cleaning of `stdlib_corpus`: read with `ast`, never imported), labelled with its package:
"Return the charset parameter of the Content-Type header." is `email`. The packages are ones every
Python since 3.10 has (no `distutils`, `lib2to3` or `tkinter`, which some are without) and that hold a
few dozen docstrings or more; the classes are as unbalanced as the library (`json` has about 20 docstrings,
`asyncio` about 300), which is how real labelled data comes.

A docstring repeated in the library is one example (its first, in sorted file order), and one found in
two topics (`request_host` of `http.cookiejar` and `urllib.request`) none: the same text must not be in
both splits, nor carry two labels. The split is decided per docstring by a stable hash of its text
(sha256, as stdlib:docs' split): in each topic, the `VALID_PERCENT` with the lowest hashes are valid,
so the split is stratified and the same on every run and machine for one Python version. Splitting per
file, as stdlib:docs does, would leave whole classes out of valid (`logging` is three files), and a plain
hash threshold left `json` one validation example.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterator
from functools import lru_cache

from ..errors import DataError
from .labelled_rows import Row
from .stdlib_corpus import docstrings, read_source, source_files

PREFIX = "stdlib:topics"
TOPICS = ("asyncio", "email", "http", "importlib", "json", "logging", "multiprocessing", "unittest", "urllib", "xml")
SPLITS = ("train", "valid")
VALID_PERCENT = 20
COLUMNS = ["text", "label"]


def is_topics_spec(spec: str) -> bool:
    return spec == PREFIX or spec.startswith(PREFIX + ":")


def parse_split(spec: str) -> str | None:
    """`stdlib:topics[:train|:valid]` -> the split or None; DataError naming the spec otherwise."""
    rest = spec[len(PREFIX):]
    if rest == "":
        return None
    if rest.removeprefix(":") not in SPLITS:
        raise DataError(f"labelled data {spec!r}: expected {PREFIX}, {PREFIX}:train or {PREFIX}:valid")
    return rest[1:]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@lru_cache(maxsize=1)
def _examples() -> tuple[tuple[str, str, str, bool], ...]:
    """(where, text, topic, is_valid) of every distinct docstring of the topics, in sorted file order."""
    found, topics_of = [], defaultdict(set)
    for rel, path in source_files():
        topic, _, inside = rel.partition("/")
        if topic not in TOPICS or not inside:  # a package's files, not a same-named top-level module
            continue
        source = read_source(path)
        for number, text in enumerate(docstrings(source) if source else []):
            if not topics_of[text]:
                found.append((f"{PREFIX} {rel}: docstring {number}", text, topic))
            topics_of[text].add(topic)
    found = [example for example in found if len(topics_of[example[1]]) == 1]  # one text, one label
    valid = set()
    for topic in TOPICS:  # each topic's VALID_PERCENT with the lowest hashes (half up)
        digests = sorted(_digest(text) for _, text, t in found if t == topic)
        valid.update(digests[: int(len(digests) * VALID_PERCENT / 100 + 0.5)])
    return tuple((where, text, topic, _digest(text) in valid) for where, text, topic in found)


def topic_rows(spec: str) -> Iterator[Row]:
    """The examples of a `stdlib:topics` spec as rows (`text`, `label`), in sorted file order."""
    split = parse_split(spec)
    for where, text, topic, is_valid in _examples():
        if split is None or is_valid == (split == "valid"):
            yield Row(where, [text, topic], COLUMNS)
