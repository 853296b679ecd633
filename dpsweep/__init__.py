"""dpsweep's Python client: submit sweeps, follow them and read their fronts over the REST API.

It needs only the light install (``pip install dpsweep``: no torch, no Ray, no database)::

    from dpsweep import Client

    with Client() as client:          # DPSWEEP_URL and DPSWEEP_TOKEN, or pass them
        sweep = client.submit("examples/demo.yaml").wait()
        print(sweep.results())

See ``docs/sdk.md`` for a walkthrough.
"""

from __future__ import annotations

from dpsweep.client import Client, Event, Sweep
from dpsweep.errors import (
    AuthError,
    Conflict,
    ConnectionFailed,
    DpsweepError,
    NotFound,
    RateLimited,
    ServerError,
    ValidationError,
)

__version__ = "0.1.0"

__all__ = [
    "AuthError",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "DpsweepError",
    "Event",
    "NotFound",
    "RateLimited",
    "ServerError",
    "Sweep",
    "ValidationError",
    "__version__",
]
