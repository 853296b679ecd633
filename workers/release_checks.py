"""Fail-closed checks of a step's releases: every example's contribution within the
sensitivity the noise assumes (used by :mod:`workers.engine` and :mod:`workers.chunked_step`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dpsweep.errors import PrivacyError

# Relative slack for float32 rounding in w_i * ||g_i|| <= S (a clipped norm lands on S exactly).
# The check lets contributions reach S (1 + this), so the noise is scaled to that bound.
_SENSITIVITY_RTOL = 1e-4
_ENFORCED = 1.0 + _SENSITIVITY_RTOL


def _check_sensitivity(name: str, sq_norms: Tensor, weights: Tensor, sensitivity: Tensor) -> None:
    """Fail closed: every example's weighted gradient must have norm <= the claimed sensitivity.

    The noise is calibrated to the sensitivity a strategy *claims*; this check makes a strategy
    bug raise instead of silently under-noising a release. Padded slots have zero gradients.
    The message names the release and the trial only: a norm computed from a private example
    must not leave without noise, not even in an error.
    """
    if weights.shape[-1] == 1:
        contrib = weights[..., 0].pow(2) * sq_norms.sum(dim=-1)
    else:
        contrib = (weights.pow(2) * sq_norms).sum(dim=-1)
    bound = sensitivity.pow(2).unsqueeze(1) * _ENFORCED**2
    bad = ~(contrib <= bound)  # also catches NaN weights
    if bad.any():
        # Non-finite gradients or weights (a diverged trial: its release is non-finite, so its
        # parameters are too from here on) make no claim false; only a finite excess does.
        finite = torch.isfinite(sq_norms).all(dim=-1) & torch.isfinite(contrib)
        if (bad & finite).any():
            k = int((bad & finite).any(dim=1).nonzero()[0])
            raise PrivacyError(
                f"release {name!r} of trial {k}: a per-example contribution exceeds the "
                "strategy's claimed sensitivity (a strategy bug); refusing to release"
            )


def _check_scalar(name: str, values: Tensor, sensitivity: Tensor) -> None:
    """Fail closed: every example's contribution to a scalar release is within its sensitivity."""
    bound = sensitivity.unsqueeze(1) * _ENFORCED
    if not (values.abs() <= bound).all():
        raise PrivacyError(
            f"scalar release {name!r}: a per-example contribution exceeds the strategy's "
            "sensitivity; refusing to release"
        )
