"""dpsweep's Python client: submit sweeps, follow them and read their fronts over the REST API.

It needs only the light install (``pip install dpsweep``: no torch, no Ray, no database)::

    from dpsweep import Client

    with Client() as client:          # DPSWEEP_URL and DPSWEEP_TOKEN, or pass them
        sweep = client.submit("examples/demo.yaml").wait()
        print(sweep.results())

See ``docs/sdk.md`` for a walkthrough.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
)
from dpsweep.version import __version__

if TYPE_CHECKING:
    from dpsweep.client import Client, Event, Sweep, Trial


def __getattr__(name: str) -> Any:
    # The client (and httpx) load on first use: the server imports dpsweep.errors and
    # dpsweep.spec, and has no use for an HTTP client.
    if name in ("Client", "Event", "Sweep", "Trial"):
        from dpsweep import client  # lazy: httpx loads only when the client is first used

        return getattr(client, name)
    raise AttributeError(f"module 'dpsweep' has no attribute {name!r}")


__all__ = [
    "AuthError",
    "Client",
    "ConfigError",
    "Conflict",
    "ConnectionFailed",
    "DatasetError",
    "DpsweepError",
    "Event",
    "NotFound",
    "PermissionDenied",
    "PrivacyError",
    "RateLimited",
    "ServerError",
    "Sweep",
    "TrainingError",
    "Trial",
    "ValidationError",
    "__version__",
]
