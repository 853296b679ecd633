"""Sweep summaries, results and Pareto fronts, cached by the sweep's version.

A summary reads every trial of a sweep; a finished sweep of thousands of trials is read many
times (dashboards poll). What a summary shows changes only with an event or a ledger entry of
the sweep (:func:`sweeper.sweeps.sweep_pages.sweep_head`), so summaries are cached under
that version:
a finished sweep is computed once. Sweeps with papernot-steinke grids are never cached while
they run (their trials change without events, by design).

The version is made of global counters (the newest event id and ledger entry id), so it never
leaves the server as it is: an ETag that carried it would tell a tenant how many events and
charges every other tenant caused between two reads. ETags are a keyed hash (HMAC-SHA256 with
a per-server secret) of the sweep, its version and the viewer: equal versions give equal
ETags (If-None-Match still gives 304) and nothing of the counters can be read from them.

What a papernot-steinke grid releases (its selected trial, only once its search completed
without a cancel) is decided by :func:`sweeper.sweeps.released_records`, which every summary,
result and front here is built from; a cancel ends the sweep with an event, so a cached entry
never outlives it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError
from sweeper.datasets.access import Viewer
from sweeper.datasets.analyst_clock import for_analyst
from sweeper.store import Sweep
from sweeper.sweeps.results import best_per_arm_level, epsilon_front, pareto_mask
from sweeper.sweeps.stored import TERMINAL_SWEEPS, load_sweep
from sweeper.sweeps.summary import SweepResults, summarize, sweep_results
from sweeper.sweeps.sweep_pages import sweep_head

# Metrics where lower is better; every other metric is maximised.
LOWER_IS_BETTER = frozenset({"loss", "ece", "mce", "mse", "nll", "brier", "epsilon"})
TERMINAL = {s.value for s in TERMINAL_SWEEPS}
# Encoded bodies kept per sweep version (fronts, results, pages of trials).
MAX_BODIES = 256
#: Where the ETag key is shared with the API's worker processes (``--api-workers``).
ETAG_KEY_ENV = "DPSWEEP_ETAG_KEY"


def _etag_key() -> bytes:
    """The key of every ETag this server hands out: random, made once per server.

    The first process makes it and puts it in its environment, so the worker processes that
    ``dpsweep serve --api-workers N`` starts inherit it and give a client the same ETag
    whichever of them answers (a 304 from any). It never leaves the server.
    """
    key = os.environ.get(ETAG_KEY_ENV)
    if not key:
        key = secrets.token_hex(32)
        os.environ[ETAG_KEY_ENV] = key
    return key.encode()


_ETAG_KEY = _etag_key()


def opaque_tag(*parts: object) -> str:
    """A weak ETag that identifies ``parts`` (equal parts, equal tag) and reveals nothing
    of them: 128 bits of their HMAC under the server's key."""
    message = "\x00".join(str(p) for p in parts).encode()
    digest = hmac.new(_ETAG_KEY, message, hashlib.sha256).hexdigest()[:32]
    return f'W/"{digest}"'


def mode_of(metric: str) -> str:
    return "min" if metric in LOWER_IS_BETTER else "max"


@dataclass
class Entry:
    """A sweep's summary and results at one version, with encoded bodies ready to send."""

    version: tuple[int, int]
    summary: dict[str, Any]
    results: SweepResults
    # The version's opaque tag (never the counters themselves); None: not cacheable (may
    # change without a new version).
    etag: str | None
    summary_body: bytes = b""
    bodies: dict[tuple[str, str | None], bytes] = field(default_factory=dict)

    def etag_for(self, viewer: Viewer) -> str | None:
        """The ETag ``viewer`` gets for this version: their own (two viewers of one sweep
        cannot match theirs), equal on every read of the same version."""
        if self.etag is None:
            return None
        return opaque_tag(self.etag, viewer.owner, viewer.admin)

    def summary_for(self, *, analyst: bool) -> tuple[dict[str, Any], bytes]:
        """The summary and its encoded body as a viewer receives them: an analyst (the
        viewer's ``SweepHead.analyst``) gets the sweep's times rounded to 10 s, which the sum
        of its trials' durations would otherwise tell (:mod:`sweeper.datasets.analyst_clock`).
        """
        if not analyst:
            return self.summary, self.summary_body
        shown = for_analyst(self.summary)
        return shown, self.body(("summary", "analyst"), lambda: shown)

    def body(self, key: tuple[str, str | None], make: Any) -> bytes:
        """The encoded body for ``key``, made once per version (made each time, not kept,
        when the sweep is not cacheable or the entry already holds :data:`MAX_BODIES`)."""
        found = self.bodies.get(key)
        if found is not None:
            return found
        made = json.dumps(make()).encode()
        # Bounded: trial pages are keyed by their query, and a client chooses the query.
        if self.etag is not None and len(self.bodies) < MAX_BODIES:
            self.bodies[key] = made
        return made


