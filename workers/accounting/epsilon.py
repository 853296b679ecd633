"""Each built-in accountant's epsilon: Opacus's RDP and PRV, dp_accounting's PLD and RDP.

Unchecked computations (:func:`workers.accounting.compute.compute_epsilon` checks the
arguments, picks the accountant by name and caches); the accountant registry
(:mod:`workers.accounting.registry`) describes each of them. Libraries are imported when called,
so callers without torch (the sweeper) can import this module.

DP evaluation (``eval: {mode: dp}``): besides its steps, a trial releases ``eval_releases``
noisy counts of correct predictions, each a Gaussian mechanism of sensitivity 1 and noise
multiplier ``eval_noise_multiplier`` (no subsampling). E such Gaussians compose to exactly one
Gaussian of multiplier ``eval_noise_multiplier / sqrt(E)``; every function here that takes
these two keywords charges them with the steps.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from dpsweep.errors import ConfigError, PrivacyError
from workers.accounting.gaussian_pld import composed_pld, gaussian_pld, self_compose

# Value discretisation of the PLD accountant. The estimate is pessimistic (an upper bound) at
# any grid; 2.5e-4 stays within ~0.3 % of the fine value on 30k compositions in 0.03-0.4 s,
# where 1e-3 can over-state by ~4 % (and is oddly slow at large sigma). The planner verifies
# with dp_accounting's default 1e-4.
PLD_DISCRETIZATION = 2.5e-4


def _eval_sigma(eval_noise_multiplier: float | None, eval_releases: int) -> float | None:
    """The one Gaussian multiplier the ``eval_releases`` evaluation releases compose to.

    ``None`` when there are none. Raises for releases without a usable multiplier.
    """
    if eval_releases < 0 or int(eval_releases) != eval_releases:
        raise ConfigError(
            f"eval_releases must be an integer >= 0; got {eval_releases}", field="eval"
        )
    if eval_releases == 0:
        return None
    if eval_noise_multiplier is None or not (
        eval_noise_multiplier > 0 and math.isfinite(eval_noise_multiplier)
    ):
        raise PrivacyError(
            f"evaluation noise multiplier {eval_noise_multiplier} gives no finite privacy "
            "guarantee for the noisy evaluations; it must be > 0"
        )
    return float(eval_noise_multiplier) / math.sqrt(int(eval_releases))


def opacus_epsilon(
    kind: str,
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    target_delta: float,
    eval_noise_multiplier: float | None = None,
    eval_releases: int = 0,
) -> float:
    """Epsilon by Opacus's ``kind`` accountant (``"rdp"`` or ``"prv"``); imports torch.

    DP evaluation's ``eval_releases`` Gaussians are the history entry ``(sigma_e, 1.0, E)``.
    """
    # deferred: Opacus imports torch; the torch-free planner imports this module
    from opacus.accountants import PRVAccountant, RDPAccountant

    acc: Any = {"rdp": RDPAccountant, "prv": PRVAccountant}[kind]()
    history = [(noise_multiplier, sample_rate, steps)] if steps > 0 else []
    if eval_releases > 0 and eval_noise_multiplier is not None:
        # Without subsampling (q = 1) both accountants treat the entry as plain Gaussians.
        history.append((eval_noise_multiplier, 1.0, eval_releases))
    acc.history = history
    with warnings.catch_warnings():
        # "Optimal order is the largest alpha": the RDP bound is then merely loose (an
        # over-estimate of epsilon), which is safe; it is not worth alarming users over.
        warnings.simplefilter("ignore", UserWarning)
        # Opacus's PRV takes log(1 - q) = -inf for a q = 1 entry; its density is then the
        # plain Gaussian's, but numpy warns about the logarithm of zero.
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(acc.get_epsilon(delta=target_delta))


def pld_epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    target_delta: float,
    discretization: float = PLD_DISCRETIZATION,
    eval_noise_multiplier: float | None = None,
    eval_releases: int = 0,
) -> float:
    """Epsilon by dp_accounting's privacy-loss-distribution accountant (torch-free).

    Uses the pessimistic (upper-bound) discretisation, so a coarser grid only over-states.
    With ``eval_releases`` > 0, also charges that many Gaussian releases of multiplier
    ``eval_noise_multiplier`` (sensitivity 1), composed as one Gaussian of multiplier
    ``eval_noise_multiplier / sqrt(eval_releases)`` (exact).
    """
    extra = _eval_sigma(eval_noise_multiplier, eval_releases)
    # dp_accounting's PLDAccountant composing these events, bit for bit, faster.
    mechanisms: list[tuple[float, float | None, int]] = []
    if steps > 0:
        mechanisms.append((noise_multiplier, sample_rate, steps))
    if extra is not None:
        mechanisms.append((extra, None, 1))
    total = composed_pld(mechanisms, value_discretization_interval=discretization)
    if total is None:
        return math.inf
    return float(total.get_epsilon_for_delta(target_delta))


def dp_rdp_epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    target_delta: float,
    eval_noise_multiplier: float | None = None,
    eval_releases: int = 0,
) -> float:
    """Epsilon by dp_accounting's RDP accountant (torch-free; the planner's fast option).

    ``eval_noise_multiplier`` and ``eval_releases`` add Gaussian releases as for
    :func:`pld_epsilon`.
    """
    # deferred: dp_accounting takes ~0.3 s to import; loaded when an epsilon is computed
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant  # deferred: as above

    extra = _eval_sigma(eval_noise_multiplier, eval_releases)
    acc = rdp_privacy_accountant.RdpAccountant()
    if steps > 0:
        acc.compose(
            dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier)),
            steps,
        )
    if extra is not None:
        acc.compose(dp_event.GaussianDpEvent(extra))
    return float(acc.get_epsilon(target_delta))


def pld_run_epsilons(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    runs: int,
    target_delta: float,
    eval_noise_multiplier: float | None = None,
    eval_releases: int = 0,
) -> list[float]:
    """PLD's charge schedule: one run's PLD composed with itself run by run.

    Each prefix is a pessimistic upper bound on the composed privacy loss, the same accountant
    the plan was calibrated with. DP evaluation: each run's E releases (Gaussian, sensitivity
    1) compose exactly as one Gaussian of multiplier sigma_e / sqrt(E).
    """
    one = self_compose(
        gaussian_pld(
            noise_multiplier=noise_multiplier,
            sample_rate=sample_rate,
            value_discretization_interval=PLD_DISCRETIZATION,
        ),
        steps,
    )
    if eval_releases and eval_noise_multiplier is not None:
        one = one.compose(
            gaussian_pld(
                noise_multiplier=float(eval_noise_multiplier) / eval_releases**0.5,
                value_discretization_interval=PLD_DISCRETIZATION,
            )
        )
    out, cur = [], one
    for j in range(1, runs + 1):
        if j > 1:
            cur = cur.compose(one)
        out.append(float(cur.get_epsilon_for_delta(target_delta)))
    return out
