"""Typed values of the command line's flags, and the strategy hyperparameter flags."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

from workers.strategies import descriptor_names, get_descriptor


def positive_float(name: str) -> Callable[[str], float]:
    """An argparse type: a finite number > 0 (``name`` is for the message)."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number; got {text!r}") from None
        if not (v > 0 and math.isfinite(v)):
            raise argparse.ArgumentTypeError(f"{name} must be a finite number > 0; got {text}")
        return v

    return parse


def delta(text: str) -> float:
    """An argparse type: a δ strictly between 0 and 1."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"delta must be a number; got {text!r}") from None
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(
            f"delta must be strictly between 0 and 1 (typically below 1/n, e.g. 1e-5); got {text}"
        )
    return v


def positive_int(name: str) -> Callable[[str], int]:
    """An argparse type: an integer >= 1 (``name`` is for the message)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer; got {text!r}") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1; got {text}")
        return v

    return parse


def key_value(text: str) -> tuple[str, Any]:
    """An argparse type: ``KEY=VALUE``, the value read as JSON when it parses."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE; got {text!r}")
    k, v = text.split("=", 1)
    try:
        value: Any = json.loads(v)
    except json.JSONDecodeError:
        value = v
    return k.strip(), value


# Strategy hyperparameter flags: each maps to the hyperparameter of the same name, and is
# accepted only by strategies that declare it.
def strategy_flags() -> list[tuple[str, str, Any, str]]:
    """``(flag, dest, type, help)`` for every hyperparameter a registered strategy declares.

    Derived from the strategies' torch-free descriptors (plug-ins included), not restated
    here: ``clip_init`` becomes ``--clip-init``, its help says which strategies take it and
    their defaults. Values are checked by the chosen strategy's descriptor (range, kind,
    choices), the same check a sweep's grid gets at submission.
    """
    takers: dict[str, list[tuple[str, Any]]] = {}
    declared: dict[str, Any] = {}
    helps: dict[str, list[str]] = {}
    for strategy in descriptor_names():
        for name, hp in get_descriptor(strategy).hyperparameters.items():
            takers.setdefault(name, []).append((strategy, hp.default))
            declared.setdefault(name, hp)
            if hp.help not in helps.setdefault(name, []):
                helps[name].append(hp.help)
    flags = []
    for name in sorted(takers):
        hp = declared[name]
        kind: Any = {"float": float, "int": int}.get(hp.kind, str)
        defaults = {d for _, d in takers[name]}
        if len(defaults) == 1:
            default = next(iter(defaults))
            where = ", ".join(s for s, _ in takers[name])
            if default is not None:
                where += f"; default {default}"
        else:
            where = "; ".join(f"{s}: default {d}" for s, d in takers[name])
        choices = f" ({' or '.join(hp.choices)})" if hp.kind == "choice" else ""
        text = f"{' / '.join(helps[name])}{choices} [{where}]".replace("%", "%%")  # (argparse)
        flags.append((f"--{name.replace('_', '-')}", name, kind, text))
    return flags
