"""The privacy budget ledger: lifetime ε/δ caps per dataset, reserved and charged atomically.

A dataset may carry a lifetime cap on ε (and on δ). Money-like bookkeeping follows:

* **reserve** — when a sweep is accepted it reserves its whole cost (the sum over its arms and
  ε levels). The reservation succeeds only if ``spent + reserved + ε <= cap`` (and the same for
  δ when a δ cap exists); otherwise :class:`BudgetExhausted` is raised and nothing changes.
* **charge** — before a trial touches data, its cost moves from its sweep's reservation to
  *spent*. Charges are never undone: a trial that touched data stays charged even if it later
  fails or is cancelled. Charging more than the sweep still holds raises
  :class:`ReservationExceeded` and changes nothing (fail closed).
* **release** — when the sweep ends, whatever it reserved but never charged (trials that never
  started) goes back to the dataset.

The invariant ``spent + reserved <= cap`` holds after every committed operation, and ``spent``
never decreases. Every operation writes one row to the entries table, so the running totals on
the dataset row can always be re-derived from the audit trail (``summary`` totals equal the sums
of the entries).

**Exact arithmetic.** Amounts are :class:`~decimal.Decimal` values that are *exactly* the numbers
the caller passed (a float converts to its exact binary value), added and compared without any
rounding and without a tolerance, so sums cannot drift above a cap. The consequence is honest but
sometimes surprising: ``0.1`` as a float is slightly more than 1/10, so ten float reservations of
``0.1`` do not fit a cap of ``1.0``, while ten of ``Decimal("0.1")`` do. Pass ``Decimal`` values
when decimal amounts must add up exactly.

**Atomicity.** Each operation is one database transaction that reads the dataset row, checks,
and writes, under a write lock:

* SQLite: :func:`create_ledger_engine` turns off the sqlite3 driver's own transaction handling
  (``isolation_level=None``) and emits ``BEGIN IMMEDIATE`` from SQLAlchemy's ``begin`` event,
  as SQLAlchemy's SQLite documentation describes. ``BEGIN IMMEDIATE`` takes the database's
  write lock *before* the first read, so a second writer (thread or process) waits — up to the
  busy timeout — until the first commits, and then reads the new totals. With the driver's
  default (deferred) behaviour both writers could read the same totals before either wrote,
  and two sweeps racing for the last budget could both win.
* PostgreSQL: the dataset row is read with ``SELECT ... FOR UPDATE`` (``with_for_update()``, a
  no-op on SQLite), which serialises writers on that row. Under the default READ COMMITTED
  isolation every later statement in the transaction sees what earlier lock holders committed.

Schema: :func:`create_ledger_tables` creates the two tables for tests and local use. The later
store issue moves schema creation into Alembic migrations and merges :class:`LedgerBase` into
the project's declarative base.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import (
    Clamped,
    Context,
    Decimal,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
    Rounded,
    Subnormal,
    Underflow,
)
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    CheckConstraint,
    DateTime,
    Dialect,
    Engine,
    Enum,
    ForeignKey,
    Index,
    MetaData,
    Numeric,
    Select,
    String,
    Text,
    create_engine,
    event,
    select,
    update,
)
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.types import TypeDecorator, TypeEngine

from workers.errors import ConfigError, PrivacyError

__all__ = [
    "IDENTITY_PREFIX",
    "BudgetExhausted",
    "BudgetLedger",
    "BudgetSummary",
    "CarriedOver",
    "DatasetBudget",
    "EntryKind",
    "LedgerBase",
    "LedgerEntry",
    "LedgerRecord",
    "Remaining",
    "Reservation",
    "ReservationExceeded",
    "SweepBalance",
    "create_ledger_engine",
    "create_ledger_tables",
    "identity_key",
    "summed_entries",
    "writable",
]

#: Longest dataset key, sweep id or trial id accepted (the columns are ``VARCHAR(200)``).
KEY_MAX_LENGTH = 200

#: Prefix of ledger keys that are a dataset's content identity (``sha256:<64 hex digits>``,
#: see :func:`workers.datasets.content_sha256`) rather than a name.
IDENTITY_PREFIX = "sha256:"

#: Seconds a writer waits for SQLite's write lock before giving up with "database is locked".
#: Ledger transactions are a handful of small statements, so a wait this long means something
#: else holds the lock; giving up then (and not running the trial) is the fail-closed answer.
SQLITE_BUSY_TIMEOUT_S = 30.0

# Execution option that marks a connection as read-only, so that it begins a deferred
# transaction instead of taking the write lock (see _sqlite_begin).
_READ_ONLY_OPTION = "dpsweep_ledger_read_only"

ZERO = Decimal(0)

# Every amount is within float range and no finer than the finest float (2**-1074 has 1074
# decimal places), so exact sums need at most a few thousand digits. Any operation that would
# round anyway traps, and the operation fails instead of silently drifting.
_EXACT = Context(
    prec=5000,
    Emax=999_999,
    Emin=-999_999,
    traps=[
        Clamped,
        DivisionByZero,
        Inexact,
        InvalidOperation,
        Overflow,
        Rounded,
        Subnormal,
        Underflow,
    ],
)
_MIN_EXPONENT = -1100
_MAX_ADJUSTED_EXPONENT = 308


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class BudgetExhausted(PrivacyError):
    """A reservation would take a dataset past its lifetime ε or δ cap; nothing was reserved.

    Attributes:
        dataset: The dataset key.
        quantity: ``"epsilon"`` or ``"delta"``, whichever cap refused.
        requested: The amount asked for.
        remaining: What the cap still allowed.
    """

    def __init__(
        self, message: str, *, dataset: str, quantity: str, requested: Decimal, remaining: Decimal
    ) -> None:
        super().__init__(message)
        self.dataset = dataset
        self.quantity = quantity
        self.requested = requested
        self.remaining = remaining


class ReservationExceeded(PrivacyError):
    """A charge is larger than what its sweep still holds in reservation; nothing was charged.

    Attributes:
        dataset: The dataset key.
        sweep_id: The sweep that tried to charge.
        quantity: ``"epsilon"`` or ``"delta"``, whichever was short.
        requested: The amount the charge asked for.
        outstanding: What the sweep still held.
    """

    def __init__(
        self,
        message: str,
        *,
        dataset: str,
        sweep_id: str,
        quantity: str,
        requested: Decimal,
        outstanding: Decimal,
    ) -> None:
        super().__init__(message)
        self.dataset = dataset
        self.sweep_id = sweep_id
        self.quantity = quantity
        self.requested = requested
        self.outstanding = outstanding


# --------------------------------------------------------------------------------------------
# Column types
# --------------------------------------------------------------------------------------------


class ExactDecimal(TypeDecorator[Decimal]):
    """A ``Decimal`` stored without any rounding.

    PostgreSQL's unconstrained ``NUMERIC`` is exact, so it is used there. SQLite has no exact
    decimal type: a ``NUMERIC`` column converts values to 8-byte floats, which is precisely the
    drift this ledger must not have. Elsewhere the value is therefore stored as its positional
    decimal text. The ledger never compares or sums amounts in SQL (it does so in Python while
    holding the write lock), so text storage costs nothing.
    """

    impl = String
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(Numeric(asdecimal=True))
        return dialect.type_descriptor(String())

    def process_bind_param(self, value: Decimal | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if not isinstance(value, Decimal) or not value.is_finite():
            raise TypeError(f"ExactDecimal needs a finite Decimal, got {value!r}")
        if dialect.name == "postgresql":
            return value
        return format(value, "f")

    def process_result_value(self, value: Any, dialect: Dialect) -> Decimal | None:
        if value is None:
            return None
        if isinstance(value, Decimal):
            return value
        if isinstance(value, str):
            return Decimal(value)
        # A float here would mean the column was created with another type: refuse to guess.
        raise TypeError(f"ExactDecimal column returned {type(value).__name__}, not text")


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp (SQLite stores it naive; it comes back as UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise TypeError("UTCDateTime needs a timezone-aware datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def _utcnow() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


class LedgerBase(DeclarativeBase):
    """Declarative base of the ledger tables (the store issue merges it into the project's)."""

    # Named constraints, so that Alembic migrations can refer to them by name later.
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class EntryKind(StrEnum):
    """What a ledger entry did."""

    RESERVE = "reserve"
    """The sweep set ε/δ aside: ``reserved += amount``."""
    CHARGE = "charge"
    """A trial of the sweep touched data: ``reserved -= amount``, ``spent += amount``."""
    RELEASE = "release"
    """The sweep ended and gave back its uncharged reservation: ``reserved -= amount``."""


class DatasetBudget(LedgerBase):
    """One dataset's lifetime caps and running totals.

    The totals are a cache of the entries (kept in the same transaction as the entry that
    changes them) so that the reserve check reads one locked row. A ``NULL`` cap means no cap.
    """

    __tablename__ = "dataset_budgets"

    id: Mapped[int] = mapped_column(primary_key=True)
    dataset: Mapped[str] = mapped_column(String(KEY_MAX_LENGTH), unique=True)
    epsilon_cap: Mapped[Decimal | None] = mapped_column(ExactDecimal())
    delta_cap: Mapped[Decimal | None] = mapped_column(ExactDecimal())
    epsilon_spent: Mapped[Decimal] = mapped_column(ExactDecimal(), default=ZERO)
    delta_spent: Mapped[Decimal] = mapped_column(ExactDecimal(), default=ZERO)
    epsilon_reserved: Mapped[Decimal] = mapped_column(ExactDecimal(), default=ZERO)
    delta_reserved: Mapped[Decimal] = mapped_column(ExactDecimal(), default=ZERO)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=_utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=_utcnow)


