"""Bearer-token authentication: who a request acts for.

Every ``/api/v1`` route depends on :func:`current_viewer`. A missing, malformed, unknown or
revoked token is a 401 with ``WWW-Authenticate: Bearer``. With auth off (``dpsweep serve
--no-auth``, loopback only) every request acts as the local user, who sees everything.
"""

from __future__ import annotations

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ApiError
from sweeper.datasets.access import Viewer
from sweeper.store.tokens import verify_token

_bearer = HTTPBearer(auto_error=False, description="a token from `dpsweep token create`")


def _unauthorized(detail: str, error: str = "invalid_token") -> ApiError:
    return ApiError(
        401,
        detail,
        kind="unauthorized",
        headers={"WWW-Authenticate": f'Bearer realm="dpsweep", error="{error}"'},
    )


def current_viewer(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),  # noqa: B008
) -> Viewer:
    """The viewer of this request (401 without a valid token when auth is on)."""
    state = request.app.state
    if not state.settings.auth:
        return Viewer(owner=None, admin=True)
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ApiError(
            401,
            "this route needs a bearer token: send 'Authorization: Bearer <token>' "
            "(create one with `dpsweep token create --name NAME`)",
            kind="unauthorized",
            headers={"WWW-Authenticate": 'Bearer realm="dpsweep"'},
        )
    principal = verify_token(state.read_engine, credentials.credentials, writer=state.engine)
    if principal is None:
        raise _unauthorized("the bearer token is unknown or revoked")
    return Viewer(owner=principal.name, admin=principal.admin)