class SummaryCache:
    def __init__(self, size: int = 64) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[str, Entry] = OrderedDict()
        self._building: dict[str, threading.Lock] = {}
        self._size = size

    def get(self, engine: Engine, sweep_id: str, viewer: Viewer) -> Entry:
        """The sweep's summary and results (raises SweepNotFound if not visible)."""
        return self.get_for(engine, sweep_id, sweep_head(engine, sweep_id, viewer))

    def get_for(self, engine: Engine, sweep_id: str, head: Any) -> Entry:
        """The entry of the sweep at ``head`` (a :class:`~sweeper.sweeps.sweep_pages.SweepHead`
        just read for a viewer who sees it)."""
        cacheable = head.state in TERMINAL or not head.hidden
        hit = self._hit(sweep_id, head, cacheable)
        if hit is not None or not cacheable:
            return hit or self.build(engine, sweep_id, head, cacheable)
        # One build per sweep at a time: concurrent readers of a new version (50 clients, or
        # the start-up warm-up and the first viewer) wait for it instead of repeating it.
        with self._lock:
            building = self._building.setdefault(sweep_id, threading.Lock())
        with building:
            hit = self._hit(sweep_id, head, cacheable)
            return hit or self.build(engine, sweep_id, head, cacheable)

    def _hit(self, sweep_id: str, head: Any, cacheable: bool) -> Entry | None:
        with self._lock:
            entry = self._items.get(sweep_id)
            if entry is not None and cacheable and entry.version == head.version:
                self._items.move_to_end(sweep_id)
                return entry
        return None

    def build(self, engine: Engine, sweep_id: str, head: Any, cacheable: bool) -> Entry:
        """Compute the entry of ``head``'s version (and keep it when ``cacheable``)."""
        sweep = load_sweep(engine, sweep_id)
        summary = summarize(engine, sweep_id, sweep=sweep)
        etag = opaque_tag(sweep_id, *head.version) if cacheable else None
        entry = Entry(head.version, summary, sweep_results(sweep), etag)
        entry.summary_body = json.dumps(summary).encode()
        if cacheable:
            with self._lock:
                self._items[sweep_id] = entry
                while len(self._items) > self._size:
                    gone, _ = self._items.popitem(last=False)
                    self._building.pop(gone, None)
        return entry

    def warm(self, engine: Engine, count: int) -> None:
        """Build the entries of the ``count`` most recently ended sweeps (at start-up, in a
        thread: the first viewer of a big finished sweep then does not wait for its summary,
        whose audited epsilon of the whole search alone takes seconds)."""
        with Session(engine) as session:
            ids = session.scalars(
                select(Sweep.id)
                .where(Sweep.state.in_(list(TERMINAL_SWEEPS)))
                .order_by(Sweep.finished_at.desc())
                .limit(count)
            ).all()
        admin = Viewer(owner=None, admin=True)
        for sweep_id in reversed(ids):  # the newest ends up the most recently used
            self.get(engine, sweep_id, admin)


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def pareto(entry: Entry, sweep_id: str, *, x: str, y: str | None) -> dict[str, Any]:
    """A Pareto front of the released trials.

    ``x=epsilon``: per arm and ε level, the best configuration by ``y`` (mean over seeds),
    against the level. Otherwise a front over individual finished trials of metric ``x``
    against metric ``y`` (e.g. ``x=accuracy&y=ece``, the calibration front).
    """
    res = entry.results
    y = y or res.metric
    known = {k for r in res.records for k in (r.get("metrics") or {})} | {res.metric}
    for name, value in (("x", x), ("y", y)):
        if value != "epsilon" and value not in known:
            raise ConfigError(
                f"unknown metric {value!r} for {name}; this sweep has: epsilon, "
                f"{', '.join(sorted(known))}",
                field=name,
            )
    if y == "epsilon":
        raise ConfigError("y must be a metric; put epsilon on x", field="y")
    x_mode, y_mode = mode_of(x), (res.mode if y == res.metric else mode_of(y))
    points: list[dict[str, Any]] = []
    if x == "epsilon":
        sigma = {
            (g["arm"], float(g["epsilon_budget"])): g.get("noise_multiplier")
            for g in entry.summary.get("plan", [])
        }
        results = best_per_arm_level(res.records, metric=y, mode=y_mode)
        for p in epsilon_front(results, mode=y_mode):
            points.append(
                {
                    "x": p.x,
                    "y": p.y,
                    "arm": p.label,
                    "dominated": p.dominated,
                    "epsilon_budget": p.x,
                    "params": p.payload["best_params"],
                    "y_std": p.payload["objective_std"],
                    "seeds": p.payload["seeds"],
                    "trial": p.payload["best_trial"],
                    "noise_multiplier": sigma.get((p.label, p.x)),
                }
            )
    else:
        done = [
            r
            for r in res.records
            if r.get("state") == "done"
            and _finite((r.get("metrics") or {}).get(x))
            and _finite((r.get("metrics") or {}).get(y))
        ]
        pts = [(float(r["metrics"][x]), float(r["metrics"][y])) for r in done]
        mask = pareto_mask(pts, x_mode=x_mode, y_mode=y_mode)
        for (px, py), r, m in zip(pts, done, mask, strict=True):
            points.append(
                {
                    "x": px,
                    "y": py,
                    "arm": r["arm"],
                    "dominated": not m,
                    "epsilon_budget": r["epsilon_budget"],
                    "trial": r["id"],
                    "params": r["params"],
                    "noise_multiplier": r.get("noise_multiplier"),
                    "single_run_epsilon": r.get("single_run_epsilon"),
                }
            )
    return {"id": sweep_id, "x": x, "y": y, "x_mode": x_mode, "y_mode": y_mode, "points": points}