class LedgerEntry(LedgerBase):
    """One reservation, charge or release. Amounts are non-negative; ``kind`` gives the sign."""

    __tablename__ = "budget_ledger_entries"
    __table_args__ = (
        Index("ix_budget_ledger_entries_dataset_sweep", "dataset", "sweep_id"),
        # Only charges belong to a trial, and every charge must say which trial it was.
        CheckConstraint("(kind = 'charge') = (trial_id IS NOT NULL)", name="trial_id_iff_charge"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    dataset: Mapped[str] = mapped_column(
        String(KEY_MAX_LENGTH), ForeignKey("dataset_budgets.dataset")
    )
    sweep_id: Mapped[str] = mapped_column(String(KEY_MAX_LENGTH))
    trial_id: Mapped[str | None] = mapped_column(String(KEY_MAX_LENGTH))
    kind: Mapped[EntryKind] = mapped_column(
        Enum(
            EntryKind,
            name="ledger_entry_kind",
            native_enum=False,
            create_constraint=True,
            length=16,
            values_callable=lambda kinds: [kind.value for kind in kinds],
        )
    )
    epsilon: Mapped[Decimal] = mapped_column(ExactDecimal())
    delta: Mapped[Decimal] = mapped_column(ExactDecimal())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=_utcnow)
    note: Mapped[str] = mapped_column(Text, default="")


# --------------------------------------------------------------------------------------------
# Plain results (detached from any session)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerRecord:
    """A committed ledger entry, as returned by reserve, charge, release and entries."""

    id: int
    dataset: str
    sweep_id: str
    trial_id: str | None
    kind: EntryKind
    epsilon: Decimal
    delta: Decimal
    created_at: datetime
    note: str

    @classmethod
    def from_row(cls, row: LedgerEntry) -> LedgerRecord:
        return cls(
            id=row.id,
            dataset=row.dataset,
            sweep_id=row.sweep_id,
            trial_id=row.trial_id,
            kind=EntryKind(row.kind),
            epsilon=row.epsilon,
            delta=row.delta,
            created_at=row.created_at,
            note=row.note,
        )


#: What :meth:`BudgetLedger.reserve` returns: the recorded ``reserve`` entry.
Reservation = LedgerRecord


@dataclass(frozen=True)
class Remaining:
    """Budget left under a dataset's caps; ``None`` means that quantity has no cap."""

    epsilon: Decimal | None
    delta: Decimal | None


@dataclass(frozen=True)
class BudgetSummary:
    """A dataset's caps and totals at one moment (all exact)."""

    dataset: str
    epsilon_cap: Decimal | None
    delta_cap: Decimal | None
    epsilon_spent: Decimal
    delta_spent: Decimal
    epsilon_reserved: Decimal
    delta_reserved: Decimal

    @property
    def remaining(self) -> Remaining:
        """What a new reservation could still take (``None`` where uncapped)."""
        return Remaining(
            epsilon=_left(self.epsilon_cap, self.epsilon_spent, self.epsilon_reserved),
            delta=_left(self.delta_cap, self.delta_spent, self.delta_reserved),
        )


@dataclass(frozen=True)
class SweepBalance:
    """One sweep's totals on one dataset."""

    dataset: str
    sweep_id: str
    epsilon_reserved: Decimal
    delta_reserved: Decimal
    epsilon_charged: Decimal
    delta_charged: Decimal
    epsilon_released: Decimal
    delta_released: Decimal
    reservations: int = 0
    """How many ``reserve`` entries the sweep has (a sweep must reserve before it charges)."""

    @property
    def epsilon_outstanding(self) -> Decimal:
        """ε reserved and neither charged nor released: what charges may still take."""
        return _sub(_sub(self.epsilon_reserved, self.epsilon_charged), self.epsilon_released)

    @property
    def delta_outstanding(self) -> Decimal:
        """δ reserved and neither charged nor released."""
        return _sub(_sub(self.delta_reserved, self.delta_charged), self.delta_released)


@dataclass(frozen=True)
class CarriedOver:
    """What :meth:`BudgetLedger.carry_over` moved from one ledger key to another."""

    source: str
    target: str
    entries: int
    """How many entries moved (their notes say where they came from)."""
    epsilon_spent: Decimal
    delta_spent: Decimal
    epsilon_reserved: Decimal
    delta_reserved: Decimal
    """The source's totals, now added to the target's."""
    summary: BudgetSummary
    """The target after the move."""
    cap_clamped: bool
    """The stricter cap was below what both keys had committed together: it was set to that
    total (nothing is left) instead, since spent budget cannot be un-spent."""


# --------------------------------------------------------------------------------------------
# Engine set-up
# --------------------------------------------------------------------------------------------


def _sqlite_connect(dbapi_connection: Any, connection_record: Any) -> None:
    # Take transaction control away from the sqlite3 driver: in its legacy mode it emits BEGIN
    # only before INSERT/UPDATE/DELETE, so the SELECT that reads the totals would run outside
    # the transaction and two writers could both read the old totals. _sqlite_begin emits our
    # BEGIN instead; the driver still issues COMMIT/ROLLBACK correctly. (The busy timeout comes
    # from the driver's ``timeout`` argument, set in create_ledger_engine.)
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys = ON")
        # WAL lets readers (summaries, dashboards) read a snapshot while a writer holds the
        # write lock. synchronous stays at its default (FULL): a charge that was acknowledged
        # must survive a power cut, or the ledger would under-count spent budget.
        cursor.execute("PRAGMA journal_mode = WAL")
    finally:
        cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    # BEGIN IMMEDIATE takes SQLite's write lock before the first read, so the read-check-write
    # of reserve/charge/release runs with no other writer in between. A second writer blocks
    # here (for up to the busy timeout) and then reads the totals the first one committed.
    # Read-only operations take a deferred BEGIN: a consistent snapshot without the write lock.
    if conn.get_execution_options().get(_READ_ONLY_OPTION):
        conn.exec_driver_sql("BEGIN DEFERRED")
    else:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def read_only(engine: Engine) -> Engine:
    """The same engine for reads only: on SQLite its transactions begin DEFERRED (a snapshot,
    without the write lock), so readers do not queue behind each other and behind writers."""
    return engine.execution_options(**{_READ_ONLY_OPTION: True})


def writable(engine: Engine) -> Engine:
    """The same engine for writes, also when ``engine`` came from :func:`read_only` (its
    SQLite transactions then begin IMMEDIATE again, taking the write lock before they read)."""
    return engine.execution_options(**{_READ_ONLY_OPTION: False})


def _is_sqlite_ready(engine: Engine) -> bool:
    # An engine from engine.execution_options() (read_only, writable) shares its parent's
    # listeners; such engines may wrap each other.
    base = engine
    while hasattr(base, "_proxied"):
        base = base._proxied
    return event.contains(base, "connect", _sqlite_connect) and event.contains(
        base, "begin", _sqlite_begin
    )


def create_ledger_engine(url: str, **engine_kwargs: Any) -> Engine:
    """Create an engine that the ledger can use atomically.

    For SQLite it sets a busy timeout, turns off the sqlite3 driver's transaction handling and
    installs the ``BEGIN IMMEDIATE`` hook (see the module docstring). Only file databases are
    accepted: ``:memory:`` gives every connection its own private database, so threads would
    not share one ledger. Other URLs (PostgreSQL) get a plain engine; the ledger's
    ``SELECT ... FOR UPDATE`` does the locking there.

    Args:
        url: A SQLAlchemy database URL, e.g. ``sqlite:////var/lib/dpsweep/ledger.db``.
        **engine_kwargs: Passed on to :func:`sqlalchemy.create_engine` (e.g. ``pool_size``).

    Returns:
        The configured engine.

    Raises:
        ConfigError: If the URL cannot be parsed or names an in-memory SQLite database.
    """
    try:
        parsed = make_url(url)
    except Exception as exc:  # ArgumentError, ValueError: both mean a malformed URL
        raise ConfigError(f"invalid database URL {url!r}: {exc}", field="url") from exc
    if parsed.get_backend_name() == "postgresql":
        # READ COMMITTED (PostgreSQL's default, made explicit): after FOR UPDATE waits for the
        # previous holder of the dataset row, the following statements see what it committed.
        # Under REPEATABLE READ the same wait ends in a serialization error instead.
        engine_kwargs.setdefault("isolation_level", "READ COMMITTED")
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, **engine_kwargs)
    database = parsed.database or ""
    if database in ("", ":memory:") or parsed.query.get("mode") == "memory":
        raise ConfigError(
            "the budget ledger needs a SQLite *file* database (an in-memory database is private "
            "to one connection, so concurrent sweeps would not see each other's reservations)",
            field="url",
        )
    connect_args = dict(engine_kwargs.pop("connect_args", {}))
    connect_args.setdefault("timeout", SQLITE_BUSY_TIMEOUT_S)
    engine = create_engine(parsed, connect_args=connect_args, **engine_kwargs)
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def create_ledger_tables(engine: Engine) -> None:
    """Create the ledger tables if they do not exist (tests and local use).

    The later store issue replaces this with Alembic migrations; the project's rule is that
    the schema comes from migrations only, never ``create_all``, outside tests.

    Args:
        engine: The engine to create the tables on.
    """
    LedgerBase.metadata.create_all(engine)


