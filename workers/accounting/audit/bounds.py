"""What every part of the independent verifier shares: epsilon bounds, and argument checks."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpsweep.errors import ConfigError, PrivacyError


@dataclass(frozen=True)
class EpsilonBounds:
    """An accountant's epsilon with its stated error bars.

    For the PRV accountant ``lower`` and ``upper`` are rigorous bounds on the true epsilon of
    the mechanism. For the independent RDP computations the estimate is itself an upper bound
    on the true epsilon, and ``lower``/``upper`` are that bound minus/plus the tolerance
    within which another RDP implementation of the same theorem must agree with it (they
    differ only in the Rényi orders they optimise over); see :data:`RDP_AGREEMENT`.
    """

    lower: float
    estimate: float
    upper: float
    accountant: str

    def scaled(self, factor: float) -> EpsilonBounds:
        """These bounds multiplied by ``factor`` (``basic``: K trials each of these)."""
        return EpsilonBounds(
            self.lower * factor, self.estimate * factor, self.upper * factor, self.accountant
        )


def _check_mechanism(noise_multiplier: float, sample_rate: float, steps: int) -> None:
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise PrivacyError(
            f"noise multiplier {noise_multiplier} gives no finite privacy guarantee; it must be > 0"
        )
    if not 0.0 < sample_rate <= 1.0:
        raise ConfigError(f"sample rate must be in (0, 1]; got {sample_rate}", field="sample_rate")
    if steps < 1:
        raise ConfigError(f"steps must be >= 1; got {steps}", field="steps")


def _check_delta(target_delta: float) -> None:
    if not 0.0 < target_delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1); got {target_delta}", field="privacy.delta")


def _eval_pair(eval_noise_multiplier: float | None, eval_releases: int) -> tuple[float | None, int]:
    """(sigma_e, E) normalised: (None, 0) when there is nothing to charge."""
    if not eval_releases:
        return None, 0
    if eval_releases < 0 or eval_noise_multiplier is None:
        raise PrivacyError(
            f"{eval_releases} evaluation release(s) without a valid noise multiplier "
            f"({eval_noise_multiplier}) cannot be accounted"
        )
    _check_mechanism(float(eval_noise_multiplier), 1.0, int(eval_releases))
    return float(eval_noise_multiplier), int(eval_releases)
