"""The Python client of the dpsweep REST API.

It needs only the light base install (httpx, pydantic, PyYAML, rich): no torch, no Ray, no
database. Specs are validated locally with the server's own models (:mod:`dpsweep.spec`)
before anything is sent.

Example (against ``dpsweep serve`` and a token from ``dpsweep token create``)::

    from dpsweep import Client

    with Client("http://127.0.0.1:8000", token="dps_...") as client:
        sweep = client.submit("examples/demo.yaml")
        sweep.wait()                      # a progress bar until the sweep ends
        front = sweep.pareto()            # epsilon vs the objective, per arm
        df = sweep.to_dataframe()         # one row per trial (needs pandas)
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx

from dpsweep.errors import ConfigError, ConnectionFailed, ServerError, error_for

DEFAULT_URL = "http://127.0.0.1:8000"
API = "/api/v1"
TERMINAL = frozenset({"done", "failed", "cancelled"})
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


class Client:
    """A connection to a dpsweep server.

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

    Use it as a context manager, or call :meth:`close`.
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
        from dpsweep import __version__

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

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"

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
                        raise _error(r)
                elif code >= 400:
                    raise _error(r)
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

    # -- who ------------------------------------------------------------------------------------

    def me(self) -> dict[str, Any]:
        """Who the token is: ``{"name", "admin", "auth"}`` (raises AuthError if refused)."""
        return dict(self._json("GET", "/me"))

    # -- sweeps ---------------------------------------------------------------------------------

    def plan(self, spec: Any) -> dict[str, Any]:
        """Dry run: the server's plan of ``spec`` (noise per grid, epsilon reserved). Nothing
        is stored.

        Args:
            spec: A dict, YAML or JSON text, a path to a spec file, or a ``SweepSpec``.

        Raises:
            ValidationError: the spec is invalid (checked locally first) or its plan is
                infeasible.
        """
        body = spec_body(spec)
        return dict(self._json("POST", "/sweeps:plan", content=body, headers=_JSON, safe=True))

    def submit(self, spec: Any, *, idempotency_key: str | None = None) -> Sweep:
        """Validate ``spec`` locally, submit it, and return its :class:`Sweep`.

        The server plans it, reserves its whole privacy cost on the dataset and queues it.
        Every submit carries an ``Idempotency-Key`` (a random one unless given), so a retry
        after a lost response returns the same sweep instead of reserving twice; pass your
        own key to make resubmitting from another process idempotent too.

        Raises:
            ValidationError: invalid spec or infeasible plan.
            Conflict: the dataset's remaining budget cannot cover the sweep.

        Example::

            sweep = client.submit({"name": "s", "dataset": {"name": "digits"}, ...})
        """
        body = spec_body(spec)
        key = idempotency_key or uuid.uuid4().hex
        data = self._json(
            "POST",
            "/sweeps",
            content=body,
            headers={**_JSON, "Idempotency-Key": key},
            safe=True,
        )
        return Sweep(self, data)

    def sweep(self, sweep_id: str) -> Sweep:
        """One sweep by id (raises NotFound)."""
        return Sweep(self, self._json("GET", f"/sweeps/{sweep_id}"))

    def sweeps(self, state: str | None = None, *, page_size: int = 100) -> Iterator[Sweep]:
        """Your sweeps, newest first, fetched page by page as you iterate.

        Each :class:`Sweep` holds the list's fields; :meth:`Sweep.refresh` reads the rest.
        """
        for item in self._pages("/sweeps", {"state": state}, page_size=page_size):
            yield Sweep(self, item)

    def trial(self, trial_id: str) -> dict[str, Any]:
        """A trial's details: params, planned noise, privacy charges, metrics, bins."""
        return dict(self._json("GET", f"/trials/{trial_id}"))

    # -- datasets -------------------------------------------------------------------------------

    def datasets(self) -> list[dict[str, Any]]:
        """Built-in datasets and your uploads, each with its budget."""
        return list(self._json("GET", "/datasets")["items"])

    def upload_dataset(
        self,
        path: str | Path,
        *,
        label: str | None = None,
        name: str | None = None,
        format: str | None = None,
        epsilon_cap: float | None = None,
        delta_cap: float | None = None,
    ) -> dict[str, Any]:
        """Upload a CSV (with a ``label`` column) or an NPZ (arrays ``x``, ``y``).

        Returns:
            The stored dataset; name it in a spec by its ``id`` (``dataset: {name: ds_...}``).
        """
        p = Path(path)
        fields = {
            "label_column": label,
            "name": name,
            "format": format,
            "epsilon_cap": None if epsilon_cap is None else repr(float(epsilon_cap)),
            "delta_cap": None if delta_cap is None else repr(float(delta_cap)),
        }
        with p.open("rb") as fh:
            # Not retried on a dropped connection: the upload may have been stored.
            return dict(
                self._json(
                    "POST",
                    "/datasets",
                    files={"file": (p.name, fh)},
                    data={k: v for k, v in fields.items() if v is not None},
                    safe=False,
                )
            )

    def budget(self, dataset: str) -> dict[str, Any]:
        """A dataset's lifetime budget: caps, committed, reserved, remaining, your sweeps."""
        return dict(self._json("GET", f"/datasets/{dataset}/budget"))

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
                    raise _error(r)
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