# --------------------------------------------------------------------------------------------
# Validation and exact arithmetic
# --------------------------------------------------------------------------------------------


def _exact(value: object, field: str) -> Decimal:
    """Convert a user amount to the exact Decimal it denotes, or raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real | Decimal):
        raise ConfigError(
            f"{field} must be a number (int, float or Decimal), got {type(value).__name__}",
            field=field,
        )
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ConfigError(f"{field} must be finite, got {value!r}", field=field)
        amount = value
    elif isinstance(value, numbers.Integral):
        amount = Decimal(int(value))
    else:
        as_float = float(value)
        if not math.isfinite(as_float):
            raise ConfigError(f"{field} must be finite, got {value!r}", field=field)
        # Fractions, long doubles, ...: only values a float holds exactly are accepted, so the
        # ledger never records a rounded amount.
        if as_float != value:
            raise ConfigError(
                f"{field}={value!r} is not exactly representable; pass a float or a Decimal",
                field=field,
            )
        amount = Decimal(as_float)  # the float's exact binary value
    if amount.is_zero():
        return ZERO  # also turns -0.0 into 0
    if amount < 0:
        raise ConfigError(f"{field} must be >= 0, got {value!r}", field=field)
    exponent = amount.as_tuple().exponent
    assert isinstance(exponent, int)  # finite, checked above
    if exponent < _MIN_EXPONENT or amount.adjusted() > _MAX_ADJUSTED_EXPONENT:
        raise ConfigError(
            f"{field}={value!r} is outside the range the ledger can add exactly "
            f"(at most 1e{_MAX_ADJUSTED_EXPONENT}, no finer than 1e{_MIN_EXPONENT})",
            field=field,
        )
    return amount.normalize(_EXACT)  # exact: at most 1409 digits, far below the precision


def _epsilon(value: object, field: str = "epsilon") -> Decimal:
    return _exact(value, field)


def _delta(value: object, field: str = "delta") -> Decimal:
    amount = _exact(value, field)
    if amount >= 1:
        raise ConfigError(f"{field} must be in [0, 1), got {value!r}", field=field)
    return amount


def _key(value: object, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{field} must be a non-empty string, got {value!r}", field=field)
    if len(value) > KEY_MAX_LENGTH:
        raise ConfigError(
            f"{field} is {len(value)} characters long; at most {KEY_MAX_LENGTH} are allowed",
            field=field,
        )
    return value


def identity_key(content_sha256: str) -> str:
    """The ledger key of a dataset's records: ``sha256:<hex>``.

    Raises:
        ConfigError: If ``content_sha256`` is not 64 lowercase hex digits.
    """
    if (
        not isinstance(content_sha256, str)
        or len(content_sha256) != 64
        or any(c not in "0123456789abcdef" for c in content_sha256)
    ):
        raise ConfigError("a content identity is 64 lowercase hex digits", field="content_sha256")
    return IDENTITY_PREFIX + content_sha256


def _dataset_label(key: str) -> str:
    """How messages name a ledger key. Never a content identity: messages reach analysts
    (a refused sweep, a trial's error), and the hash of every record lets anyone who knows all
    records but one test guesses of the last. The caller knows which name was meant."""
    if key.startswith(IDENTITY_PREFIX):
        return "the dataset"
    return f"dataset {key!r}"


def _note(value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"note must be a string, got {type(value).__name__}", field="note")
    return value


def _add(a: Decimal, b: Decimal) -> Decimal:
    return _checked(_EXACT.add, a, b)


def _sub(a: Decimal, b: Decimal) -> Decimal:
    return _checked(_EXACT.subtract, a, b)


def _checked(op: Any, a: Decimal, b: Decimal) -> Decimal:
    try:
        # normalize() drops trailing zeros (exactly) so stored text does not grow with use.
        result = op(a, b).normalize(_EXACT)
    except ArithmeticError as exc:  # decimal signals derive from ArithmeticError
        # Cannot happen for validated inputs; refusing is the fail-closed answer if it does.
        raise PrivacyError(f"ledger arithmetic would round ({a} and {b}); refusing") from exc
    assert isinstance(result, Decimal)
    return result


def _stricter(a: Decimal | None, b: Decimal | None) -> Decimal | None:
    """The smaller cap (``None``, no cap, is the loosest)."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _left(cap: Decimal | None, spent: Decimal, reserved: Decimal) -> Decimal | None:
    if cap is None:
        return None
    return _sub(cap, _add(spent, reserved))


def _show(value: Decimal) -> str:
    """A short human form of an exact amount (the shortest float repr that reads back to it)."""
    as_float = float(value)
    return repr(as_float) if Decimal(as_float) == value else f"≈{as_float!r}"


def _show_pair(asked: Decimal, left: Decimal) -> tuple[str, str]:
    # Two different exact amounts can share a short form (e.g. 0.3 vs 0.3 + 1 ulp); then the
    # message would read "asked 0.3, 0.3 remains", so show the exact values instead.
    short_asked, short_left = _show(asked), _show(left)
    if short_asked.lstrip("≈") == short_left.lstrip("≈") and asked != left:
        return str(asked), str(left)
    return short_asked, short_left


# --------------------------------------------------------------------------------------------
# The ledger
# --------------------------------------------------------------------------------------------


def _budget_row_stmt(dataset: str) -> Select[DatasetBudget]:
    # FOR UPDATE locks the dataset row on PostgreSQL until commit, serialising every writer of
    # this dataset; SQLAlchemy omits it on SQLite, where BEGIN IMMEDIATE already holds the lock.
    return select(DatasetBudget).where(DatasetBudget.dataset == dataset).with_for_update()


class BudgetLedger:
    """Lifetime ε/δ budgets per dataset, with atomic reserve, charge and release.

    Every public method is one transaction; a failure anywhere inside it rolls the whole
    operation back, so the ledger is never left half-updated. Datasets without a row (never
    capped, never reserved against) have no cap; their first reservation creates the row, and
    every reservation and charge is recorded all the same.

    Args:
        engine: An engine from :func:`create_ledger_engine` (required for SQLite, whose
            atomicity depends on the ``BEGIN IMMEDIATE`` hook it installs).

    Raises:
        ConfigError: If ``engine`` is a SQLite engine without that configuration.
    """

    def __init__(self, engine: Engine) -> None:
        if engine.dialect.name == "sqlite" and not _is_sqlite_ready(engine):
            # Without BEGIN IMMEDIATE two sweeps could both reserve the last budget: refuse.
            raise ConfigError(
                "this SQLite engine was not configured for the ledger; create it with "
                "sweeper.ledger.create_ledger_engine(url) so reservations are atomic",
                field="engine",
            )
        self._engine = engine
        self._writer = sessionmaker(bind=engine, expire_on_commit=False)
        self._reader = sessionmaker(
            bind=engine.execution_options(**{_READ_ONLY_OPTION: True}), expire_on_commit=False
        )

    @property
    def engine(self) -> Engine:
        """The engine the ledger writes to."""
        return self._engine

    # -- transactions ------------------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[Session]:
        # One transaction per operation: commit on success, roll back on any exception.
        with self._writer.begin() as session:
            yield session

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._reader.begin() as session:
            yield session

    @staticmethod
    def _lock_budget(session: Session, dataset: str, *, create: bool) -> DatasetBudget | None:
        budget = session.scalars(_budget_row_stmt(dataset)).one_or_none()
        if budget is not None or not create:
            return budget
        # First use of this dataset: create its (uncapped) row. On PostgreSQL two transactions
        # can get here at once (FOR UPDATE locks no row that does not exist yet); the loser's
        # INSERT fails on the unique key once the winner commits, and it then locks the
        # winner's row. The savepoint keeps the outer transaction usable after that failure.
        try:
            with session.begin_nested():
                budget = DatasetBudget(
                    dataset=dataset,
                    epsilon_spent=ZERO,
                    delta_spent=ZERO,
                    epsilon_reserved=ZERO,
                    delta_reserved=ZERO,
                )
                session.add(budget)
        except IntegrityError:
            budget = session.scalars(_budget_row_stmt(dataset)).one()
        return budget

    @staticmethod
    def _balance(session: Session, dataset: str, sweep_id: str) -> SweepBalance:
        rows = session.execute(
            select(LedgerEntry.kind, LedgerEntry.epsilon, LedgerEntry.delta).where(
                LedgerEntry.dataset == dataset, LedgerEntry.sweep_id == sweep_id
            )
        ).all()
        totals = {kind: [ZERO, ZERO] for kind in EntryKind}
        reservations = 0
        for kind, epsilon, delta in rows:
            reservations += EntryKind(kind) is EntryKind.RESERVE
            pair = totals[EntryKind(kind)]
            pair[0] = _add(pair[0], epsilon)
            pair[1] = _add(pair[1], delta)
        return SweepBalance(
            dataset=dataset,
            sweep_id=sweep_id,
            epsilon_reserved=totals[EntryKind.RESERVE][0],
            delta_reserved=totals[EntryKind.RESERVE][1],
            epsilon_charged=totals[EntryKind.CHARGE][0],
            delta_charged=totals[EntryKind.CHARGE][1],
            epsilon_released=totals[EntryKind.RELEASE][0],
            delta_released=totals[EntryKind.RELEASE][1],
            reservations=reservations,
        )

    @staticmethod
    def _record(
        session: Session,
        *,
        dataset: str,
        sweep_id: str,
        trial_id: str | None,
        kind: EntryKind,
        epsilon: Decimal,
        delta: Decimal,
        note: str,
    ) -> LedgerRecord:
        entry = LedgerEntry(
            dataset=dataset,
            sweep_id=sweep_id,
            trial_id=trial_id,
            kind=kind,
            epsilon=epsilon,
            delta=delta,
            created_at=_utcnow(),
            note=note,
        )
        session.add(entry)
        session.flush()  # assigns the id; the commit happens when the operation's block exits
        return LedgerRecord.from_row(entry)

    @staticmethod
    def _check_totals(budget: DatasetBudget) -> None:
        # Last line of defence before commit: if arithmetic elsewhere were ever wrong, refuse to
        # commit a ledger that is negative or over its cap (the transaction rolls back).
        for name in ("epsilon", "delta"):
            spent: Decimal = getattr(budget, f"{name}_spent")
            reserved: Decimal = getattr(budget, f"{name}_reserved")
            cap: Decimal | None = getattr(budget, f"{name}_cap")
            if spent < 0 or reserved < 0 or (cap is not None and _add(spent, reserved) > cap):
                raise PrivacyError(
                    f"ledger for {_dataset_label(budget.dataset)} would become inconsistent "
                    f"({name}: spent {spent}, reserved {reserved}, cap {cap}); refusing"
                )

    # -- writes ------------------------------------------------------------------------------

    def set_cap(
        self,
        dataset: str,
        *,
        epsilon_cap: float | Decimal | None = None,
        delta_cap: float | Decimal | None = None,
    ) -> BudgetSummary:
        """Set a dataset's lifetime caps (both of them: ``None`` means no cap).

        A cap may be lowered, but not below what is already spent plus reserved: outstanding
        reservations may still be charged, and the cap must hold after they are.

        Args:
            dataset: The dataset key.
            epsilon_cap: Lifetime ε cap, finite and >= 0, or ``None`` for no cap.
            delta_cap: Lifetime δ cap in [0, 1), or ``None`` for no cap.

        Returns:
            The dataset's summary after the change.

        Raises:
            ConfigError: If a value is invalid or a cap is below spent + reserved.
        """
        dataset = _key(dataset, "dataset")
        epsilon = None if epsilon_cap is None else _epsilon(epsilon_cap, "epsilon_cap")
        delta = None if delta_cap is None else _delta(delta_cap, "delta_cap")
        with self._write() as session:
            budget = self._lock_budget(session, dataset, create=True)
            assert budget is not None
            for field, cap, spent, reserved in (
                ("epsilon_cap", epsilon, budget.epsilon_spent, budget.epsilon_reserved),
                ("delta_cap", delta, budget.delta_spent, budget.delta_reserved),
            ):
                committed = _add(spent, reserved)
                if cap is not None and cap < committed:
                    raise ConfigError(
                        f"{field}={_show(cap)} for {_dataset_label(dataset)} is below what is "
                        f"already committed ({_show(spent)} spent + {_show(reserved)} "
                        "reserved); release or finish the outstanding sweeps first",
                        field=field,
                    )
            budget.epsilon_cap = epsilon
            budget.delta_cap = delta
            budget.updated_at = _utcnow()
            self._check_totals(budget)
            return _summary_of(budget)

    def tighten_caps(
        self,
        dataset: str,
        *,
        epsilon_cap: float | Decimal | None = None,
        delta_cap: float | Decimal | None = None,
    ) -> BudgetSummary:
        """Lower a dataset's caps to these values where that is stricter; never raise them.

        For caps given by someone who is not the only holder of the data (an upload of
        records that are already known): they may add a restriction, never lift one.

        Args:
            dataset: The dataset key.
            epsilon_cap: An ε cap to apply if stricter than the current one (``None``: leave).
            delta_cap: A δ cap to apply if stricter than the current one (``None``: leave).

        Returns:
            The dataset's summary after the change.

        Raises:
            ConfigError: If a value is invalid or the resulting cap is below spent + reserved.
        """
        dataset = _key(dataset, "dataset")
        epsilon = None if epsilon_cap is None else _epsilon(epsilon_cap, "epsilon_cap")
        delta = None if delta_cap is None else _delta(delta_cap, "delta_cap")
        with self._write() as session:
            budget = self._lock_budget(session, dataset, create=True)
            assert budget is not None
            caps = {
                "epsilon_cap": _stricter(budget.epsilon_cap, epsilon),
                "delta_cap": _stricter(budget.delta_cap, delta),
            }
            for field, spent, reserved in (
                ("epsilon_cap", budget.epsilon_spent, budget.epsilon_reserved),
                ("delta_cap", budget.delta_spent, budget.delta_reserved),
            ):
                cap = caps[field]
                committed = _add(spent, reserved)
                if cap is not None and cap < committed:
                    raise ConfigError(
                        f"{field}={_show(cap)} for {_dataset_label(dataset)} is below what is "
                        f"already committed ({_show(spent)} spent + {_show(reserved)} "
                        "reserved)",
                        field=field,
                    )
            budget.epsilon_cap, budget.delta_cap = caps["epsilon_cap"], caps["delta_cap"]
            budget.updated_at = _utcnow()
            self._check_totals(budget)
            return _summary_of(budget)

    def reserve(
        self,
        dataset: str,
        *,
        sweep_id: str,
        epsilon: float | Decimal,
        delta: float | Decimal,
        note: str = "",
    ) -> Reservation:
        """Reserve a sweep's cost against a dataset's caps, atomically.

        A sweep may reserve more than once (the reservations add up).

        Args:
            dataset: The dataset key.
            sweep_id: The sweep reserving.
            epsilon: ε to reserve (finite, >= 0): the sum over the sweep's arms and levels.
            delta: δ to reserve, in [0, 1).
            note: Free text kept with the entry.

        Returns:
            The recorded ``reserve`` entry.

        Raises:
            BudgetExhausted: If ``spent + reserved + epsilon`` would exceed the ε cap, or the same
                for δ; nothing is recorded.
            ConfigError: If an argument is invalid.
        """
        dataset = _key(dataset, "dataset")
        sweep_id = _key(sweep_id, "sweep_id")
        eps = _epsilon(epsilon)
        dlt = _delta(delta)
        note = _note(note)
        with self._write() as session:
            budget = self._lock_budget(session, dataset, create=True)
            assert budget is not None
            for quantity, asked, cap, spent, reserved in (
                ("epsilon", eps, budget.epsilon_cap, budget.epsilon_spent, budget.epsilon_reserved),
                ("delta", dlt, budget.delta_cap, budget.delta_spent, budget.delta_reserved),
            ):
                left = _left(cap, spent, reserved)
                # Exact, no tolerance: asked <= left  <=>  spent + reserved + asked <= cap.
                if left is not None and asked > left:
                    shown_asked, shown_left = _show_pair(asked, left)
                    raise BudgetExhausted(
                        f"{_dataset_label(dataset)}: sweep {sweep_id!r} asked for {quantity}="
                        f"{shown_asked} but only {shown_left} remains of the lifetime cap "
                        f"{_show(cap or ZERO)} ({_show(spent)} spent, {_show(reserved)} reserved "
                        "by running sweeps)",
                        dataset=dataset,
                        quantity=quantity,
                        requested=asked,
                        remaining=left,
                    )
            budget.epsilon_reserved = _add(budget.epsilon_reserved, eps)
            budget.delta_reserved = _add(budget.delta_reserved, dlt)
            budget.updated_at = _utcnow()
            self._check_totals(budget)
            return self._record(
                session,
                dataset=dataset,
                sweep_id=sweep_id,
                trial_id=None,
                kind=EntryKind.RESERVE,
                epsilon=eps,
                delta=dlt,
                note=note,
            )

    def charge(
        self,
        dataset: str,
        *,
        sweep_id: str,
        trial_id: str,
        epsilon: float | Decimal,
        delta: float | Decimal,
        note: str = "",
    ) -> LedgerRecord:
        """Move a trial's cost from its sweep's reservation to spent.

        Charge *before* the trial touches data: the charge is permanent, so a trial that then
        fails, crashes or is cancelled stays charged, as it must. Charging the same trial again
        (a retry touches the data again) adds a second charge.

        Args:
            dataset: The dataset key.
            sweep_id: The sweep the trial belongs to; its reservation pays for the charge.
            trial_id: The trial being charged.
            epsilon: The trial's ε (finite, >= 0).
            delta: The trial's δ, in [0, 1).
            note: Free text kept with the entry.

        Returns:
            The recorded ``charge`` entry.

        Raises:
            ReservationExceeded: If the sweep's outstanding reservation (reserved, minus charged,
                minus released) is smaller than the charge; nothing is recorded.
            ConfigError: If an argument is invalid.
        """
        dataset = _key(dataset, "dataset")
        sweep_id = _key(sweep_id, "sweep_id")
        trial_id = _key(trial_id, "trial_id")
        eps = _epsilon(epsilon)
        dlt = _delta(delta)
        note = _note(note)
        with self._write() as session:
            budget = self._lock_budget(session, dataset, create=False)
            balance = (
                self._balance(session, dataset, sweep_id)
                if budget is not None
                else SweepBalance(dataset, sweep_id, ZERO, ZERO, ZERO, ZERO, ZERO, ZERO)
            )
            if budget is None or balance.reservations == 0:
                # Even a zero charge is refused: a sweep that never reserved was never
                # accepted against this dataset, so its trials must not run.
                raise ReservationExceeded(
                    f"{_dataset_label(dataset)}: sweep {sweep_id!r} has no reservation, so trial "
                    f"{trial_id!r} cannot be charged and must not run",
                    dataset=dataset,
                    sweep_id=sweep_id,
                    quantity="epsilon",
                    requested=eps,
                    outstanding=ZERO,
                )
            for quantity, asked, outstanding in (
                ("epsilon", eps, balance.epsilon_outstanding),
                ("delta", dlt, balance.delta_outstanding),
            ):
                if asked > outstanding:
                    shown_asked, shown_left = _show_pair(asked, outstanding)
                    raise ReservationExceeded(
                        f"{_dataset_label(dataset)}: trial {trial_id!r} of sweep {sweep_id!r} "
                        f"would be charged {quantity}={shown_asked} but the sweep holds only "
                        f"{shown_left} in reservation (reserved "
                        f"{_show(_reserved(balance, quantity))}, already charged "
                        f"{_show(_charged(balance, quantity))}, released "
                        f"{_show(_released(balance, quantity))}); the trial must not run",
                        dataset=dataset,
                        sweep_id=sweep_id,
                        quantity=quantity,
                        requested=asked,
                        outstanding=outstanding,
                    )
            budget.epsilon_reserved = _sub(budget.epsilon_reserved, eps)
            budget.delta_reserved = _sub(budget.delta_reserved, dlt)
            budget.epsilon_spent = _add(budget.epsilon_spent, eps)
            budget.delta_spent = _add(budget.delta_spent, dlt)
            budget.updated_at = _utcnow()
            self._check_totals(budget)
            return self._record(
                session,
                dataset=dataset,
                sweep_id=sweep_id,
                trial_id=trial_id,
                kind=EntryKind.CHARGE,
                epsilon=eps,
                delta=dlt,
                note=note,
            )

    def release(self, dataset: str, *, sweep_id: str, note: str = "") -> LedgerRecord | None:
        """Give back what a sweep reserved but never charged (call it when the sweep ends).

        Charges stay: only the outstanding part returns to the dataset. Releasing again
        releases nothing more, and so does releasing a sweep that holds nothing.

        Args:
            dataset: The dataset key.
            sweep_id: The sweep that ended.
            note: Free text kept with the entry.

        Returns:
            The recorded ``release`` entry (its amounts are what was given back), or ``None``
            when the dataset has no ledger row (nothing was ever reserved on it).

        Raises:
            ConfigError: If an argument is invalid.
        """
        dataset = _key(dataset, "dataset")
        sweep_id = _key(sweep_id, "sweep_id")
        note = _note(note)
        with self._write() as session:
            budget = self._lock_budget(session, dataset, create=False)
            if budget is None:
                return None
            balance = self._balance(session, dataset, sweep_id)
            eps, dlt = balance.epsilon_outstanding, balance.delta_outstanding
            budget.epsilon_reserved = _sub(budget.epsilon_reserved, eps)
            budget.delta_reserved = _sub(budget.delta_reserved, dlt)
            budget.updated_at = _utcnow()
            self._check_totals(budget)
            # Recorded even when zero: the entry also marks, in the audit trail, that the sweep
            # ended.
            return self._record(
                session,
                dataset=dataset,
                sweep_id=sweep_id,
                trial_id=None,
                kind=EntryKind.RELEASE,
                epsilon=eps,
                delta=dlt,
                note=note,
            )

    def carry_over(
        self,
        source: str,
        target: str,
        *,
        note: str = "",
        within: Callable[[Session], None] | None = None,
    ) -> CarriedOver | None:
        """Move everything recorded under ``source`` to ``target``, atomically, and drop the
        ``source`` row: spent and reserved add up, every entry moves (so each sweep's balance
        moves with it), and the stricter of the two caps applies (per quantity; no cap counts
        as the loosest). Nothing spent is lost.

        For keys that turned out to name the same records (a dataset's old name key and its
        content identity). If the stricter cap is below what the two have committed together,
        the cap becomes that total: the data is then exhausted, never over its cap.

        Args:
            source: The key to empty and remove.
            target: The key that receives it (created if missing).
            note: Appended to every moved entry's note, for the audit trail.
            within: Called with the session inside the same transaction (to re-point other
                rows at ``target`` in the same commit).

        Returns:
            What moved, or ``None`` when ``source`` has no row (``within`` still ran).

        Raises:
            ConfigError: If a key is invalid, or both are the same.
        """
        source = _key(source, "source")
        target = _key(target, "target")
        note = _note(note)
        if source == target:
            raise ConfigError("carry_over needs two different keys", field="target")
        with self._write() as session:
            # Lock both rows in key order, so two carry-overs sharing a key never deadlock.
            rows = {
                key: self._lock_budget(session, key, create=False)
                for key in sorted((source, target))
            }
            old = rows[source]
            if old is None:
                if within is not None:
                    within(session)
                return None
            new = rows[target] or self._lock_budget(session, target, create=True)
            assert new is not None
            clamped = False
            for name in ("epsilon", "delta"):
                spent = _add(getattr(new, f"{name}_spent"), getattr(old, f"{name}_spent"))
                reserved = _add(getattr(new, f"{name}_reserved"), getattr(old, f"{name}_reserved"))
                cap = _stricter(getattr(new, f"{name}_cap"), getattr(old, f"{name}_cap"))
                committed = _add(spent, reserved)
                if cap is not None and committed > cap:
                    cap, clamped = committed, True
                setattr(new, f"{name}_spent", spent)
                setattr(new, f"{name}_reserved", reserved)
                setattr(new, f"{name}_cap", cap)
            new.updated_at = _utcnow()
            session.flush()  # the target row exists before entries point at it (foreign key)
            moved = session.execute(
                update(LedgerEntry)
                .where(LedgerEntry.dataset == source)
                .values(dataset=target, note=LedgerEntry.note + note)
                .execution_options(synchronize_session=False)
            ).rowcount  # type: ignore[attr-defined]
            moved_totals = (
                old.epsilon_spent,
                old.delta_spent,
                old.epsilon_reserved,
                old.delta_reserved,
            )
            session.delete(old)
            self._check_totals(new)
            if within is not None:
                within(session)
            session.flush()
            return CarriedOver(
                source,
                target,
                int(moved or 0),
                *moved_totals,
                summary=_summary_of(new),
                cap_clamped=clamped,
            )

    def inherit_caps(self, source: str, target: str) -> BudgetSummary | None:
        """Give ``target`` the caps of ``source`` when ``target`` has no ledger row yet.

        For a name that now holds other records (an edited file): the new records have a
        ledger of their own (nothing spent on the old ones moves), but the cap the data owner
        set for the name must not vanish with the edit.

        Returns:
            ``target``'s summary if caps were given, else ``None`` (``target`` already has a
            row, with its own caps, or ``source`` has no cap).
        """
        source = _key(source, "source")
        target = _key(target, "target")
        if source == target:
            return None
        with self._write() as session:
            rows = {
                key: self._lock_budget(session, key, create=False)
                for key in sorted((source, target))
            }
            old, new = rows[source], rows[target]
            if new is not None or old is None:
                return None
            if old.epsilon_cap is None and old.delta_cap is None:
                return None
            new = self._lock_budget(session, target, create=True)
            assert new is not None
            if any((new.epsilon_spent, new.delta_spent, new.epsilon_reserved, new.delta_reserved)):
                return None  # another writer created and used the row first: it has its own
            new.epsilon_cap, new.delta_cap = old.epsilon_cap, old.delta_cap
            new.updated_at = _utcnow()
            self._check_totals(new)
            return _summary_of(new)

    # -- reads -------------------------------------------------------------------------------

    def summary(self, dataset: str) -> BudgetSummary:
        """A dataset's caps, spent, reserved and remaining budget.

        Args:
            dataset: The dataset key. A dataset the ledger has never seen has no cap and
                nothing spent.

        Returns:
            The exact totals.
        """
        dataset = _key(dataset, "dataset")
        with self._read() as session:
            budget = session.scalars(
                select(DatasetBudget).where(DatasetBudget.dataset == dataset)
            ).one_or_none()
            if budget is None:
                return BudgetSummary(dataset, None, None, ZERO, ZERO, ZERO, ZERO)
            return _summary_of(budget)

    def remaining(self, dataset: str) -> Remaining:
        """Budget a new reservation could still take (``None`` where a quantity is uncapped).

        Args:
            dataset: The dataset key.

        Returns:
            The remaining ε and δ.
        """
        return self.summary(dataset).remaining

    def sweep_balance(self, dataset: str, *, sweep_id: str) -> SweepBalance:
        """One sweep's reserved, charged, released and outstanding amounts on a dataset.

        Args:
            dataset: The dataset key.
            sweep_id: The sweep.

        Returns:
            The sweep's exact totals (zero if it never reserved).
        """
        dataset = _key(dataset, "dataset")
        sweep_id = _key(sweep_id, "sweep_id")
        with self._read() as session:
            return self._balance(session, dataset, sweep_id)

    def entries(self, dataset: str, sweep_id: str | None = None) -> list[LedgerRecord]:
        """The recorded entries of a dataset, oldest first.

        Args:
            dataset: The dataset key.
            sweep_id: If given, only that sweep's entries.

        Returns:
            The entries, in the order they were committed.
        """
        dataset = _key(dataset, "dataset")
        stmt = select(LedgerEntry).where(LedgerEntry.dataset == dataset)
        if sweep_id is not None:
            stmt = stmt.where(LedgerEntry.sweep_id == _key(sweep_id, "sweep_id"))
        with self._read() as session:
            return [
                LedgerRecord.from_row(row) for row in session.scalars(stmt.order_by(LedgerEntry.id))
            ]

    def datasets(self) -> list[str]:
        """Keys of every dataset the ledger has a row for, sorted."""
        with self._read() as session:
            return list(
                session.scalars(select(DatasetBudget.dataset).order_by(DatasetBudget.dataset))
            )


def _summary_of(budget: DatasetBudget) -> BudgetSummary:
    return BudgetSummary(
        dataset=budget.dataset,
        epsilon_cap=budget.epsilon_cap,
        delta_cap=budget.delta_cap,
        epsilon_spent=budget.epsilon_spent,
        delta_spent=budget.delta_spent,
        epsilon_reserved=budget.epsilon_reserved,
        delta_reserved=budget.delta_reserved,
    )


def _reserved(balance: SweepBalance, quantity: str) -> Decimal:
    return balance.epsilon_reserved if quantity == "epsilon" else balance.delta_reserved


def _charged(balance: SweepBalance, quantity: str) -> Decimal:
    return balance.epsilon_charged if quantity == "epsilon" else balance.delta_charged


def _released(balance: SweepBalance, quantity: str) -> Decimal:
    return balance.epsilon_released if quantity == "epsilon" else balance.delta_released


def summed_entries(records: Iterable[LedgerRecord]) -> dict[str, Decimal]:
    """Re-derive a dataset's totals from its entries (an audit check on the running totals).

    Args:
        records: Entries of one dataset, e.g. from :meth:`BudgetLedger.entries`.

    Returns:
        ``epsilon_spent``, ``delta_spent``, ``epsilon_reserved`` and ``delta_reserved``, exact.
    """
    totals = {
        "epsilon_spent": ZERO,
        "delta_spent": ZERO,
        "epsilon_reserved": ZERO,
        "delta_reserved": ZERO,
    }
    for record in records:
        for name, amount in (("epsilon", record.epsilon), ("delta", record.delta)):
            if record.kind is EntryKind.RESERVE:
                totals[f"{name}_reserved"] = _add(totals[f"{name}_reserved"], amount)
            elif record.kind is EntryKind.CHARGE:
                totals[f"{name}_reserved"] = _sub(totals[f"{name}_reserved"], amount)
                totals[f"{name}_spent"] = _add(totals[f"{name}_spent"], amount)
            else:
                totals[f"{name}_reserved"] = _sub(totals[f"{name}_reserved"], amount)
    return totals
