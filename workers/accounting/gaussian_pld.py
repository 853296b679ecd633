"""The subsampled Gaussian's privacy loss distribution, as dp_accounting builds it, faster.

Every PLD figure dpsweep computes (the planner's calibration, a grid's per-run charges, a
sweep's verified total) comes from dp_accounting's ``from_gaussian_mechanism`` with
connect-the-dots. Building one spends most of its time in one Python loop: for each of the
~10^4-10^5 grid points ``eps`` of the privacy-loss axis, ``get_delta_for_epsilon`` calls
``inverse_privacy_loss(eps)`` one scalar at a time (about 4 us each), which made planning a
four-grid sweep take seconds.

:class:`_VectorGaussianPrivacyLoss` computes those inverses for the whole axis at once, with
the same arithmetic as the scalar code, operation by operation: numpy's ``log``, ``exp`` and
``log1p`` on float64 give the same bits element-wise as on the scalars the loop hands them,
the same ``math.isclose`` edge and the same refusals (``ValueError``) where the scalar code
raises. Everything else (the tails, the CDFs, the discretisation, composition) is the
library's own code. The result is therefore the library's PLD bit for bit: the tests compare
the probability masses and the epsilons exactly, over random noise multipliers, sampling
rates, grids and compositions (``tests/workers/accounting/test_gaussian_pld.py``).

Should a future dp_accounting move the private helpers used here, :func:`gaussian_pld` falls
back to the library's public ``from_gaussian_mechanism`` (the same values, only slower).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

# math.isclose's default relative tolerance, used by dp_accounting's scalar inverse.
_ISCLOSE_RTOL = 1e-9


def _isclose(a: np.ndarray, b: float) -> np.ndarray:
    """``math.isclose(a_i, b)`` for every element (``rel_tol=1e-9``, ``abs_tol=0``)."""
    with np.errstate(invalid="ignore"):
        near = np.abs(b - a) <= _ISCLOSE_RTOL * np.maximum(np.abs(a), abs(b))
        return (a == b) | (np.isfinite(a) & math.isfinite(b) & near)


def _vector_class() -> type:
    from dp_accounting.pld import privacy_loss_mechanism as plm

    adjacency = plm.AdjacencyType

    class _VectorGaussianPrivacyLoss(plm.GaussianPrivacyLoss):
        """dp_accounting's ``GaussianPrivacyLoss``, its inverse privacy loss vectorised."""

        def _inverse_privacy_losses(self, losses: np.ndarray) -> np.ndarray:
            """``[self.inverse_privacy_loss(l) for l in losses]`` for ADD or REMOVE, q < 1.

            Mirrors ``_inverse_privacy_loss_add``/``_remove``, ``log_a_times_exp_b_plus_c``
            (``a = 1/q > 0``, ``c = 1 - 1/q < 0``, so its ``_log_sub`` branch) and the
            Gaussian's ``_inverse_privacy_loss_without_subsampling_remove``, step by step.
            """
            q = self.sampling_prob
            s = self.sensitivity
            var = self._standard_deviation**2
            a = 1 / q
            c = 1 - 1 / q
            if self.adjacency_type == adjacency.ADD:
                edge = -math.log(1 - q)
                close = _isclose(losses, edge)
                if np.any(~close & (losses > edge)):
                    raise ValueError(
                        f"privacy_loss is larger than -log(1 - sampling_prob) ({edge})."
                    )
                b = -losses
            else:
                edge = math.log(1 - q)
                close = _isclose(losses, edge)
                if np.any(~close & (losses <= edge)):
                    raise ValueError(
                        f"privacy_loss is smaller than log(1 - sampling_prob) ({edge})."
                    )
                b = losses
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                d = b + np.log(a)
                log_minus_c = np.log(-c)
                if np.any(~close & (b != 0) & (log_minus_c >= d)):
                    raise ValueError("a must be greater than b.")
                logged = np.where(b == 0, np.log(a + c), d + np.log1p(-np.exp(log_minus_c - d)))
                if self.adjacency_type == adjacency.ADD:
                    x = s + (-0.5 * s - (-logged) * var / s)
                    # At the edge: the inverse without subsampling at +inf.
                    return np.where(close, s + (-0.5 * s - math.inf * var / s), x)
                x = -0.5 * s - logged * var / s
                # At the edge: the inverse without subsampling at -inf.
                return np.where(close, -0.5 * s - (-math.inf) * var / s, x)

        def get_delta_for_epsilon(self, epsilon: Any) -> Any:
            """The library's ``get_delta_for_epsilon``, all inverses computed at once."""
            if self.sampling_prob == 1.0 or self.adjacency_type not in (
                adjacency.ADD,
                adjacency.REMOVE,
            ):
                return super().get_delta_for_epsilon(epsilon)
            is_scalar = isinstance(epsilon, numbers.Number)
            epsilons = np.array([epsilon]) if is_scalar else np.asarray(epsilon)
            deltas = np.zeros_like(epsilons, dtype=float)
            if self.adjacency_type == adjacency.ADD:
                inverse = epsilons < -math.log1p(-self.sampling_prob)
            else:
                inverse = epsilons > math.log1p(-self.sampling_prob)
                other = np.logical_not(inverse)
                deltas[other] = -np.expm1(epsilons[other])
            selected = epsilons[inverse]
            x_cutoffs = self._inverse_privacy_losses(np.asarray(selected, dtype=float))
            deltas[inverse] = self.mu_upper_cdf(x_cutoffs) - np.exp(
                selected + self.mu_lower_log_cdf(x_cutoffs)
            )
            deltas = np.clip(deltas, 0, 1)
            return float(deltas[0]) if is_scalar else deltas

    return _VectorGaussianPrivacyLoss


