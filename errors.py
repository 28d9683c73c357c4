"""User-facing errors.

Everything a user can get wrong (a bad recipe, a missing file, an impossible model shape, a corrupt
checkpoint) raises a `TfkitError` subclass. The CLI catches them at the boundary and prints one red line
with exit code 2; library users can catch them like any exception. Messages name the file, key or value
at fault and say what was expected.
"""


class TfkitError(Exception):
    """Base class of every error caused by user input rather than by a bug in tfkit."""


class ConfigError(TfkitError):
    """A recipe or model configuration is invalid (unknown key, wrong type, impossible combination)."""


class DataError(TfkitError):
    """A corpus, data source or tokenizer input cannot be used."""


class CheckpointError(TfkitError):
    """A checkpoint is missing, incomplete, corrupt or incompatible."""
