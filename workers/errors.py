"""The one exception hierarchy of dpsweep.

It lives in ``workers`` because that is the bottom layer: ``sweeper`` and ``api`` import it and
add their own subclasses, and the API maps the whole tree to HTTP in one place.
"""

from __future__ import annotations


class DpsweepError(Exception):
    """Base class of every error dpsweep raises on purpose."""


class ConfigError(DpsweepError, ValueError):
    """A user-supplied setting is invalid. The message says what is allowed."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class DatasetError(ConfigError):
    """A dataset file is missing or malformed, or the dataset does not fit the model."""


class PrivacyError(DpsweepError):
    """A privacy guarantee could not be established; the run must not proceed (fail closed)."""


class TrainingError(DpsweepError):
    """Training itself failed (for example the loss became non-finite)."""


class PermissionDenied(DpsweepError):
    """The caller is known but may not do this (HTTP 403)."""


class NotFound(DpsweepError):
    """No such object, or one the caller may not see (HTTP 404: ids of others do not leak)."""
