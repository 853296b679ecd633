"""Exact amounts: validation of ε and δ, and arithmetic that never rounds.

Amounts are :class:`~decimal.Decimal` values that are *exactly* the numbers the caller passed
(a float converts to its exact binary value), added and compared without any rounding and
without a tolerance, so sums cannot drift above a cap. Any operation that would round traps,
and the ledger operation fails instead of silently drifting.
"""

from __future__ import annotations

import math
import numbers
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
from typing import Any

from dpsweep.errors import ConfigError, PrivacyError

__all__ = [
    "ZERO",
    "add_exact",
    "cap_left",
    "delta_amount",
    "epsilon_amount",
    "exact_amount",
    "show_amount",
    "show_amounts",
    "stricter_cap",
    "sub_exact",
]

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


def exact_amount(value: object, field: str) -> Decimal:
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


def epsilon_amount(value: object, field: str = "epsilon") -> Decimal:
    """An exact ε (finite, >= 0), or ConfigError naming ``field``."""
    return exact_amount(value, field)


def delta_amount(value: object, field: str = "delta") -> Decimal:
    """An exact δ in [0, 1), or ConfigError naming ``field``."""
    amount = exact_amount(value, field)
    if amount >= 1:
        raise ConfigError(f"{field} must be in [0, 1), got {value!r}", field=field)
    return amount


def add_exact(a: Decimal, b: Decimal) -> Decimal:
    """``a + b``, exactly (PrivacyError if it would round)."""
    return _checked(_EXACT.add, a, b)


def sub_exact(a: Decimal, b: Decimal) -> Decimal:
    """``a - b``, exactly (PrivacyError if it would round)."""
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


def stricter_cap(a: Decimal | None, b: Decimal | None) -> Decimal | None:
    """The smaller cap (``None``, no cap, is the loosest)."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def cap_left(cap: Decimal | None, spent: Decimal, reserved: Decimal) -> Decimal | None:
    """What a cap still allows after ``spent + reserved`` (``None`` where uncapped)."""
    if cap is None:
        return None
    return sub_exact(cap, add_exact(spent, reserved))


#: The longest float repr shown as is; longer ones (a sum such as 21.813037671057316) are
#: rounded to :data:`SHOWN_DIGITS` significant digits and marked "≈".
SHORT_REPR = 10
SHOWN_DIGITS = 6


def show_amount(value: Decimal) -> str:
    """A short human form of an exact amount: the float repr that reads back to it where that is
    short, else "≈" and 6 significant digits (a message is read, not parsed; the exact amount is
    in the ledger)."""
    as_float = float(value)
    short = repr(as_float)
    if Decimal(as_float) == value and len(short.lstrip("-")) <= SHORT_REPR:
        return short
    return f"≈{as_float:.{SHOWN_DIGITS}g}"


def show_amounts(asked: Decimal, left: Decimal) -> tuple[str, str]:
    """Short forms of an amount asked for and the amount left, exact where they would read
    the same."""
    # Two different exact amounts can share a short form (e.g. 0.3 vs 0.3 + 1 ulp); then the
    # message would read "asked 0.3, 0.3 remains", so show the exact values instead.
    short_asked, short_left = show_amount(asked), show_amount(left)
    if short_asked.lstrip("≈") == short_left.lstrip("≈") and asked != left:
        return str(asked), str(left)
    return short_asked, short_left
