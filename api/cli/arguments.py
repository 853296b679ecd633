"""Typed values of the command line's flags, and the strategy hyperparameter flags."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any


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
STRATEGY_FLAGS: list[tuple[str, str, Any, str]] = [
    (
        "--clip",
        "clip",
        positive_float("clip"),
        "clipping threshold / scale C (fixed, automatic, global, bam; default 1.0)",
    ),
    ("--clip-style", "clip_style", str, "flat (default) or layerwise (fixed, automatic, bam)"),
    (
        "--stability",
        "stability",
        positive_float("stability"),
        "gamma in C/(n + gamma) (automatic; default 0.01)",
    ),
    (
        "--global-threshold",
        "global_threshold",
        positive_float("global threshold"),
        "threshold Z (global; default 1.0)",
    ),
    (
        "--target-quantile",
        "target_quantile",
        positive_float("target quantile"),
        "quantile gamma tracked by C_t (quantile; default 0.5)",
    ),
    (
        "--clip-init",
        "clip_init",
        positive_float("clip init"),
        "initial threshold C_0 (quantile, online; default 0.1)",
    ),
    (
        "--clip-lr",
        "clip_lr",
        positive_float("clip lr"),
        "step of the C_t update (quantile: eta_C = 0.2; online: rho_c = 2.5e-3)",
    ),
    (
        "--count-noise",
        "count_noise",
        positive_float("count noise"),
        "std sigma_b of the quantile count's noise (quantile; default b/20)",
    ),
    (
        "--lr-lr",
        "lr_lr",
        positive_float("lr lr"),
        "step rho_r of the learning-rate update (online; default 2.5e-3)",
    ),
    (
        "--direction-noise-ratio",
        "direction_noise_ratio",
        positive_float("direction noise ratio"),
        "nu_q / nu (online; default 7.124)",
    ),
    (
        "--bam-lambda",
        "bam_lambda",
        positive_float("bam lambda"),
        "per-sample ascent step lambda (bam; default 0.1)",
    ),
]
