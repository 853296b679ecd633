"""``Idempotency-Key``: a retried POST gets the first response again, and creates nothing.

The first request with a key inserts a placeholder row (unique per owner and key) *before*
doing anything, so two concurrent requests with one key cannot both create a sweep: the
second waits for the first to finish and replays its response. A key reused with another
body is refused (422). Responses below 500 are kept and replayed; after a 5xx the key is
freed, so the client may retry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import Engine, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.errors import ApiError
from sweeper.store import IdempotencyRecord

MAX_KEY_LENGTH = 200


@dataclass(frozen=True)
class Replay:
    status: int
    body: str
    location: str | None


def check_key(key: str) -> str:
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise ApiError(
            422,
            f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} printable characters (a UUID, say)",
            kind="invalid-input",
            field="Idempotency-Key",
        )
    return key


def claim(
    engine: Engine, *, owner: str, key: str, request_hash: str, wait_seconds: float
) -> Replay | None:
    """Claim ``key`` for this request (None), or the response to replay.

    Raises:
        ApiError: 422 if the key was used with another body; 409 if its first request is
            still running after ``wait_seconds``.
    """
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            with Session(engine) as session, session.begin():
                session.add(IdempotencyRecord(owner=owner, key=key, request_hash=request_hash))
            return None
        except IntegrityError:
            pass
        with Session(engine) as session:
            row = session.scalars(
                select(IdempotencyRecord).where(
                    IdempotencyRecord.owner == owner, IdempotencyRecord.key == key
                )
            ).first()
            if row is None:
                continue  # the first request failed and freed the key: claim it now
            if row.request_hash != request_hash:
                raise ApiError(
                    422,
                    "this Idempotency-Key was already used with a different request body; "
                    "use a new key for a new request",
                    kind="idempotency-key-reused",
                    field="Idempotency-Key",
                )
            if row.status is not None:
                return Replay(row.status, row.body or "", row.location)
        if time.monotonic() > deadline:
            raise ApiError(
                409,
                "a request with this Idempotency-Key is still being processed; retry later",
                kind="idempotency-in-progress",
            )
        time.sleep(0.1)


def complete(
    engine: Engine, *, owner: str, key: str, status: int, body: str, location: str | None
) -> None:
    """Keep the response to replay (or free the key after a server error)."""
    with Session(engine) as session, session.begin():
        where = (IdempotencyRecord.owner == owner, IdempotencyRecord.key == key)
        if status >= 500:
            session.execute(delete(IdempotencyRecord).where(*where))
        else:
            session.execute(
                update(IdempotencyRecord)
                .where(*where)
                .values(status=status, body=body, location=location)
            )
