"""The client's HTTP transport: requests to ``/api/v1`` with retries, pages and event streams.

Every request either returns a successful response or raises a typed error from
:mod:`dpsweep.errors` (the server's problem document mapped back to its class). Retries follow
one rule: what the server did not act on (connection refused, 429, 503) is always retried;
what it may have acted on (timeouts, dropped connections, 502, 504) only when repeating the
request is harmless.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from dpsweep.errors import ConnectionFailed, error_for
from dpsweep.version import __version__

DEFAULT_URL = "http://127.0.0.1:8000"
API = "/api/v1"
# Retried for every request: the server did not act on them.
RETRY_ALWAYS = frozenset({429, 503})
# Retried only for requests that are safe to repeat (GETs, and POSTs with an Idempotency-Key).
RETRY_SAFE = frozenset({502, 504})


@dataclass(frozen=True)
class Event:
    """One server-sent event of a sweep.

    Attributes:
        id: The event id (increasing within a sweep; resume after it).
        kind: ``"sweep"`` (state changes), ``"trial"`` (a trial's state, with its metrics
            and its single-run epsilon, ``single_run_epsilon``, when done) or ``"metric"``
            (an evaluation: ``step`` and ``values``).
        data: The event's JSON object.
    """

    id: int
    kind: str
    data: dict[str, Any]

    @property
    def state(self) -> str | None:
        """The new state of a ``sweep`` or ``trial`` event."""
        return self.data.get("state")

    @property
    def trial(self) -> str | None:
        """The trial id of a ``trial`` or ``metric`` event."""
        return self.data.get("trial")


class HttpTransport:
    """An HTTP connection to a dpsweep server's ``/api/v1``, with retries.

    Args:
        base_url: The server, e.g. ``http://127.0.0.1:8000``; default ``DPSWEEP_URL``, else
            ``http://127.0.0.1:8000``.
        token: A bearer token; default ``DPSWEEP_TOKEN`` (none: for ``serve --no-auth``).
        timeout: Seconds per request (connect, read, write).
        retries: How many times a request is retried on connection errors and on 429 / 503
            (honouring ``Retry-After``), with exponential backoff.
        backoff: The first backoff in seconds (doubled each retry, with jitter).
        max_retry_wait: A ``Retry-After`` longer than this is not waited for.
        transport: An httpx transport (for tests or proxies).
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
        max_retry_wait: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = (base_url or os.environ.get("DPSWEEP_URL") or DEFAULT_URL).rstrip("/")
        token = token if token is not None else os.environ.get("DPSWEEP_TOKEN")
        headers = {"User-Agent": f"dpsweep-python/{__version__}", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.retries = max(0, retries)
        self.backoff = backoff
        self.max_retry_wait = max_retry_wait
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    # -- requests -------------------------------------------------------------------------------

    def _wait_for(self, attempt: int, response: httpx.Response | None) -> float | None:
        """Seconds to wait before retry ``attempt`` (None: do not retry)."""
        if attempt >= self.retries:
            return None
        if response is not None:
            after = retry_after(response)
            if after is not None:
                return after if after <= self.max_retry_wait else None
        return float(self.backoff * 2**attempt * random.uniform(0.75, 1.25))

    def request(
        self,
        method: str,
        path: str,
        *,
        safe: bool | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send ``method`` to ``/api/v1`` + ``path``; the response, or a typed error.

        Args:
            safe: Whether repeating the request is harmless (default: GET). Connection errors
                before anything was sent, 429 and 503 are retried either way; timeouts,
                dropped connections, 502 and 504 only when safe.
        """
        safe = method.upper() == "GET" if safe is None else safe
        attempt = 0
        while True:
            try:
                r = self._http.request(method, API + path, **kwargs)
            except httpx.TransportError as exc:
                unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                wait = self._wait_for(attempt, None) if (unsent or safe) else None
                if wait is None:
                    raise ConnectionFailed(
                        f"{method} {self.base_url}{API}{path}: {type(exc).__name__}: {exc}"
                    ) from exc
            else:
                code = r.status_code
                if code in RETRY_ALWAYS or (safe and code in RETRY_SAFE):
                    wait = self._wait_for(attempt, r)
                    if wait is None:
                        raise error_from_response(r)
                elif code >= 400:
                    raise error_from_response(r)
                else:
                    return r
            time.sleep(wait)
            attempt += 1

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    def _pages(
        self, path: str, params: dict[str, Any], *, page_size: int
    ) -> Iterator[dict[str, Any]]:
        cursor: str | None = None
        while True:
            q = {k: v for k, v in params.items() if v is not None} | {"limit": page_size}
            if cursor:
                q["cursor"] = cursor
            page = self._json("GET", path, params=q)
            yield from page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    # -- events ---------------------------------------------------------------------------------

    def _events(
        self, sweep_id: str, *, after: int | None = None, heartbeat: bool = False
    ) -> Iterator[Event | None]:
        """A sweep's events until it ends (``None`` on keep-alives when ``heartbeat``)."""
        headers = {"Accept": "text/event-stream"}
        if after:
            headers["Last-Event-ID"] = str(after)
        # Reads may wait for the server's keep-alive (10 s by default), never much longer.
        timeout = httpx.Timeout(self._http.timeout.connect, read=60.0)
        try:
            with self._http.stream(
                "GET", f"{API}/sweeps/{sweep_id}/events", headers=headers, timeout=timeout
            ) as r:
                if r.status_code >= 400:
                    r.read()
                    raise error_from_response(r)
                event: dict[str, Any] = {}
                for line in r.iter_lines():
                    if line == "":
                        if "data" in event:
                            yield Event(
                                int(event.get("id") or 0),
                                event.get("event", "message"),
                                json.loads(event["data"]),
                            )
                        event = {}
                    elif line.startswith(":"):
                        if heartbeat:
                            yield None
                    else:
                        name, _, value = line.partition(":")
                        value = value[1:] if value.startswith(" ") else value
                        if name == "data" and "data" in event:
                            event["data"] += "\n" + value
                        else:
                            event[name] = value
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"the event stream of {sweep_id} broke: {exc}") from exc


def retry_after(response: httpx.Response) -> float | None:
    """A response's ``Retry-After`` in seconds (delta-seconds or an HTTP date), or None."""
    raw = response.headers.get("retry-after")
    if not raw:
        return None
    raw = raw.strip()
    if raw.isdigit():
        return float(raw)
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_from_response(r: httpx.Response) -> Exception:
    """The typed error of a failed response,, from its problem document."""
    try:
        problem = r.json()
        if not isinstance(problem, dict):
            problem = {"detail": str(problem)}
    except ValueError:
        problem = {"detail": r.text[:500] or r.reason_phrase}
    return error_for(r.status_code, problem, retry_after=retry_after(r))
