"""Epsilon from the noise actually used, and calibration: the checked entry points.

Thin, strict wrappers over the accountants of :mod:`workers.accounting.registry`: Opacus's RDP
(``opacus-rdp``, the default; legacy name ``rdp``) and PRV (``opacus-prv``; legacy ``prv``),
dp_accounting's PLD (``pld``, torch-free, what the planner calibrates with) and RDP
(``dp-rdp``), and any accountant a plug-in registers. Libraries are imported lazily, so callers
without torch (the sweeper) can import this module.

DP evaluation: see :mod:`workers.accounting.epsilon`; every function here that takes
``eval_noise_multiplier`` and ``eval_releases`` charges those releases with the steps.
"""

from __future__ import annotations

import functools
import math

from dpsweep.errors import ConfigError, PrivacyError
from workers.accounting.epsilon import _eval_sigma
from workers.accounting.registry import (
    BUILTIN_ACCOUNTANTS,
    DEFAULT_MAX_NOISE_MULTIPLIER,
    WORKER_ALIASES,
    worker_accountant,
)

# Every built-in name compute_epsilon accepts: the registry's, then the legacy worker aliases
# (taken at import, so without plug-ins: registry.accountant_names() lists theirs too).
ACCOUNTANTS: tuple[str, ...] = (*BUILTIN_ACCOUNTANTS, *WORKER_ALIASES)
# compute_epsilon's default: Opacus RDP (its historical "rdp").
DEFAULT_ACCOUNTANT = "opacus-rdp"


def _check(
    *, sample_rate: float, target_delta: float, accountant: str, steps: int | None = None
) -> None:
    worker_accountant(accountant)  # raises ConfigError (field privacy.accountant) if unknown
    if not 0.0 < sample_rate <= 1.0:
        raise ConfigError(f"sample rate must be in (0, 1]; got {sample_rate}", field="sample_rate")
    if not 0.0 < target_delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1); got {target_delta}", field="privacy.delta")
    if steps is not None and steps < 0:
        raise ConfigError(f"steps must be >= 0; got {steps}", field="steps")


def compute_epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    target_delta: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    eval_noise_multiplier: float | None = None,
    eval_releases: int = 0,
) -> float:
    """Epsilon of `steps` Poisson-subsampled Gaussian steps of multiplier `noise_multiplier`.

    With DP evaluation, a single trial's epsilon: ``eval_releases`` (E) further Gaussian
    releases of multiplier ``eval_noise_multiplier`` (sensitivity 1, no subsampling) are
    composed with the steps (Opacus history entry ``(sigma_e, 1.0, E)``; for ``pld`` one
    Gaussian of multiplier ``sigma_e / sqrt(E)``, the same mechanism).

    ``accountant``: a registry name (:mod:`workers.accounting.registry`) or a legacy worker alias
    (``rdp`` = ``opacus-rdp``, ``prv`` = ``opacus-prv``).

    Raises:
        ConfigError: unknown accountant (field ``privacy.accountant``).
        PrivacyError: the mechanism gives no finite guarantee (e.g. ``noise_multiplier`` <= 0).
    """
    _check(sample_rate=sample_rate, target_delta=target_delta, accountant=accountant, steps=steps)
    extra = _eval_sigma(eval_noise_multiplier, eval_releases)
    if steps == 0 and extra is None:
        return 0.0
    if steps > 0 and not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise PrivacyError(
            f"noise multiplier {noise_multiplier} gives no finite privacy guarantee; it must be > 0"
        )
    # _eval_sigma has checked the multiplier wherever there are releases to charge.
    sigma_e = None if extra is None or eval_noise_multiplier is None else eval_noise_multiplier
    eps = _epsilon(
        float(noise_multiplier),
        float(sample_rate),
        int(steps),
        float(target_delta),
        worker_accountant(accountant).name,
        None if sigma_e is None else float(sigma_e),
        0 if sigma_e is None else int(eval_releases),
    )
    if not math.isfinite(eps) or eps < 0:
        raise PrivacyError(f"the {accountant} accountant returned an invalid epsilon ({eps})")
    return eps


@functools.lru_cache(maxsize=4096)
def _epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    target_delta: float,
    accountant: str,
    eval_noise_multiplier: float | None = None,
    eval_releases: int = 0,
) -> float:
    # Opacus's RDP takes ~0.1 s per call (pure Python over fractional orders); the trials of a
    # grid share (sigma, q, T, delta), so the exact same question is answered once.
    # ``accountant`` is a canonical registry name here.
    return worker_accountant(accountant).epsilon(
        noise_multiplier=noise_multiplier,
        sample_rate=sample_rate,
        steps=steps,
        target_delta=target_delta,
        eval_noise_multiplier=eval_noise_multiplier,
        eval_releases=eval_releases,
    )


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = DEFAULT_ACCOUNTANT,
    epsilon_tolerance: float = 0.01,
) -> float:
    """The noise multiplier whose epsilon is at most ``target_epsilon`` (within tolerance below).

    Every accountant calibrates through its descriptor's ``calibrate`` (the one shared
    calibrator, :mod:`workers.accounting.calibrator`, unless a plug-in brings its own), which
    re-checks the result with the accountant's epsilon; it is checked once more with
    :func:`compute_epsilon`: a multiplier that overshoots the target is never returned (fail
    closed).

    Raises:
        ConfigError: invalid arguments or an unknown accountant.
        PrivacyError: no multiplier up to ~10^4 reaches ``target_epsilon``, or the result
            overshoots.
    """
    _check(sample_rate=sample_rate, target_delta=target_delta, accountant=accountant, steps=steps)
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise ConfigError(f"epsilon must be > 0; got {target_epsilon}", field="privacy.epsilon")
    if steps < 1:
        raise ConfigError("calibration needs at least one step", field="steps")
    desc = worker_accountant(accountant)
    sigma = desc.calibrate(
        target_epsilon=target_epsilon,
        target_delta=target_delta,
        sample_rate=sample_rate,
        steps=steps,
        # epsilon_tolerance is absolute; the calibrator's slack a fraction of the target.
        slack=min(max(epsilon_tolerance / target_epsilon, 0.0), 0.5),
    )
    if math.isinf(sigma):
        raise PrivacyError(
            f"no noise multiplier up to {8 * DEFAULT_MAX_NOISE_MULTIPLIER:g} reaches epsilon "
            f"{target_epsilon} ({desc.name})"
        )
    eps = compute_epsilon(
        noise_multiplier=sigma,
        sample_rate=sample_rate,
        steps=steps,
        target_delta=target_delta,
        accountant=accountant,
    )
    if eps > target_epsilon:
        raise PrivacyError(
            f"calibrated noise multiplier {sigma:.4f} gives epsilon {eps:.4f} > target "
            f"{target_epsilon}; refusing to run"
        )
    return sigma
