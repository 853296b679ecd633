"""API bearer tokens: created once (the secret is shown once), stored as a hash, revocable.

A token belongs to a *name*: the owner of everything created with it. Tokens of one name see
the same sweeps and datasets; admin tokens see everyone's. The secret has 256 random bits, so
a plain SHA-256 of it is a safe verifier (no password-style stretching is needed), and
lookups by hash are one indexed read.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, bindparam, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, NotFound
from sweeper.store.engine import writable
from sweeper.store.rows import ApiToken

PREFIX = "dps"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,99}$")
# last_used_at is bumped at most this often: a write per request would cost every request.
_TOUCH_EVERY = timedelta(seconds=60)


# The placeholders of .env.example: a deployment that still uses one is refused outside dev mode.
EXAMPLE_ADMIN_TOKEN = "dps_example_admin_token_CHANGE_ME_before_any_deployment"
EXAMPLE_DB_PASSWORD = "example-password-CHANGE-ME"
EXAMPLE_RAY_TOKEN = "example-ray-cluster-token-CHANGE-ME"
MIN_BOOTSTRAP_LENGTH = 32


class TokenNotFound(NotFound):
    """No token with that id."""


@dataclass(frozen=True)
class Principal:
    """Who a request acts for."""

    name: str
    admin: bool
    token_id: str | None = None


@dataclass(frozen=True)
class TokenInfo:
    id: str
    name: str
    admin: bool
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def of(cls, row: ApiToken) -> TokenInfo:
        return cls(row.id, row.name, row.admin, row.created_at, row.last_used_at, row.revoked_at)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise ConfigError(
            f"token name {name!r} is not allowed: use 1-100 letters, digits, '.', '_', '@' or "
            "'-', starting with a letter or digit",
            field="name",
        )
    return name


def create_token(engine: Engine, *, name: str, admin: bool = False) -> tuple[str, TokenInfo]:
    """Create a token for ``name``.

    Returns:
        The secret (shown once, never stored) and the stored token's description.
    """
    check_name(name)
    token_id = secrets.token_hex(6)
    secret = f"{PREFIX}_{token_id}_{secrets.token_urlsafe(32)}"
    row = ApiToken(id=token_id, name=name, admin=admin, token_hash=_hash(secret))
    with Session(engine, expire_on_commit=False) as session, session.begin():
        session.add(row)
    return secret, TokenInfo.of(row)


def check_bootstrap_secret(secret: str, *, dev: bool) -> None:
    """Refuse a bootstrap admin token that is the example's or too short (unless ``dev``).

    Raises:
        ConfigError: naming ``DPSWEEP_ADMIN_TOKEN`` and how to make a good one.
    """
    if dev:
        return
    if secret == EXAMPLE_ADMIN_TOKEN:
        raise ConfigError(
            "DPSWEEP_ADMIN_TOKEN is still the example value from .env.example: set your own "
            "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`), or set "
            "DPSWEEP_DEV=true for a throwaway local deployment",
            field="DPSWEEP_ADMIN_TOKEN",
        )
    if len(secret) < MIN_BOOTSTRAP_LENGTH:
        raise ConfigError(
            f"DPSWEEP_ADMIN_TOKEN must be at least {MIN_BOOTSTRAP_LENGTH} characters of "
            "random text (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)",
            field="DPSWEEP_ADMIN_TOKEN",
        )


def ensure_token(engine: Engine, *, name: str, secret: str, admin: bool) -> TokenInfo:
    """Make ``secret`` a valid token of ``name`` (idempotent): how a deployment gets its first
    admin token from the environment, without a shell in the container.

    A revoked bootstrap token stays revoked: revoking it is how an operator retires it.
    """
    check_name(name)
    digest = _hash(secret)
    try:
        with Session(engine, expire_on_commit=False) as session, session.begin():
            row = session.scalars(select(ApiToken).where(ApiToken.token_hash == digest)).first()
            if row is None:
                row = ApiToken(id=digest[:12], name=name, admin=admin, token_hash=digest)
                session.add(row)
    except IntegrityError:
        # Two servers started at once (replicas) both found no row and both inserted it: the
        # other one's insert won, and that row is the token.
        with Session(engine, expire_on_commit=False) as session:
            row = session.scalars(select(ApiToken).where(ApiToken.token_hash == digest)).one()
    return TokenInfo.of(row)


def list_tokens(engine: Engine, *, include_revoked: bool = True) -> list[TokenInfo]:
    with Session(engine) as session:
        stmt = select(ApiToken).order_by(ApiToken.created_at)
        if not include_revoked:
            stmt = stmt.where(ApiToken.revoked_at.is_(None))
        return [TokenInfo.of(r) for r in session.scalars(stmt)]


def revoke_token(engine: Engine, token_id: str) -> TokenInfo:
    """Revoke a token (idempotent); requests with it are refused from now on.

    Raises:
        TokenNotFound: no such token.
    """
    with Session(engine, expire_on_commit=False) as session, session.begin():
        row = session.get(ApiToken, token_id)
        if row is None:
            raise TokenNotFound(f"no token {token_id!r}; `dpsweep token list` shows them")
        if row.revoked_at is None:
            row.revoked_at = _now()
        return TokenInfo.of(row)


# Built once: every authenticated request runs it.
_LOOKUP = select(
    ApiToken.id,
    ApiToken.name,
    ApiToken.admin,
    ApiToken.token_hash,
    ApiToken.revoked_at,
    ApiToken.last_used_at,
).where(ApiToken.token_hash == bindparam("digest"))


def verify_token(engine: Engine, token: str, *, writer: Engine | None = None) -> Principal | None:
    """The principal a presented token stands for, or None if it is unknown or revoked.

    Args:
        engine: Where to look the token up (a server's read engine will do).
        token: The presented secret.
        writer: Where to record that the token was used (default: ``engine``, made writable).
    """
    if not token.startswith(f"{PREFIX}_") or len(token) > 200:
        return None
    digest = _hash(token)
    # A Core connection, not an ORM session: this runs before every request.
    with engine.connect() as conn:
        row = conn.execute(_LOOKUP, {"digest": digest}).first()
    if row is None or row.revoked_at is not None:
        return None
    # Compare again in constant time: the index lookup above is not.
    if not secrets.compare_digest(row.token_hash, digest):
        return None
    principal = Principal(row.name, bool(row.admin), row.id)
    last = row.last_used_at
    if last is not None and last.tzinfo is None:
        last = last.replace(tzinfo=UTC)
    if last is None or _now() - last > _TOUCH_EVERY:
        with Session(writable(writer or engine)) as session, session.begin():
            session.execute(
                update(ApiToken)
                .where(ApiToken.id == principal.token_id)
                .values(last_used_at=_now())
            )
    return principal
