"""Errors the user can fix: bad config, data or model files, a missing input. The CLI prints
their message as one line and exits 2; anything else is a bug and keeps its traceback."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input (config, data, model files); the message names the culprit."""


class MissingInputError(InputError, FileNotFoundError):
    """An input file or directory that does not exist (the message says which, and what makes it)."""


class SourceUnavailableError(InputError, RuntimeError):
    """A remote source (the Hugging Face hub) that cannot be reached and is not in the cache."""
