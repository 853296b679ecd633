"""Epsilon from the noise actually used, and calibration: the checked entry points.

Strict entry points over the accountants of :mod:`workers.accounting.registry`: Opacus's RDP
(``opacus-rdp``, a single run's default) and PRV (``opacus-prv``), dp_accounting's PLD
(``pld``, torch-free, what the planner calibrates with) and RDP (``dp-rdp``), and any
accountant a plug-in registers. :func:`epsilon_for` and :func:`calibrate_for` take the run's
:class:`~dpsweep.accounting_inputs.AccountingInputs` whole (checked when it was built);
:func:`compute_epsilon` and :func:`calibrate_noise_multiplier` are the same with the inputs
spelled out, and read a worker's legacy names (``rdp`` = ``opacus-rdp``, ``prv`` =
``opacus-prv``: :data:`dpsweep.accountants.WORKER_ALIASES`). Libraries are imported lazily, so
callers without torch (the sweeper) can import this module.

DP evaluation: see :mod:`workers.accounting.epsilon`; the inputs' ``evaluations`` releases of
``eval_noise_multiplier`` are charged with the steps.
"""

from __future__ import annotations

import math

from dpsweep.accountants import DEFAULT_RUN_ACCOUNTANT
from dpsweep.accounting_inputs import AccountingInputs
from dpsweep.errors import ConfigError, PrivacyError
from workers.accounting.registry import (
    BUILTIN_ACCOUNTANTS,
    DEFAULT_MAX_NOISE_MULTIPLIER,
    WORKER_ALIASES,
    epsilon_of,
    get_accountant,
    worker_accountant,
)

# Every built-in name compute_epsilon accepts: the registry's, then the legacy worker aliases
# (taken at import, so without plug-ins: registry.accountant_names() lists theirs too).
ACCOUNTANTS: tuple[str, ...] = (*BUILTIN_ACCOUNTANTS, *WORKER_ALIASES)
# compute_epsilon's default: the table's single-run default (Opacus RDP).
DEFAULT_ACCOUNTANT = DEFAULT_RUN_ACCOUNTANT


def epsilon_for(inputs: AccountingInputs) -> float:
    """Epsilon of ``inputs``: its steps and evaluation releases, by its accountant.

    With DP evaluation, a single trial's epsilon: the ``evaluations`` (E) further Gaussian
    releases of multiplier ``eval_noise_multiplier`` (sensitivity 1, no subsampling) are
    composed with the steps (Opacus history entry ``(sigma_e, 1.0, E)``; for ``pld`` one
    Gaussian of multiplier ``sigma_e / sqrt(E)``, the same mechanism). Cached: the trials of a
    grid ask the same question.

    Raises:
        ConfigError: unknown accountant (field ``privacy.accountant``).
        PrivacyError: the accountant returned no finite epsilon >= 0.
    """
    get_accountant(inputs.accountant)  # unknown: ConfigError, before anything is computed
    if inputs.steps == 0 and not inputs.evaluations:
        return 0.0
    eps = epsilon_of(inputs)
    if not math.isfinite(eps) or eps < 0:
        raise PrivacyError(
            f"the {inputs.accountant} accountant returned an invalid epsilon ({eps})"
        )
    return eps


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
    """:func:`epsilon_for` with the inputs spelled out; ``accountant`` a registry name or a
    worker's legacy name (``rdp`` = ``opacus-rdp``, ``prv`` = ``opacus-prv``).

    Raises:
        ConfigError: unknown accountant (field ``privacy.accountant``), or inputs out of range.
        PrivacyError: the mechanism gives no finite guarantee (e.g. ``noise_multiplier`` <= 0).
    """
    return epsilon_for(
        AccountingInputs(
            noise_multiplier=noise_multiplier,
            sample_rate=sample_rate,
            steps=steps,
            delta=target_delta,
            eval_noise_multiplier=eval_noise_multiplier,
            evaluations=eval_releases,
            accountant=worker_accountant(accountant).name,  # the edge: a worker's name read
        )
    )


def calibrate_for(
    inputs: AccountingInputs, *, target_epsilon: float, epsilon_tolerance: float = 0.01
) -> float:
    """The noise multiplier whose epsilon is at most ``target_epsilon`` (within tolerance below).

    ``inputs``' noise multiplier is the unknown, not read. Every accountant calibrates through
    its descriptor (:meth:`~workers.accounting.registry.AccountantDescriptor.calibrate_for`: the
    one shared calibrator unless a plug-in brings its own), which re-checks the result with
    the accountant's epsilon; it is checked once more with :func:`epsilon_for`: a multiplier
    that overshoots the target is never returned (fail closed).

    Raises:
        ConfigError: invalid arguments or an unknown accountant.
        PrivacyError: no multiplier up to ~10^4 reaches ``target_epsilon``, or the result
            overshoots.
    """
    desc = get_accountant(inputs.accountant)
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise ConfigError(f"epsilon must be > 0; got {target_epsilon}", field="privacy.epsilon")
    if inputs.steps < 1:
        raise ConfigError("calibration needs at least one step", field="steps")
    sigma = desc.calibrate_for(
        inputs,
        target_epsilon=target_epsilon,
        # epsilon_tolerance is absolute; the calibrator's slack a fraction of the target.
        slack=min(max(epsilon_tolerance / target_epsilon, 0.0), 0.5),
    )
    if math.isinf(sigma):
        raise PrivacyError(
            f"no noise multiplier up to {8 * DEFAULT_MAX_NOISE_MULTIPLIER:g} reaches epsilon "
            f"{target_epsilon} ({desc.name})"
        )
    eps = epsilon_for(inputs.with_noise(sigma))
    if eps > target_epsilon:
        raise PrivacyError(
            f"calibrated noise multiplier {sigma:.4f} gives epsilon {eps:.4f} > target "
            f"{target_epsilon}; refusing to run"
        )
    return sigma


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = DEFAULT_ACCOUNTANT,
    epsilon_tolerance: float = 0.01,
) -> float:
    """:func:`calibrate_for` with the inputs spelled out (no evaluation releases);
    ``accountant`` as for :func:`compute_epsilon`."""
    inputs = AccountingInputs(
        noise_multiplier=None,
        sample_rate=sample_rate,
        steps=steps,
        delta=target_delta,
        accountant=worker_accountant(accountant).name,  # the edge: a worker's name read
    )
    return calibrate_for(inputs, target_epsilon=target_epsilon, epsilon_tolerance=epsilon_tolerance)
