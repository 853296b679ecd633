"""Declared options: what a plug-in's descriptor says each of its settings may be.

Strategies (hyperparameters), models and datasets (options) declare their settings with one
:class:`HParam` each (kind, default, range or choices), and every value is checked by the same
:func:`check_value`, at submission and again where the setting is used: the same type,
finiteness and range rules and the same messages, whatever declared it. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dpsweep.errors import ConfigError


@dataclass(frozen=True)
class HParam:
    """A declared strategy hyperparameter.

    Args:
        default: value when a trial does not set it (``None`` = required unless ``optional``).
        kind: ``float``, ``int`` or ``choice``.
        choices: allowed values for ``choice``.
        positive: shorthand for ``low=0`` exclusive (``> 0``), applied when ``low`` is not
            given. After construction it says whether the range admits positive values only.
        shared: must be equal for every trial of a pack (it shapes the computation).
        optional: ``None`` is allowed and means "derive it" (e.g. from b).
        low, high: bounds of a numeric value (``None``: unbounded on that side).
        low_inclusive, high_inclusive: whether the bound itself is allowed.
    """

    default: Any = None
    kind: str = "float"
    choices: tuple[str, ...] = ()
    positive: bool = True
    shared: bool = False
    help: str = ""
    optional: bool = False
    low: float | None = None
    high: float | None = None
    low_inclusive: bool = True
    high_inclusive: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("float", "int", "choice"):
            raise ValueError(f"HParam kind must be float, int or choice; got {self.kind!r}")
        if self.kind == "choice":
            if not self.choices:
                raise ValueError("a choice HParam needs choices")
            object.__setattr__(self, "positive", False)
            return
        if self.low is None and self.positive:
            object.__setattr__(self, "low", 0.0)
            object.__setattr__(self, "low_inclusive", False)
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"HParam range is empty: low {self.low} > high {self.high}")
        low = self.low
        object.__setattr__(
            self, "positive", low is not None and (low > 0 or (low == 0 and not self.low_inclusive))
        )

    @property
    def numeric(self) -> bool:
        return self.kind in ("float", "int")

    def range_text(self) -> str:
        """The allowed range in words: ``> 0``, ``>= 0``, ``in (0, 1)``, ``any number``."""
        lo, hi = self.low, self.high
        if lo is not None and hi is not None:
            left = "[" if self.low_inclusive else "("
            right = "]" if self.high_inclusive else ")"
            return f"in {left}{lo:g}, {hi:g}{right}"
        if lo is not None:
            return f"{'>=' if self.low_inclusive else '>'} {lo:g}"
        if hi is not None:
            return f"{'<=' if self.high_inclusive else '<'} {hi:g}"
        return "any finite number"

    def in_range(self, value: float) -> bool:
        lo, hi = self.low, self.high
        if lo is not None and (value < lo or (value == lo and not self.low_inclusive)):
            return False
        return not (hi is not None and (value > hi or (value == hi and not self.high_inclusive)))


def check_value(option: HParam, value: Any, *, name: str, owner: str, field: str) -> Any:
    """One value of a declared setting: a member of its choices, or a finite number of its
    kind (``float``, or a whole ``int``) inside its range.

    Args:
        option: The declaration.
        value: The value given (a spec's JSON or YAML value: no bools for numbers).
        name: The setting's name, as the user wrote it.
        owner: Who declares it, for the message (e.g. ``"strategy 'fixed'"``).
        field: The spec field to name in the error (e.g. ``"params.clip"``).

    Returns:
        The value (numbers as ``float`` or ``int``).

    Raises:
        ConfigError: naming ``field`` and saying what the value must be.
    """
    if option.kind == "choice":
        if isinstance(value, bool) or value not in option.choices:
            raise ConfigError(
                f"{name} for {owner} must be one of {list(option.choices)}; got {value!r}",
                field=field,
            )
        return value
    try:
        if isinstance(value, bool):
            raise TypeError
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(
            f"{name} for {owner} must be a number; got {value!r}", field=field
        ) from None
    if not math.isfinite(x):
        raise ConfigError(f"{name} must be finite; got {value!r} ({owner})", field=field)
    number: float | int = x
    if option.kind == "int":
        if not x.is_integer():
            raise ConfigError(
                f"{name} for {owner} must be a whole number; got {value!r}", field=field
            )
        number = int(x)
    if not option.in_range(number):
        raise ConfigError(
            f"{name} must be {option.range_text()}; got {value!r} ({owner})", field=field
        )
    return number


def check_settings(
    declared: Mapping[str, HParam],
    given: Mapping[str, Any],
    *,
    owner: str,
    field: str,
    what: str = "option",
    check: Callable[[str, Any, Any], Any] | None = None,
) -> dict[str, Any]:
    """Every declared setting, with defaults filled and each value checked.

    Args:
        declared: The declarations, by name.
        given: The values given, by name (unknown names are refused).
        owner: Who declares them, for messages (e.g. ``"model 'mlp'"``).
        field: The spec field of the settings (``params``, ``model.options``...); an error
            names ``<field>.<name>``.
        what: What one setting is called in messages (``hyperparameter``, ``option``).
        check: ``check(name, declaration, value) -> value`` for one value; default
            :func:`check_value`.

    Returns:
        Every declared setting (an optional one left out is ``None``).

    Raises:
        ConfigError: an unknown name, a required setting left out, or a bad value.
    """
    unknown = sorted(str(k) for k in set(given) - set(declared))
    if unknown:
        raise ConfigError(
            f"unknown {what}(s) {unknown} for {owner}; allowed: {sorted(declared) or 'none'}",
            field=f"{field}.{unknown[0]}",
        )
    out: dict[str, Any] = {}
    for name, option in declared.items():
        v = given.get(name, option.default)
        if v is None:
            if option.optional:
                out[name] = None
                continue
            raise ConfigError(f"{owner} needs {what} {name}", field=f"{field}.{name}")
        out[name] = (
            check(name, option, v)
            if check is not None
            else check_value(option, v, name=name, owner=owner, field=f"{field}.{name}")
        )
    return out