_JSON = {"Content-Type": "application/json"}


class Sweep:
    """A handle on one sweep. Its fields are as of the last read (:meth:`refresh`).

    Attributes:
        id, name, state, dataset: The sweep's.
        data: Everything the server last said about it (``GET /api/v1/sweeps/{id}``).
    """

    def __init__(self, client: Client, data: dict[str, Any]) -> None:
        self._client = client
        self.data = dict(data)

    # -- fields ---------------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def name(self) -> str:
        return str(self.data["name"])

    @property
    def state(self) -> str:
        return str(self.data["state"])

    @property
    def dataset(self) -> str:
        return str(self.data["dataset"])

    @property
    def finished(self) -> bool:
        """Whether the sweep has ended (done, failed or cancelled)."""
        return self.state in TERMINAL

    @property
    def counts(self) -> dict[str, int] | None:
        """Trials by state (None for papernot-steinke sweeps, whose count is private)."""
        if self.runs_private:
            return None
        c = self.data.get("trials")
        return dict(c) if isinstance(c, dict) else None

    @property
    def runs_private(self) -> bool:
        """Whether the sweep's number of runs is secret (papernot-steinke accounting): it
        then shows no trial counts or progress, and each grid releases only its selected
        trial, once its search has completed without a cancel."""
        plan = self.data.get("plan")
        if isinstance(plan, list):
            return any(g.get("release") == "selected-only" for g in plan)
        return "trials" in self.data and self.data["trials"] is None

    @property
    def url(self) -> str:
        """This sweep's page on the dashboard."""
        return f"{self._client.base_url}/sweeps/{self.id}"

    def __repr__(self) -> str:
        return f"<Sweep {self.id} {self.name!r} {self.state}>"

    # -- reads ----------------------------------------------------------------------------------

    def refresh(self) -> Sweep:
        """Re-read the sweep from the server."""
        self.data = dict(self._client._json("GET", f"/sweeps/{self.id}"))
        return self

    def results(self) -> list[dict[str, Any]]:
        """The best configuration per arm and epsilon level (mean ± std over seeds)."""
        return list(self._client._json("GET", f"/sweeps/{self.id}/results")["results"])

    def pareto(self, x: str = "epsilon", y: str | None = None) -> list[dict[str, Any]]:
        """A Pareto front's points, each with ``dominated``.

        ``x="epsilon"``: per arm and epsilon level, the best configuration's mean ``y`` (the
        objective by default). Otherwise one point per finished trial, e.g.
        ``pareto(x="accuracy", y="ece")`` for calibration.
        """
        params = {"x": x} | ({"y": y} if y else {})
        return list(self._client._json("GET", f"/sweeps/{self.id}/pareto", params=params)["points"])

    def trials(
        self,
        *,
        arm: str | None = None,
        level: float | None = None,
        state: str | None = None,
        sort: str = "number",
        page_size: int = 500,
    ) -> Iterator[dict[str, Any]]:
        """The sweep's trials, fetched page by page as you iterate.

        Args:
            arm, level, state: Filters (an arm's name, an epsilon level, a trial state).
            sort: ``number`` (grid order) or ``objective`` (best first).
        """
        params = {"arm": arm, "level": level, "state": state, "sort": sort}
        return self._client._pages(f"/sweeps/{self.id}/trials", params, page_size=page_size)

    def best_trial(self) -> dict[str, Any] | None:
        """The finished trial with the best objective, in full (None if none finished)."""
        for t in self.trials(state="done", sort="objective", page_size=1):
            return self._client.trial(t["id"])
        return None

    # -- changes --------------------------------------------------------------------------------

    def cancel(self) -> dict[str, Any]:
        """Cancel the sweep: pending trials are dropped and their reservation released;
        running ones stop and stay charged.

        The counts (``cancelled_pending``, ``stopped_running``) leave papernot-steinke grids
        out; for those, ``papernot_steinke`` says: grids whose search had started stay charged
        in full and release nothing unless their search had already completed.

        Raises:
            Conflict: the sweep has already finished.
        """
        out = dict(self._client._json("POST", f"/sweeps/{self.id}/cancel", safe=True))
        self.refresh()
        return out

    # -- following ------------------------------------------------------------------------------

    def stream(self, *, after: int | None = None) -> Iterator[Event]:
        """The sweep's events as they happen, from the start (or after event ``after``),
        until the sweep ends.

        Example::

            for event in sweep.stream():
                if event.kind == "trial" and event.state == "done":
                    print(event.trial, event.data["metrics"])
        """
        for ev in self._client._events(self.id, after=after):
            if ev is not None:
                yield ev

    def wait(
        self, *, progress: bool = True, timeout: float | None = None, poll_seconds: float = 2.0
    ) -> Sweep:
        """Block until the sweep ends; returns it refreshed.

        It follows the events stream (a progress bar on stderr when ``progress``), and falls
        back to polling every ``poll_seconds`` if the stream is unavailable.

        Raises:
            TimeoutError: it had not ended after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = _Bar(self) if progress else None
        try:
            self.refresh()
            if bar:
                bar.update()
            if self.finished:
                return self
            last = 0.0
            try:
                for ev in self._client._events(self.id, heartbeat=True):
                    _check(deadline, self)
                    if ev is None:
                        continue
                    if ev.kind == "sweep" and ev.state in TERMINAL:
                        break
                    if bar and ev.kind == "trial" and time.monotonic() - last > 0.5:
                        last = time.monotonic()
                        self.refresh()
                        bar.update()
            except (ConnectionFailed, ServerError):
                pass  # the stream is unavailable (a proxy, a restart): poll instead
            self.refresh()
            while not self.finished:
                _check(deadline, self)
                time.sleep(poll_seconds)
                self.refresh()
                if bar:
                    bar.update()
            if bar:
                bar.update()
            return self
        finally:
            if bar:
                bar.close()

    # -- data frames ----------------------------------------------------------------------------

    def to_dataframe(self, what: str = "trials") -> Any:
        """A pandas DataFrame: ``"trials"`` (one row per trial, params and metrics as
        columns), ``"results"`` (best per arm and level) or ``"pareto"`` (the epsilon front).

        Needs pandas (``pip install pandas``), imported only here.
        """
        pd = _pandas()
        if what == "trials":
            rows = [_flat_trial(t) for t in self.trials()]
        elif what == "results":
            rows = [
                {k: v for k, v in r.items() if k != "best_params"}
                | _prefixed(r.get("best_params") or {}, r)
                for r in self.results()
            ]
        elif what == "pareto":
            rows = [
                {k: v for k, v in p.items() if k != "params"} | _prefixed(p.get("params") or {}, p)
                for p in self.pareto()
            ]
        else:
            raise ValueError(f"what must be 'trials', 'results' or 'pareto', not {what!r}")
        return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# Helpers


def spec_body(spec: Any) -> bytes:
    """Validate a spec locally with the server's models; its JSON body.

    Raises:
        ValidationError: (``ConfigError``) naming the failing field, before anything is sent.
    """
    from dpsweep.spec import SweepSpec, load_spec  # pydantic: imported when first needed

    try:
        if isinstance(spec, SweepSpec):
            model = SweepSpec.model_validate(spec.model_dump(mode="json"))
        elif isinstance(spec, str | Path | dict):
            model = load_spec(spec)
        else:
            raise ConfigError(
                f"a spec is a dict, YAML/JSON text, a file path or a SweepSpec, not "
                f"{type(spec).__name__}"
            )
    except ConfigError as exc:
        problem: dict[str, Any] = {"title": "Invalid spec (checked locally)", "detail": str(exc)}
        if exc.field:
            problem["errors"] = [{"field": exc.field, "message": str(exc)}]
        raise ConfigError(str(exc), field=exc.field, problem=problem) from None
    return json.dumps(model.model_dump(mode="json")).encode()


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


def _error(r: httpx.Response) -> Exception:
    try:
        problem = r.json()
        if not isinstance(problem, dict):
            problem = {"detail": str(problem)}
    except ValueError:
        problem = {"detail": r.text[:500] or r.reason_phrase}
    return error_for(r.status_code, problem, retry_after=retry_after(r))


def _check(deadline: float | None, sweep: Sweep) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise TimeoutError(f"sweep {sweep.id} is still {sweep.state}")


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError(
            "to_dataframe needs pandas, which the light install leaves out: pip install pandas"
        ) from None
    return pandas


def _prefixed(params: dict[str, Any], taken: dict[str, Any]) -> dict[str, Any]:
    return {(f"param_{k}" if k in taken else k): v for k, v in params.items()}


def _flat_trial(t: dict[str, Any]) -> dict[str, Any]:
    row = {k: v for k, v in t.items() if k not in ("params", "metrics")}
    row |= _prefixed(t.get("params") or {}, row)
    row |= {(f"metric_{k}" if k in row else k): v for k, v in (t.get("metrics") or {}).items()}
    return row


class _Bar:
    """A rich progress bar of a sweep's trials; for a papernot-steinke sweep (whose number
    of runs is private) only the elapsed time, no counts."""

    def __init__(self, sweep: Sweep) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.sweep = sweep
        self.private = sweep.runs_private
        columns: list[ProgressColumn | str] = [TextColumn("[bold]{task.description}")]
        if not self.private:
            columns += [BarColumn(), MofNCompleteColumn()]
        columns += [TextColumn("{task.fields[extra]}"), TimeElapsedColumn()]
        self.progress = Progress(*columns, console=Console(stderr=True), transient=False)
        self.progress.start()
        self.task = self.progress.add_task(sweep.id[:12], total=None, extra="")

    def update(self) -> None:
        if self.private:
            self.progress.update(
                self.task,
                description=f"{self.sweep.name} ({self.sweep.state})",
                extra="papernot-steinke: the number of runs is private; elapsed",
            )
            return
        c = self.sweep.counts or {}
        total = sum(c.values()) or None
        failed = c.get("failed", 0) + c.get("interrupted", 0)
        self.progress.update(
            self.task,
            description=f"{self.sweep.name} ({self.sweep.state})",
            completed=c.get("done", 0) + failed + c.get("cancelled", 0),
            total=total,
            extra=f"running {c.get('running', 0)} · failed {failed}",
        )

    def close(self) -> None:
        self.progress.stop()
