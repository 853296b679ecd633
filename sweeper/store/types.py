"""Column types of the store: exact decimals and UTC timestamps.

Frozen migrations import these (``sweeper.store.types.ExactDecimal``), so this module's path
and the types' behaviour stay stable.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import DateTime, Dialect, Numeric, String
from sqlalchemy.types import TypeDecorator, TypeEngine

__all__ = ["ExactDecimal", "UTCDateTime"]


class ExactDecimal(TypeDecorator[Decimal]):
    """A ``Decimal`` stored without any rounding.

    PostgreSQL's unconstrained ``NUMERIC`` is exact, so it is used there. SQLite has no exact
    decimal type: a ``NUMERIC`` column converts values to 8-byte floats, which is precisely the
    drift the budget ledger must not have. Elsewhere the value is therefore stored as its
    positional decimal text. The ledger never compares or sums amounts in SQL (it does so in
    Python while holding the write lock), so text storage costs nothing.
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
