"""Expiry of what the service keeps only for a while: idempotency keys and unused uploads.

* An ``Idempotency-Key`` replays its first response for ``idempotency_ttl_hours``
  (default 24 h); after that the key may be used again for a new request.
* An upload no sweep has used and no analyst holds a grant on is deleted after
  ``upload_ttl_days`` (default 30; unset: never): its name and its file go, never its ledger
  (what was spent on its records stays spent, and the same records uploaded again find it).

The scheduler runs :func:`expire` every ``expiry_every_seconds``.

It lives in the datasets layer, not the store: expiring an upload is deleting a dataset name
(:func:`sweeper.datasets.registration.delete_name`), which the store layer must not import.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, delete, exists, select
from sqlalchemy.orm import Session

from dpsweep.errors import DpsweepError
from sweeper.datasets.names import UPLOAD_PREFIX
from sweeper.datasets.registration import delete_name
from sweeper.store import Dataset, DatasetGrant, IdempotencyRecord, Sweep

log = logging.getLogger(__name__)


@dataclass
class Expired:
    """What one pass of :func:`expire` deleted."""

    idempotency_keys: int = 0
    uploads: list[str] = field(default_factory=list)


def expire_idempotency_keys(engine: Engine, *, older_than: timedelta) -> int:
    """Delete idempotency keys claimed more than ``older_than`` ago; how many."""
    cutoff = datetime.now(UTC) - older_than
    with Session(engine) as session, session.begin():
        res = session.execute(
            delete(IdempotencyRecord).where(IdempotencyRecord.created_at < cutoff)
        )
        return int(res.rowcount or 0)  # type: ignore[attr-defined]


def expire_unused_uploads(engine: Engine, *, older_than: timedelta) -> list[str]:
    """Delete uploads older than ``older_than`` that no sweep used and no active grant names:
    their names and files, never their ledgers. Returns the names deleted."""
    cutoff = datetime.now(UTC) - older_than
    with Session(engine) as session:
        rows = session.execute(
            select(Dataset.name, Dataset.storage_path).where(
                Dataset.name.like(f"{UPLOAD_PREFIX}%"),
                Dataset.created_at < cutoff,
                ~exists().where(Sweep.dataset == Dataset.name),
                ~exists().where(
                    DatasetGrant.dataset == Dataset.name, DatasetGrant.revoked_at.is_(None)
                ),
            )
        ).all()
    deleted: list[str] = []
    for name, path in rows:
        try:
            delete_name(engine, name)
        except DpsweepError as exc:  # reserved meanwhile, or gone: leave it
            log.info("upload %s not expired: %s", name, exc)
            continue
        deleted.append(name)
        if path:
            with Session(engine) as session:
                shared = session.scalar(select(Dataset.id).where(Dataset.storage_path == path))
            if shared is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
    return deleted


def expire(
    engine: Engine,
    *,
    idempotency_ttl: timedelta,
    upload_ttl: timedelta | None,
) -> Expired:
    """One pass of expiry (see the module docstring)."""
    out = Expired(idempotency_keys=expire_idempotency_keys(engine, older_than=idempotency_ttl))
    if upload_ttl is not None:
        out.uploads = expire_unused_uploads(engine, older_than=upload_ttl)
    return out
