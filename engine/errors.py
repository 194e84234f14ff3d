"""Errors a person can act on. The CLI prints `str(err)` as one line (plus the hint) without a traceback."""

from __future__ import annotations


class LeapvoxError(Exception):
    """Base class: a message for a person and an optional hint saying what to do next."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class InputError(LeapvoxError):
    """The request itself is wrong: empty text, unknown speaker or language, bad option value."""

    exit_code = 2


class FormatUnavailableError(InputError, ValueError):
    """The weight format asked for does not run on this machine (no kernel for it here)."""


class ModelNotFoundError(InputError):
    """The model named by the user does not exist where it was said to be."""


class CheckpointError(LeapvoxError):
    """The checkpoint exists but its files are damaged or do not fit the architecture."""