_CLASS: type | None = None


def _vector_gaussian() -> type:
    global _CLASS
    if _CLASS is None:
        _CLASS = _vector_class()
    return _CLASS


def gaussian_pld(
    *,
    noise_multiplier: float,
    sample_rate: float = 1.0,
    value_discretization_interval: float,
) -> Any:
    """``from_gaussian_mechanism(noise_multiplier, sampling_prob=sample_rate, ...)``, the same
    PLD.

    Sensitivity 1, pessimistic, connect-the-dots, add-or-remove-one neighbours, the library's
    mass truncation: dp_accounting's defaults, which are also what its ``PLDAccountant`` uses.

    Args:
        noise_multiplier: The Gaussian's standard deviation over the sensitivity (> 0).
        sample_rate: Poisson sampling rate q in (0, 1] (dp_accounting's ``sampling_prob``).
        value_discretization_interval: The PLD's grid on the privacy-loss axis.
    """
    from dp_accounting.pld import privacy_loss_distribution as pld

    sampling_prob = sample_rate  # dp_accounting's name, in the calls below
    create = getattr(pld, "_create_pld_pmf_from_monotone_privacy_loss", None)
    subsampled = getattr(pld, "_pld_for_subsampled_mechanism", None)
    if create is None or subsampled is None:  # a dp_accounting without these helpers
        return pld.from_gaussian_mechanism(
            noise_multiplier,
            sampling_prob=sampling_prob,
            value_discretization_interval=value_discretization_interval,
            use_connect_dots=True,
        )
    cls = _vector_gaussian()

    def one(adjacency_type: Any) -> Any:
        return create(
            cls(noise_multiplier, sampling_prob=sampling_prob, adjacency_type=adjacency_type),
            pessimistic_estimate=True,
            value_discretization_interval=value_discretization_interval,
            use_connect_dots=True,
        )

    return subsampled(one, sampling_prob)


def composed_pld(
    mechanisms: list[tuple[float, float | None, int]], *, value_discretization_interval: float
) -> Any:
    """The PLD of a sequence of Gaussian mechanisms, as dp_accounting's ``PLDAccountant`` has it.

    Each entry ``(noise_multiplier, sampling_prob, count)`` is, in order from the identity, what
    the accountant composes for ``PoissonSampledDpEvent(sampling_prob,
    GaussianDpEvent(noise_multiplier))`` ``count`` times, or with ``sampling_prob=None`` for
    ``GaussianDpEvent(noise_multiplier)`` ``count`` times (one Gaussian of multiplier
    ``noise_multiplier / sqrt(count)``, exact). The same PLD, bit for bit.

    Returns:
        The PLD, or ``None`` where a mechanism gives no privacy (a noise multiplier of 0),
        whose epsilon the accountant reports as infinite.

    Raises:
        ValueError: a count below 1, which the accountant refuses too (a composition of no
            releases is a caller's bug, not an epsilon of 0).
    """
    from dp_accounting.pld import privacy_loss_distribution as pld

    grid = value_discretization_interval
    total = pld.identity(value_discretization_interval=grid)
    for sigma, q, count in mechanisms:
        if count < 1:
            raise ValueError(f"`count` must be positive. Found {count}.")
        if q == 0:
            continue
        if sigma == 0:
            return None
        if q is None:
            one = gaussian_pld(
                noise_multiplier=sigma / math.sqrt(count), value_discretization_interval=grid
            )
        else:
            one = gaussian_pld(
                noise_multiplier=sigma, sample_rate=q, value_discretization_interval=grid
            )
            one = one.self_compose(count)
        total = total.compose(one)
    return total
