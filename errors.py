"""User-facing errors.

Everything a user can get wrong (a bad recipe, a missing file, an impossible model shape, a corrupt
checkpoint) raises a `TfkitError` subclass. The CLI catches them at the boundary and prints one red line
with exit code 2; library users can catch them like any exception. Messages name the file, key or value
at fault and say what was expected.
"""


def shorten(text: str, limit: int = 1000) -> str:
    """`text` cut in the middle when longer than `limit` characters: an error that quotes a huge value (a
    2 MB recipe key) must still be a line someone reads."""
    if len(text) <= limit:
        return text
    return f"{text[:limit - 200]} ... ({len(text) - limit + 100:,} characters left out) ... {text[-100:]}"


class TfkitError(Exception):
    """Base class of every error caused by user input rather than by a bug in tfkit."""


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
