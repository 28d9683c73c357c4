"""tfkit: from raw text to a trained, evaluated Transformer."""

__version__ = "0.1.0"
