"""Temporary re-exports (issue 21): the independent verifier moved to workers.accounting.audit.

Callers that monkeypatch a name of this module (``tests/test_planner.py`` patches
``prv_epsilon``) reach the code that reads it only while that code also reads it from here
(``sweeper/planner.py`` does); once rewritten, patch the module where the name lives.
"""

from __future__ import annotations

from workers.accounting.audit.bounds import EpsilonBounds  # noqa: F401
from workers.accounting.audit.papernot_steinke import (  # noqa: F401
    RDP_AGREEMENT,
    RDP_SOURCE,
    papernot_steinke_bounds,
    papernot_steinke_epsilon,
    repeat_and_select_rdp,
    truncated_negative_binomial_gamma,
    truncated_negative_binomial_mean,
)
from workers.accounting.audit.prv import (  # noqa: F401
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
from workers.accounting.audit.rdp import (  # noqa: F401
    RDP_ORDERS,
    Curve,
    gaussian_rdp,
    rdp_to_delta,
    rdp_to_epsilon,
    subsampled_gaussian_rdp,
)
from workers.accounting.audit.sweep import SweepEpsilon, sweep_epsilon  # noqa: F401
