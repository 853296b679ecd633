"""dpsweep's one exception hierarchy, re-exported from :mod:`dpsweep.errors`.

The classes live in the light ``dpsweep`` package so the SDK, the CLI, the API and the server
share them: ``workers.errors.ConfigError is dpsweep.errors.ConfigError``. ``sweeper`` and
``api`` add their own subclasses, and the API maps the whole tree to HTTP in one place.
"""

from __future__ import annotations

from dpsweep.errors import (
    AuthError,
    ConfigError,
    Conflict,
    ConnectionFailed,
    DatasetError,
    DpsweepError,
    NotFound,
    PermissionDenied,
    PrivacyError,
    RateLimited,
    ServerError,
    TrainingError,
    ValidationError,
    error_for,
)

__all__ = [
    "AuthError",
    "ConfigError",
    "Conflict",
    "ConnectionFailed",
    "DatasetError",
    "DpsweepError",
    "NotFound",
    "PermissionDenied",
    "PrivacyError",
    "RateLimited",
    "ServerError",
    "TrainingError",
    "ValidationError",
    "error_for",
]
