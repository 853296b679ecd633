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
from scipy import fft, special

# math.isclose's default relative tolerance, used by dp_accounting's scalar inverse.
_ISCLOSE_RTOL = 1e-9
# dp_accounting's pld_pmf._MAX_PMF_SPARSE_SIZE: a sparse self-composition that could grow
# beyond this many points is computed densely (see self_compose).
_MAX_PMF_SPARSE_SIZE = 1000


def _isclose(a: np.ndarray, b: float) -> np.ndarray:
    """``math.isclose(a_i, b)`` for every element (``rel_tol=1e-9``, ``abs_tol=0``)."""
    with np.errstate(invalid="ignore"):
        near = np.abs(b - a) <= _ISCLOSE_RTOL * np.maximum(np.abs(a), abs(b))
        return (a == b) | (np.isfinite(a) & math.isfinite(b) & near)


def _vector_class() -> type:
    # deferred: dp_accounting takes ~0.3 s to import; loaded when a PLD is first built
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
    # deferred: dp_accounting takes ~0.3 s to import; loaded when a PLD is first built
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
    # deferred: dp_accounting takes ~0.3 s to import; loaded when a PLD is first built
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
            one = self_compose(one, count)
        total = total.compose(one)
    return total


def self_compose(distribution: Any, count: int) -> Any:
    """``distribution.self_compose(count)``, the same PLD, without the library's big power.

    A sparse PMF (a subsampled Gaussian at much noise has ~100 points) decides whether to turn
    dense by computing ``size ** count`` exactly, a Python integer of millions of digits for
    the ~10^6 steps of a large grid (0.3 s per PMF at 900k steps, twice per PLD); beyond 1000 it
    self-composes ``to_dense_pmf()``. Here that conversion happens first, whenever the
    library would make it (``size >= 2`` and ``count >= 10`` always exceed 1000: 2^10 > 1000),
    so the library's own dense self-composition runs on the same PMF: the same masses, bit
    for bit (``tests/workers/accounting/test_gaussian_pld.py``).
    """
    remove = getattr(distribution, "_pmf_remove", None)
    add = getattr(distribution, "_pmf_add", None)
    symmetric = getattr(distribution, "_symmetric", None)
    if remove is None or add is None or symmetric is None:  # another dp_accounting: its way
        return distribution.self_compose(count)
    dense_remove, dense_add = _dense_for(remove, count), _dense_for(add, count)
    if dense_remove is remove and dense_add is add:
        return distribution.self_compose(count)
    cls = type(distribution)
    return cls(dense_remove, None if symmetric else dense_add).self_compose(count)


def _dense_for(pmf: Any, count: int) -> Any:
    """``pmf.to_dense_pmf()`` where the library's sparse ``self_compose`` would convert it."""
    # deferred: dp_accounting takes ~0.3 s to import; loaded when a PLD is first built
    from dp_accounting.pld import pld_pmf

    if not isinstance(pmf, pld_pmf.SparsePLDPmf) or count <= 1 or pmf.size <= 1:
        return pmf  # dense already, or a self_compose that stays sparse (the library's way)
    if count >= 10 or pmf.size**count > _MAX_PMF_SPARSE_SIZE:
        return pmf.to_dense_pmf()
    return pmf


class SelfPowers:
    """``self_compose(distribution, n)`` for several ``n`` of one PLD, the same PLDs, faster.

    A grid's charge schedule self-composes one run's PLD at every charge point. For each
    call the library's ``common.self_convolve`` first bounds the result's support (Chernoff
    bounds: 40 ``logsumexp`` moments of the input PMF, which depend on the input alone) and
    then raises its FFT to the power. Here the moments are computed once per PMF and the rest
    is the library's arithmetic, step by step (``DensePLDPmf.self_compose``,
    ``self_convolve``, ``compute_self_convolve_bounds``): the same masses, bit for bit
    (``tests/workers/accounting/test_gaussian_pld.py``). A dp_accounting without those
    internals gets :func:`self_compose`.
    """

    def __init__(self, distribution: Any) -> None:
        self._distribution = distribution
        self._moments: dict[int, tuple[np.ndarray, list[float]]] = {}

    def __call__(self, count: int) -> Any:
        d = self._distribution
        if count <= 1 or not _dense_internals(d):
            return self_compose(d, count)
        remove = self._pmf_power(d._pmf_remove, count)
        if d._symmetric:
            return type(d)(remove)
        return type(d)(remove, self._pmf_power(d._pmf_add, count))

    def _log_mgfs(self, probs: np.ndarray) -> tuple[np.ndarray, list[float]]:
        cached = self._moments.get(id(probs))
        if cached is None:
            # compute_self_convolve_bounds's orders and moments, as it computes them.
            orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / len(probs)
            log_mgfs = [special.logsumexp(np.arange(len(probs)) * o, b=probs) for o in orders]
            cached = self._moments[id(probs)] = (orders, log_mgfs)
        return cached

    def _pmf_power(self, pmf: Any, count: int, tail_mass_truncation: float = 1e-15) -> Any:
        """``pmf.self_compose(count)`` for a dense PMF: the library's steps, moments reused."""
        probs = pmf._probs
        # compute_self_convolve_bounds(probs, count, tail_mass_truncation)
        upper_bound = (len(probs) - 1) * count
        lower_bound = 0
        orders, log_mgfs = self._log_mgfs(probs)
        for order, log_mgf_value in zip(orders, log_mgfs, strict=True):
            bound = (count * log_mgf_value + math.log(2 / tail_mass_truncation)) / order
            if not math.isfinite(bound):
                continue
            if order > 0:
                upper_bound = min(upper_bound, math.ceil(bound))
            if order < 0:
                lower_bound = max(lower_bound, math.floor(bound))
        # self_convolve's FFT power
        output_len = upper_bound - lower_bound + 1
        fast_len = fft.next_fast_len(max(output_len, len(probs)))
        convolved = np.real(fft.ifft(fft.fft(probs, fast_len) ** count))
        output = np.roll(convolved, -lower_bound)[:output_len]
        # DensePLDPmf.self_compose
        lower_loss = pmf._lower_loss * count + lower_bound
        inf_prob = tail_mass_truncation - math.expm1(count * math.log1p(-pmf._infinity_mass))
        return type(pmf)(
            pmf._discretization,
            lower_loss,
            np.array(output),
            inf_prob,
            pmf._pessimistic_estimate,
        )


def _dense_internals(distribution: Any) -> bool:
    """Whether ``distribution`` has dp_accounting 0.6's PLD and dense-PMF internals."""
    # deferred: dp_accounting takes ~0.3 s to import; loaded when a PLD is first built
    from dp_accounting.pld import pld_pmf

    pmfs = (getattr(distribution, "_pmf_remove", None), getattr(distribution, "_pmf_add", None))
    return isinstance(getattr(distribution, "_symmetric", None), bool) and all(
        type(p) is pld_pmf.DensePLDPmf
        and all(hasattr(p, a) for a in ("_probs", "_lower_loss", "_infinity_mass"))
        for p in pmfs
    )
