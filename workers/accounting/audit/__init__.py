"""A second, independent privacy accountant that audits the planner's figures (torch-free).

The planner calibrates with dp_accounting (PLD, or RDP for ``accountant: rdp`` and for
Papernot-Steinke random search). Recomputing with the same library on a finer grid cannot
catch a bug in that library or in how we call it, so this package answers the same questions
with code that shares nothing with it:

* :func:`prv_epsilon` (:mod:`~workers.accounting.audit.prv`): Gopi, Lee & Wutschitz (2021)'s
  PRV accountant (Microsoft's ``prv-accountant`` package), which returns lower and upper
  bounds around its estimate. It verifies ``compose`` and ``basic`` grids and heterogeneous
  compositions. One numerical step of the library is corrected there (see
  :func:`workers.accounting.audit.prv._prv_bounds`): as released, it over-states epsilon by
  several percent, or fails, at sample rates of about 0.1-0.2.
* :func:`subsampled_gaussian_rdp` (:mod:`~workers.accounting.audit.rdp`): the Rényi-DP curve
  of the Poisson-subsampled Gaussian, integrated numerically from its definition (no
  dp_accounting, no Opacus, no TF Privacy series), on a dense grid of fractional and integer
  orders.
* :func:`repeat_and_select_rdp` / :func:`papernot_steinke_epsilon`
  (:mod:`~workers.accounting.audit.papernot_steinke`): Papernot & Steinke (ICLR 2022)'s
  Theorems 2 and 6 for random search with a random number of trials, applied to that curve,
  then converted to (epsilon, delta) with Canonne, Kamath & Steinke (2020)'s improved
  conversion.
* :func:`sweep_epsilon` (:mod:`~workers.accounting.audit.sweep`): the epsilon of releasing
  every grid of a sweep on one dataset, composed tightly rather than summed, with the tight
  figure verified independently.

DP evaluation (``eval: {mode: dp}``) adds E Gaussian releases per trial (sensitivity 1,
multiplier sigma_e, no subsampling): the PRV accountant takes them as ``(sigma_e, 1.0, n)``
(a plain Gaussian PRV, see :func:`workers.accounting.audit.prv._prv`), the independent RDP
adds their exact curve ``n * alpha / (2 sigma_e^2)`` (:func:`gaussian_rdp`).

Libraries are imported lazily; importing this package costs numpy only.
"""

from __future__ import annotations

from workers.accounting.audit.bounds import EpsilonBounds
from workers.accounting.audit.papernot_steinke import (
    RDP_AGREEMENT,
    RDP_SOURCE,
    papernot_steinke_bounds,
    papernot_steinke_epsilon,
    repeat_and_select_rdp,
    truncated_negative_binomial_gamma,
    truncated_negative_binomial_mean,
)
from workers.accounting.audit.prv import (
    PLD_STATED_ERROR,
    PRV_CITATION,
    PRV_DELTA_ERROR,
    PRV_MIN_ERROR,
    PRV_RELATIVE_ERROR,
    pld_overstatement,
    prv_accountant_name,
    prv_compose_epsilon,
    prv_epsilon,
    prv_error,
)
from workers.accounting.audit.rdp import (
    RDP_ORDERS,
    Curve,
    gaussian_rdp,
    rdp_to_delta,
    rdp_to_epsilon,
    subsampled_gaussian_rdp,
)
from workers.accounting.audit.sweep import SweepEpsilon, sweep_epsilon

__all__ = [
    "PLD_STATED_ERROR",
    "PRV_CITATION",
    "PRV_DELTA_ERROR",
    "PRV_MIN_ERROR",
    "PRV_RELATIVE_ERROR",
    "RDP_AGREEMENT",
    "RDP_ORDERS",
    "RDP_SOURCE",
    "Curve",
    "EpsilonBounds",
    "SweepEpsilon",
    "gaussian_rdp",
    "papernot_steinke_bounds",
    "papernot_steinke_epsilon",
    "pld_overstatement",
    "prv_accountant_name",
    "prv_compose_epsilon",
    "prv_epsilon",
    "prv_error",
    "rdp_to_delta",
    "rdp_to_epsilon",
    "repeat_and_select_rdp",
    "subsampled_gaussian_rdp",
    "sweep_epsilon",
    "truncated_negative_binomial_gamma",
    "truncated_negative_binomial_mean",
]
