"""The epsilon of releasing every grid of a sweep on one dataset, composed tightly, verified.

:func:`sweep_epsilon` composes the grids with dp_accounting (PLD, or RDP when a grid is a random
search) rather than summing them, and checks that figure with the independent accountants (the
PRV accountant, or the independent RDP of :mod:`workers.accounting.audit.papernot_steinke`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpsweep.errors import ConfigError, PrivacyError
from workers.accounting.audit.bounds import EpsilonBounds, _eval_pair
from workers.accounting.audit.papernot_steinke import RDP_AGREEMENT, RDP_SOURCE, _ps_rdp
from workers.accounting.audit.prv import pld_overstatement, prv_compose_epsilon, prv_error
from workers.accounting.audit.rdp import (
    RDP_ORDERS,
    gaussian_rdp,
    rdp_to_epsilon,
    subsampled_gaussian_rdp,
)
from workers.accounting.epsilon import PLD_DISCRETIZATION
from workers.accounting.gaussian_pld import composed_pld


@dataclass(frozen=True)
class SweepEpsilon:
    """The epsilon of releasing every grid of a sweep, at the sum of their deltas.

    Attributes:
        epsilon: ``min(tight, summed)``: both are valid guarantees at ``delta``.
        delta: The sum of the grids' deltas (what the ledger charges).
        method: How ``epsilon`` was obtained: ``"pld composition"``, ``"rdp composition"``
            or ``"sum of grid epsilons"``.
        tight: The tight composition's epsilon (dp_accounting PLD, or RDP when a grid is a
            random search).
        summed: The sum of the grids' own epsilons (basic composition).
        verifier: The independent accountant that checked ``tight``.
        verifier_bounds: Its figure with error bars.
    """

    epsilon: float
    delta: float
    method: str
    tight: float
    summed: float
    verifier: str
    verifier_bounds: EpsilonBounds


_GRID_FIELDS = ("accounting", "trials", "steps_per_trial", "sample_rate", "noise_multiplier")


def _field(grid: Any, name: str, default: Any = None) -> Any:
    if isinstance(grid, Mapping):
        return grid.get(name, default)
    return getattr(grid, name, default)


@dataclass(frozen=True)
class _Grid:
    accounting: str
    trials: int
    steps: int
    q: float
    sigma: float
    delta: float
    epsilon: float
    mean: float
    shape: float
    # DP evaluation: sigma_e of each release and E, the releases per trial (None, 0: none).
    eval_sigma: float | None = None
    eval_releases: int = 0

    def eval_mechanism(self) -> tuple[float, float, int] | None:
        """All K trials' K*E evaluation releases as ``(sigma_e, 1.0, K*E)``, or None."""
        if self.eval_sigma is None:
            return None
        return (self.eval_sigma, 1.0, self.trials * self.eval_releases)


def _grid(grid: Any) -> _Grid:
    missing = [f for f in (*_GRID_FIELDS, "delta", "epsilon_total") if _field(grid, f) is None]
    if missing:
        raise ConfigError(f"a grid of the sweep lacks {', '.join(missing)}", field="plan")
    accounting = str(_field(grid, "accounting"))
    shape = math.nan
    if accounting == "papernot-steinke":
        raw = _field(grid, "distribution_shape")
        if raw is None:
            raise PrivacyError(
                f"papernot-steinke grid {_field(grid, 'arm', '?')!r} does not record its "
                "distribution's shape; its random search cannot be accounted"
            )
        shape = float(raw)  # float("inf") also reads the "inf" that JSON plans store
    elif accounting not in ("compose", "basic"):
        raise PrivacyError(f"no accounting rule for {accounting!r}")
    trials = int(_field(grid, "trials"))
    raw_e = _field(grid, "eval_noise_multiplier")
    eval_sigma, eval_releases = _eval_pair(
        None if raw_e is None else float(raw_e), int(_field(grid, "eval_releases") or 0)
    )
    return _Grid(
        accounting=accounting,
        trials=trials,
        steps=int(_field(grid, "steps_per_trial")),
        q=float(_field(grid, "sample_rate")),
        sigma=float(_field(grid, "noise_multiplier")),
        delta=float(_field(grid, "delta")),
        epsilon=float(_field(grid, "epsilon_total")),
        mean=float(_field(grid, "mean_trials", None) or trials),
        shape=shape,
        eval_sigma=eval_sigma,
        eval_releases=eval_releases,
    )


