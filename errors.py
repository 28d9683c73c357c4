"""User-facing errors.

Everything a user can get wrong (a bad recipe, a missing file, an impossible model shape, a corrupt
checkpoint) raises a `TfkitError` subclass. The CLI catches them at the boundary and prints one red line
with exit code 2; library users can catch them like any exception. Messages name the file, key or value
at fault and say what was expected.

A message names the library's own parameters (`top_k must be >= 1`), never a command-line flag: the library
is called from Python too, where `--top-k` means nothing. An error that names parameters lists them in
`params`, and the CLI rewrites each, where it stands as a word of its own, to the running command's flag
(`--top-k must be >= 1`). Recipe keys (`train.max_steps`) are not parameters and read the same everywhere.
"""

import re


def shorten(text: str, limit: int = 1000) -> str:
    """`text` cut in the middle when longer than `limit` characters: an error that quotes a huge value (a
    2 MB recipe key) must still be a line someone reads."""
    if len(text) <= limit:
        return text
    return f"{text[:limit - 200]} ... ({len(text) - limit + 100:,} characters left out) ... {text[-100:]}"


class TfkitError(Exception):
    """Base class of every error caused by user input rather than by a bug in tfkit.

    `params` are the names of the function parameters the message names, for the CLI to spell as flags."""

    def __init__(self, *args, params: tuple[str, ...] = ()):
        super().__init__(*args)
        self.params = params


def rename_params(message: str, names: dict[str, str]) -> str:
    """`message` with each parameter in `names` replaced by its other spelling (`top_k` -> `--top-k`) where
    it stands as a word: not part of a longer name (`max_seq_len` is not `seq_len`), of a dotted recipe
    key (`data.text_field` is not `text_field`) or of a path (`runs/top_k.txt`)."""
    if not names:
        return message
    alternatives = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
    pattern = rf"(?<![\w./\\-])({alternatives})(?![\w/\\-]|\.\w)"
    return re.sub(pattern, lambda match: names[match[1]], message)


class ConfigError(TfkitError):
    """A recipe or model configuration is invalid (unknown key, wrong type, impossible combination)."""


class DataError(TfkitError):
    """A corpus, data source or tokenizer input cannot be used."""


class CheckpointError(TfkitError):
    """A checkpoint is missing, incomplete, corrupt or incompatible."""


class DiskFullError(TfkitError):
    """The disk (or the user's quota) filled while tfkit wrote: the message names the path being written and
    what is intact (every write goes to a temporary name first, so what existed before is untouched)."""


def disk_full(exc: OSError, intact: str) -> DiskFullError:
    """`PATH: no space left on device; INTACT; free space and run again` for an ENOSPC/EDQUOT `exc`."""
    where = f"{exc.filename}: " if exc.filename else ""
    return DiskFullError(f"{where}no space left on device ({exc.strerror or 'full'}); {intact}; free some space "
                         "and run the command again")
