"""The epsilon per person that example-level DP-SGD gives a person with several rows.

Example-level DP-SGD protects one row. A person with ``rows`` rows in the data is protected
only at group privacy: removing the person removes all their rows at once. The bound here is
tight rather than ``rows`` times the row's epsilon. Under Poisson sampling at rate q, each of
the person's ``rows`` rows is in a step's batch independently, so j of them are, with
probability ``Binomial(j; rows, q)``. In the worst case all their clipped gradients point the
same way, each of norm C, and one step's release is ``N(0, sigma^2 C^2)`` without the person
against the mixture ``sum_j Binomial(j; rows, q) N(j C, sigma^2 C^2)`` with them. That mixture
of Gaussians dominates every other arrangement of the rows' gradients (Ganesh 2024, "Tight
group-level DP guarantees for DP-SGD with sampling via mixture of Gaussians mechanisms",
arXiv 2401.10294). dp_accounting's ``MixtureOfGaussiansDpEvent`` is this mechanism, and its
PLD accountant composes it under add-or-remove-one neighbours, here at the person level.

**What is composed.** ``compositions`` runs of ``steps`` steps: ``compositions * steps``
identical mixture steps, self-composed as one PLD. A ``compose`` grid's plan
(:func:`sweeper.privacy.composition.plan_compose`) charges all K trials' T steps of one sigma
and one q in this way, so ``compositions = K`` gives the grid's epsilon per person. Only the
training steps are covered: with ``eval: {mode: dp}`` a noisy count of correct predictions
moves by up to ``rows`` when a person leaves, and that is not charged here. A public
evaluation dataset's releases cost nothing.

**Speed.** dp_accounting inverts the mixture's privacy loss with one scalar call per node of a
bisection tree (1.7 million privacy-loss calls for 8 rows at dpsweep's grid: 30 s per PLD).
``_VectorMixture`` runs the same bisection for the whole privacy-loss axis at once, with
the same arithmetic. The grid on the privacy-loss axis is, by default, dpsweep's PLD grid times
``rows``: the loss's range grows with the rows, and the pessimistic estimate is an upper bound
at any grid, so a coarser one can only over-state epsilon, never under-state it.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from dpsweep.errors import ConfigError, PrivacyError
from workers.accounting.epsilon import PLD_DISCRETIZATION
from workers.accounting.gaussian_pld import self_compose

# Rows per person beyond which the binomial's mixture has more components than are worth
# computing; user-level data with more rows per person bounds them (rows_per_unit <= 1024).
MAX_ROWS = 1024
# Privacy-loss points per bisection batch: a batch holds points x (rows + 1) floats, so this
# keeps one batch near 64 MiB at 1024 rows.
_BATCH_CELLS = 8 * 1024 * 1024


def _vector_mixture_class() -> type:
    # deferred: dp_accounting takes ~0.3 s to import; loaded when a PLD is first built
    from dp_accounting.pld import privacy_loss_mechanism as plm

    adjacency = plm.AdjacencyType

    class _VectorMixture(plm.MixtureGaussianPrivacyLoss):
        """dp_accounting's mixture-of-Gaussians privacy loss, its bisection vectorised."""

        def _losses_at(self, x: np.ndarray) -> np.ndarray:
            """``[self.privacy_loss(xi) for xi in x]``, the scalar method's operations."""
            x_loss = self.sensitivities[None, :] * x[:, None] / self._variance
            constants = self._precompute_privacy_loss_constants[None, :]
            if self.adjacency_type == adjacency.ADD:
                return -np.logaddexp.reduce(constants + x_loss, axis=1)
            return np.logaddexp.reduce(constants - x_loss, axis=1)

        def _inverse_privacy_losses_with_range(
            self, privacy_losses: np.ndarray, bounds: tuple[float, float], precision: float = 1e-6
        ) -> np.ndarray:
            """The library's recursive bisection, followed by every loss at once.

            The recursion halves ``bounds`` until an interval is at most ``precision`` wide
            and answers its upper end rounded down to a multiple of ``precision``; the path
            of each loss depends on that loss alone, so following all paths together (each
            its own ``lo``, ``hi``) gives each the same answer.
            """
            losses = np.asarray(privacy_losses, dtype=float)
            out = np.empty_like(losses)
            batch = max(1, _BATCH_CELLS // len(self.sensitivities))
            for start in range(0, len(losses), batch):
                chunk = losses[start : start + batch]
                out[start : start + batch] = self._bisect(chunk, bounds, precision)
            return out

        def _bisect(
            self, losses: np.ndarray, bounds: tuple[float, float], precision: float
        ) -> np.ndarray:
            lo = np.full_like(losses, bounds[0])
            hi = np.full_like(losses, bounds[1])
            active = np.flatnonzero(hi - lo > precision)
            while active.size:
                mid = (lo[active] + hi[active]) / 2
                # The loss decreases in x: one below the split lies above mid.
                below = losses[active] < self._losses_at(mid)
                lo[active[below]] = mid[below]
                hi[active[~below]] = mid[~below]
                active = active[hi[active] - lo[active] > precision]
            return np.floor(hi / precision) * precision

    return _VectorMixture


_CLASS: type | None = None


def _vector_mixture() -> type:
    global _CLASS
    if _CLASS is None:
        _CLASS = _vector_mixture_class()
    return _CLASS


def mixture_pld(
    *,
    noise_multiplier: float,
    sensitivities: list[float],
    probabilities: list[float],
    value_discretization_interval: float,
) -> Any:
    """``from_mixture_gaussian_mechanism(...)``: the same PLD, built faster.

    Pessimistic, connect-the-dots, dp_accounting's mass truncation (its defaults, which its
    ``PLDAccountant`` uses for a ``MixtureOfGaussiansDpEvent``).

    Args:
        noise_multiplier: The Gaussian's standard deviation over the clipping norm (> 0).
        sensitivities: The mixture's shifts, in clipping norms (>= 0, one > 0).
        probabilities: Each shift's probability (summing to 1).
        value_discretization_interval: The PLD's grid on the privacy-loss axis.
    """
    # deferred: dp_accounting takes ~0.3 s to import; loaded when a PLD is first built
    from dp_accounting.pld import privacy_loss_distribution as pld
    from dp_accounting.pld import privacy_loss_mechanism as plm  # deferred, as above

    create = getattr(pld, "_create_pld_pmf_from_monotone_privacy_loss", None)
    if create is None:  # a dp_accounting without this helper: its own (slower) way
        return pld.from_mixture_gaussian_mechanism(
            noise_multiplier,
            sensitivities,
            probabilities,
            value_discretization_interval=value_discretization_interval,
        )
    cls = _vector_mixture()

    def one(adjacency_type: Any) -> Any:
        return create(
            cls(noise_multiplier, sensitivities, probabilities, adjacency_type=adjacency_type),
            pessimistic_estimate=True,
            value_discretization_interval=value_discretization_interval,
            use_connect_dots=True,
        )

    remove = one(plm.AdjacencyType.REMOVE)
    return pld.PrivacyLossDistribution(remove, one(plm.AdjacencyType.ADD))


def person_mixture(*, rows: int, sample_rate: float) -> tuple[list[float], list[float]]:
    """The shifts ``0 .. rows`` (in clipping norms) and their probabilities
    ``Binomial(j; rows, sample_rate)``: how many of a person's rows one step samples."""
    # deferred: scipy.stats takes ~0.5 s to import and only this computation needs it
    from scipy import stats

    shifts = np.arange(rows + 1)
    probabilities = stats.binom.pmf(shifts, rows, sample_rate)
    # Shifts the binomial gives no mass in float64 change nothing; the library drops them.
    return [float(j) for j in shifts], [float(p) for p in probabilities]


def _pmf_epsilon(pmf: Any, delta: float) -> float:
    """A dense PMF's ``get_epsilon_for_delta``, its masses summed in log space.

    The library's scan (``pld_pmf._get_epsilon_for_delta``), step by step: from the largest
    loss down, the first loss ``l`` at which ``log((U - delta) / W) >= l`` (``U`` the mass
    above it with the infinite loss's, ``W`` the sum of ``p * exp(-loss)`` above it) gives
    epsilon ``log((U - delta) / W)``. Summed linearly, ``W`` underflows for an epsilon near
    709 (``exp(-709)`` is float64's smallest normal scale) and the library answers ``inf``;
    a person with many rows reaches that. Here ``log W`` is accumulated instead.
    """
    if pmf._infinity_mass > delta:
        return math.inf
    # The FFT's composition leaves masses of ~-1e-18 where there is none; their log is
    # undefined, and as zeros they move epsilon by ~1e-15 of itself.
    probs = np.maximum(np.flip(np.asarray(pmf._probs, dtype=float)), 0.0)
    top = (pmf._lower_loss + len(probs) - 1) * pmf._discretization
    losses = top - np.arange(len(probs)) * pmf._discretization
    # Before index i: the mass above it and log W, as the scan holds them there.
    upper = pmf._infinity_mass + np.concatenate(([0.0], np.cumsum(probs)))
    with np.errstate(divide="ignore"):
        terms = np.log(probs) - losses
    log_lower = np.concatenate(([-math.inf], np.logaddexp.accumulate(terms)))
    with np.errstate(divide="ignore", invalid="ignore"):
        candidate = np.log(upper - delta) - log_lower
    stops = (upper[:-1] > delta) & np.isfinite(log_lower[:-1]) & (candidate[:-1] >= losses)
    hits = np.flatnonzero(stops)
    if hits.size:
        return max(0.0, float(candidate[hits[0]]))
    if upper[-1] <= delta or not log_lower[-1] < math.log(upper[-1] - delta):
        return 0.0
    return float(candidate[-1])


def pld_epsilon_for_delta(distribution: Any, delta: float) -> float:
    """``distribution.get_epsilon_for_delta(delta)`` without its overflow above ~709.

    The larger of the remove and add PMFs' epsilons, each by :func:`_pmf_epsilon`. A
    dp_accounting without these internals answers itself (``inf`` where it overflows: an
    over-statement, never an under-statement).
    """
    # deferred: dp_accounting takes ~0.3 s to import; loaded when a PLD is first built
    from dp_accounting.pld import pld_pmf

    pmfs = [getattr(distribution, "_pmf_remove", None)]
    if not getattr(distribution, "_symmetric", True):
        pmfs.append(getattr(distribution, "_pmf_add", None))
    if not all(
        type(p) is pld_pmf.DensePLDPmf
        and all(hasattr(p, a) for a in ("_probs", "_lower_loss", "_infinity_mass"))
        for p in pmfs
    ):
        return float(distribution.get_epsilon_for_delta(delta))
    return max(_pmf_epsilon(p, delta) for p in pmfs)


def _check(name: str, value: object, *, integer: bool) -> float:
    """``value`` as a number, refusing a bool, a string or a non-finite value by name."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number; got {value!r}", field=name)
    number = float(value)
    if not math.isfinite(number):
        raise ConfigError(f"{name} must be finite; got {value!r}", field=name)
    if integer and not number.is_integer():
        raise ConfigError(f"{name} must be an integer; got {value!r}", field=name)
    return number


def _checked(
    noise_multiplier: object,
    sample_rate: object,
    steps: object,
    rows: object,
    delta: object,
    compositions: object,
) -> None:
    """Refuse inputs out of range with a ConfigError naming the field."""
    if _check("noise_multiplier", noise_multiplier, integer=False) <= 0:
        # Without noise no person is protected: there is no epsilon to state.
        raise ConfigError(
            f"noise multiplier must be > 0; got {noise_multiplier}", field="noise_multiplier"
        )
    if not 0.0 < _check("sample_rate", sample_rate, integer=False) <= 1.0:
        raise ConfigError(f"sample rate must be in (0, 1]; got {sample_rate}", field="sample_rate")
    if _check("steps", steps, integer=True) < 1:
        raise ConfigError(f"steps must be >= 1; got {steps}", field="steps")
    if not 1 <= _check("rows", rows, integer=True) <= MAX_ROWS:
        raise ConfigError(f"rows must be in [1, {MAX_ROWS}]; got {rows}", field="rows")
    if not 0.0 < _check("delta", delta, integer=False) < 1.0:
        raise ConfigError(f"delta must be in (0, 1); got {delta}", field="delta")
    if _check("compositions", compositions, integer=True) < 1:
        raise ConfigError(f"compositions must be >= 1; got {compositions}", field="compositions")


def group_epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    rows: int,
    delta: float,
    compositions: int = 1,
    discretization: float | None = None,
) -> float:
    """The epsilon that example-level DP-SGD gives one person with ``rows`` rows.

    ``compositions * steps`` Poisson-subsampled Gaussian steps (each row sampled at
    ``sample_rate``, noise ``noise_multiplier`` times the clipping norm), against the removal
    or addition of all the person's rows at once, at ``delta``: the PLD of the worst-case
    mixture (see the module's docstring), composed. ``rows = 1`` is a row's epsilon (the
    Poisson-subsampled Gaussian's, within the PLD's discretisation).

    Args:
        noise_multiplier: sigma of every step (the noise's std over the clipping norm), > 0.
        sample_rate: Poisson sampling rate q of each row, in (0, 1].
        steps: steps T of one run, >= 1.
        rows: the person's rows k, in [1, 1024].
        delta: the delta the epsilon is stated at, in (0, 1).
        compositions: runs of ``steps`` steps composed (a compose grid's K trials), >= 1.
        discretization: the PLD's grid on the privacy-loss axis; None: dpsweep's PLD grid
            (2.5e-4) times ``rows``. A coarser grid only over-states epsilon.

    Returns:
        The person's epsilon at ``delta`` over all the composed steps (training steps only);
        ``math.inf`` where no finite epsilon holds at ``delta`` (more mass at an infinite
        privacy loss than ``delta``).

    Raises:
        ConfigError: an input out of range (a noise multiplier <= 0 among them), its field
            named.
        PrivacyError: the accountant's answer is not a number >= 0 (fail closed).
    """
    _checked(noise_multiplier, sample_rate, steps, rows, delta, compositions)
    grid = PLD_DISCRETIZATION * rows if discretization is None else discretization
    if isinstance(grid, bool) or not (isinstance(grid, numbers.Real) and 0 < grid < 1):
        raise ConfigError(
            f"discretization must be in (0, 1); got {discretization!r}", field="discretization"
        )
    shifts, probabilities = person_mixture(rows=int(rows), sample_rate=float(sample_rate))
    one = mixture_pld(
        noise_multiplier=float(noise_multiplier),
        sensitivities=shifts,
        probabilities=probabilities,
        value_discretization_interval=float(grid),
    )
    total = self_compose(one, int(steps) * int(compositions))
    eps = pld_epsilon_for_delta(total, float(delta))
    if not eps >= 0:  # NaN or negative: a broken computation, not a figure to print
        raise PrivacyError(f"the group accountant returned an invalid epsilon ({eps})")
    return eps


__all__ = [
    "MAX_ROWS",
    "group_epsilon",
    "mixture_pld",
    "person_mixture",
    "pld_epsilon_for_delta",
]
