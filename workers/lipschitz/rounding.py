"""Floating-point rounding bounds (Higham) used by every certified quantity of this package."""

from __future__ import annotations

import torch

_U64 = 2.0**-53  # unit roundoff of float64


def _unit_roundoff(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2.0


def _gamma(n: int, u: float) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: relative error bound of n rounded operations."""
    nu = n * u
    if nu >= 0.5:
        raise ValueError(f"{n} operations are too many for a rounding-error bound at u={u}")
    return nu / (1.0 - nu)
