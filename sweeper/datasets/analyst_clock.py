"""What an analyst receives of the clock and the machines: nothing finer than 10 s, no worker.

A DP-SGD step's time grows with its realised Poisson batch, whose size depends on the records
(about 1.1 µs of median step time per record for a small MLP: N and N − 4,000 were 1.8
standard deviations apart in one trial). So a trial's per-step times and its exact durations
are functions of the secret records that no ε covers, and which worker process or host ran it
says nothing an analyst needs. An **analyst** of a dataset (a tenant who holds or held a grant
on a dataset they do not own: :mod:`sweeper.datasets.grants`) therefore receives:

* no worker id (``worker`` is null) and no per-step time (``step_time_ms_median`` is null);
* durations rounded down to a multiple of :data:`CLOCK_SECONDS` (``train_seconds``);
* clock times rounded down to a multiple of :data:`CLOCK_SECONDS`, and a span's end as its
  rounded start plus its rounded duration (:func:`coarse_span`), so that the two times together
  never tell a duration finer than the rounded one.

Every key stays in the response with the same type (a null where a figure is withheld), so
what an analyst receives has the same shape whatever the data. The dataset's owner (its
uploader, admins and local use) keeps every figure. The moment a trial ends is still seen by
whoever watches (a poll, a live stream): rounding stored figures does not close that channel.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from sweeper.datasets.viewer import Viewer
from sweeper.store import Dataset, DatasetGrant, iso

#: The resolution of every clock time and duration an analyst receives, in seconds.
CLOCK_SECONDS = 10

#: What an analyst never receives of a trial: which machine ran it, and its per-step time.
WITHHELD = ("worker", "step_time_ms_median")


def analyst_names(session: Session, tenant: str | None, names: Iterable[str]) -> set[str]:
    """Those of ``names`` that ``tenant`` is an analyst of: another tenant's uploads, and
    names an admin registered on which ``tenant`` holds (or held) a grant; one or two
    queries. Built-in and loader names are nobody's data to grant: never an analyst's."""
    wanted = set(names)
    if tenant is None or not wanted:
        return set()
    rows = session.execute(select(Dataset.name, Dataset.owner).where(Dataset.name.in_(wanted)))
    out: set[str] = set()
    ownerless: set[str] = set()
    for name, owner in rows:
        if owner is None:
            ownerless.add(name)
        elif owner != tenant:
            out.add(name)
    if ownerless:
        out |= set(
            session.scalars(
                select(DatasetGrant.dataset).where(
                    DatasetGrant.dataset.in_(ownerless), DatasetGrant.analyst == tenant
                )
            )
        )
    return out


def reads_as_analyst(session: Session, viewer: Viewer, dataset: str) -> bool:
    """Whether ``viewer`` reads a sweep on ``dataset`` as its analyst: a tenant who does not
    own the dataset (admins and local use read everything as an owner)."""
    if viewer.admin or viewer.owner is None:
        return False
    return dataset in analyst_names(session, viewer.owner, [dataset])


def coarse_seconds(seconds: float | None) -> float | None:
    """A duration rounded down to a multiple of :data:`CLOCK_SECONDS` (None stays None)."""
    if seconds is None or not math.isfinite(seconds):
        return None
    return float(max(0, math.floor(seconds / CLOCK_SECONDS)) * CLOCK_SECONDS)


def _parse(value: datetime | str | None) -> datetime | None:
    if value is None:
        return None
    dt = datetime.fromisoformat(value) if isinstance(value, str) else value
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def _floor(dt: datetime) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    seconds = math.floor((dt - epoch).total_seconds() / CLOCK_SECONDS) * CLOCK_SECONDS
    return epoch + timedelta(seconds=seconds)


def coarse_time(value: datetime | str | None) -> str | None:
    """A clock time (a datetime or ISO text) rounded down to :data:`CLOCK_SECONDS`, as ISO."""
    dt = _parse(value)
    return None if dt is None else iso(_floor(dt))


def coarse_span(
    started: datetime | str | None, finished: datetime | str | None
) -> tuple[str | None, str | None]:
    """A span's start and end as an analyst receives them (ISO text; None stays None).

    The start is rounded down to :data:`CLOCK_SECONDS`; the end is that start plus the span's
    duration rounded down likewise. Rounding both ends on their own would not do: whether the
    two fall in the same 10 s slot depends on the exact duration, so over many trials the
    rounded ends would still measure it.
    """
    s, f = _parse(started), _parse(finished)
    if s is None:
        return None, coarse_time(f)
    start = _floor(s)
    if f is None:
        return iso(start), None
    duration = coarse_seconds((f - s).total_seconds()) or 0.0
    return iso(start), iso(start + timedelta(seconds=duration))


def for_analyst(record: dict[str, Any]) -> dict[str, Any]:
    """A trial's (or a sweep's) record as its analyst receives it: the same keys, with the
    worker and per-step times null, durations and clock times coarse (:func:`coarse_span`).
    Keys the record lacks are not added."""
    out = dict(record)
    for key in WITHHELD:
        if key in out:
            out[key] = None
    if "train_seconds" in out:
        out["train_seconds"] = coarse_seconds(out["train_seconds"])
    if "started_at" in out or "finished_at" in out:
        span = coarse_span(out.get("started_at"), out.get("finished_at"))
        for key, value in zip(("started_at", "finished_at"), span, strict=True):
            if key in out:
                out[key] = value
    return out
