"""Encoded pages of a *finished* sweep's trials, cached by the sweep's version.

A page of trials is the slow read of a big sweep (it decodes every row's JSON columns and
encodes the page again), and a dashboard opening a finished sweep of thousands of trials reads
all of its pages, as does every other viewer. A trial's row changes only with an event of its
sweep (:mod:`sweeper.sweeps.events`), and a page's kept-model refs change only with a
:class:`~sweeper.store.ModelArtifact` row (added or replaced with a newer ``created_at``, or
deleted with the sweep), so a page is cached under the sweep's version
(:func:`sweeper.sweeps.sweep_pages.sweep_head`) *and* the stamp of its models' rows
(``SweepHead.models``), and only once the sweep has ended: a running sweep's version moves
with every event, so caching its pages would only cost memory.

What a page shows (release policy, visibility) is still decided by
:func:`sweeper.sweeps.trial_pages.page_trials` for every cached body; the cache is keyed by
the query too and by whether its reader is the sweep's analyst (whose page has coarse times,
:mod:`sweeper.datasets.analyst_clock`), and who may read it is checked by ``sweep_head`` on
every request.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from sweeper.sweeps.stored import TERMINAL_SWEEPS

TERMINAL = {s.value for s in TERMINAL_SWEEPS}


def encode(content: Any) -> bytes:
    """JSON as :class:`fastapi.responses.JSONResponse` renders it (NaN refused)."""
    return json.dumps(
        content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


class PageCache:
    """An LRU of encoded trial pages, ``(sweep, version, stamp, query) -> bytes``."""

    def __init__(self, size: int = 512) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
        self._size = size

    def get(
        self,
        sweep_id: str,
        head: Any,
        query: tuple[Any, ...],
        make: Callable[[], dict[str, Any]],
    ) -> bytes:
        """The page's body: cached when the sweep (``head``, just read for this viewer) has
        ended, otherwise ``make()`` encoded."""
        if head.state not in TERMINAL:
            return encode(make())
        # An analyst's page and its dataset owner's differ (worker, times): never shared.
        key = (sweep_id, head.version, head.models, head.analyst, query)
        with self._lock:
            body = self._items.get(key)
            if body is not None:
                self._items.move_to_end(key)
                return body
        body = encode(make())
        with self._lock:
            self._items[key] = body
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return body