def sweep_epsilon(grids: Iterable[Any]) -> SweepEpsilon:
    """The epsilon of releasing ALL the grids of a sweep on one dataset, composed tightly.

    ``compose`` and ``basic`` grids are K*T subsampled-Gaussian steps each (however their
    budget was split): all of them are composed heterogeneously by dp_accounting's PLD
    (pessimistic discretisation) and verified by the PRV accountant's heterogeneous
    composition. When a grid is a ``papernot-steinke`` random search, everything is composed
    in RDP instead (dp_accounting's RdpAccountant with RepeatAndSelect events), verified by
    this module's independent RDP. The result is the smaller of that and the plain sum of the
    grids' epsilons (always valid), at delta = the sum of the grids' deltas.

    A grid with DP evaluation (``eval_noise_multiplier`` sigma_e and ``eval_releases`` E per
    trial) also releases K*E Gaussians of multiplier sigma_e (one of sigma_e / sqrt(K*E));
    in a random search they belong to each run, inside its RepeatAndSelect.

    Args:
        grids: :class:`sweeper.privacy.grids.GridPlan` objects, or their ``to_dict()`` (stored
            plans): accounting, trials, steps_per_trial, sample_rate, noise_multiplier,
            delta, epsilon_total, and for random search distribution_shape (a number, or
            "inf" for Poisson) and optionally mean_trials (default: ``trials``); with DP
            evaluation eval_noise_multiplier and eval_releases (absent, None or 0: none).

    Raises:
        PrivacyError: the tight composition disagrees with the independent one beyond their
            error bars (fail closed: one of the two accountants is wrong), or a grid cannot
            be accounted.
    """
    gs = [_grid(g) for g in grids]
    if not gs:
        raise ConfigError("a sweep needs at least one grid", field="plan")
    delta = math.fsum(g.delta for g in gs)
    if not delta < 1:
        raise PrivacyError(f"the grids' deltas sum to {delta:g}: no guarantee remains")
    summed = math.fsum(g.epsilon for g in gs)
    if any(g.accounting == "papernot-steinke" for g in gs):
        tight = _rdp_sweep(gs, delta)
        bounds = _independent_rdp_sweep(gs, delta)
        method = "rdp composition"
        # Both are RDP bounds of the same events. Ours optimises over a superset of
        # dp_accounting's orders with exact moments, so theirs may be higher (it over-states
        # fractional orders near 1), never lower beyond the order-grid tolerance.
        disagree = not tight >= bounds.lower
    else:
        tight = _pld_sweep(gs, delta)
        mechanisms = [(g.sigma, g.q, g.trials * g.steps) for g in gs]
        evals = [m for m in (g.eval_mechanism() for g in gs) if m is not None]
        bounds = prv_compose_epsilon(
            mechanisms + evals, target_delta=delta, eps_error=prv_error(tight)
        )
        method = "pld composition"
        # PLD (pessimistic) is an upper bound: below PRV's lower bound it under-states; far
        # above PRV's upper bound it is not the composition we think it is. (_pld_sweep
        # composes each grid's evaluations as one Gaussian: one more discretised loss each.)
        steps = sum(g.trials * g.steps for g in gs) + len(evals)
        slack = pld_overstatement(epsilon=bounds.upper, steps=steps)
        disagree = not bounds.lower <= tight <= bounds.upper + slack
    if disagree:
        raise PrivacyError(
            f"sweep composition: dp_accounting's {method} gives epsilon {tight:.4f} but "
            f"{bounds.accountant} gives {bounds.estimate:.4f} (bounds {bounds.lower:.4f} to "
            f"{bounds.upper:.4f}) at delta {delta:.3g}; the two accountants disagree beyond "
            "their error bars, so the sweep's epsilon is not trusted"
        )
    if summed <= tight:
        method = "sum of grid epsilons"
    return SweepEpsilon(
        epsilon=min(tight, summed),
        delta=delta,
        method=method,
        tight=tight,
        summed=summed,
        verifier=bounds.accountant,
        verifier_bounds=bounds,
    )


def _pld_sweep(gs: Sequence[_Grid], delta: float) -> float:
    mechanisms: list[tuple[float, float | None, int]] = []
    for g in gs:
        mechanisms.append((g.sigma, g.q, g.trials * g.steps))
        ev = g.eval_mechanism()
        if ev is not None:
            # K*E Gaussians of multiplier sigma_e are one of sigma_e / sqrt(K*E) (exact).
            mechanisms.append((ev[0] / math.sqrt(ev[2]), None, 1))
    total = composed_pld(mechanisms, value_discretization_interval=PLD_DISCRETIZATION)
    if total is None:
        return math.inf
    return float(total.get_epsilon_for_delta(delta))


def _rdp_sweep(gs: Sequence[_Grid], delta: float) -> float:
    # deferred: dp_accounting takes ~0.3 s to import; loaded when an RDP sweep is composed
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant  # deferred: as above

    acc = rdp_privacy_accountant.RdpAccountant()
    for g in gs:
        step = dp_event.PoissonSampledDpEvent(g.q, dp_event.GaussianDpEvent(g.sigma))
        if g.accounting == "papernot-steinke":
            run: Any = dp_event.SelfComposedDpEvent(step, g.steps)
            if g.eval_sigma is not None:
                # One run: its steps and its E evaluations (one Gaussian of sigma_e/sqrt(E)).
                ev = dp_event.GaussianDpEvent(g.eval_sigma / math.sqrt(g.eval_releases))
                run = dp_event.ComposedDpEvent([run, ev])
            acc.compose(dp_event.RepeatAndSelectDpEvent(run, g.mean, g.shape))
        else:
            acc.compose(step, g.trials * g.steps)
            ev_all = g.eval_mechanism()
            if ev_all is not None:
                acc.compose(dp_event.GaussianDpEvent(ev_all[0] / math.sqrt(ev_all[2])))
    return float(acc.get_epsilon(delta))


def _independent_rdp_sweep(gs: Sequence[_Grid], delta: float) -> EpsilonBounds:
    total = np.zeros(len(RDP_ORDERS))
    for g in gs:
        if g.accounting == "papernot-steinke":
            total += np.asarray(
                _ps_rdp(g.sigma, g.q, g.steps, g.mean, g.shape, g.eval_sigma, g.eval_releases)
            )
        else:
            total += subsampled_gaussian_rdp(
                noise_multiplier=g.sigma, sample_rate=g.q, steps=g.trials * g.steps
            )
            ev = g.eval_mechanism()
            if ev is not None:
                total += gaussian_rdp(noise_multiplier=ev[0], releases=ev[2])
    eps = rdp_to_epsilon(RDP_ORDERS, total, target_delta=delta)
    return EpsilonBounds(eps * (1 - RDP_AGREEMENT), eps, eps * (1 + RDP_AGREEMENT), RDP_SOURCE)
