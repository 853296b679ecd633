"""Privacy accounting for DP-SGD runs: epsilon from the noise actually used, and calibration.

The package, by concept (no module imports this face, so there is no cycle):

* :mod:`~workers.accounting.registry`: the accountant registry (``pld``, ``dp-rdp``,
  ``opacus-rdp``, ``opacus-prv``, the rows of :mod:`dpsweep.accountants`, the one table of
  names; and plug-ins of the group ``dpsweep.accountants``), and the readers of legacy names;
* :mod:`~workers.accounting.epsilon`: each built-in accountant's epsilon;
* :mod:`~workers.accounting.calibrator`: the one calibrator every accountant's ``calibrate``
  uses unless it brings its own;
* :mod:`~workers.accounting.compute`: the checked entry points :func:`epsilon_for` and
  :func:`calibrate_for` over a run's :class:`~dpsweep.accounting_inputs.AccountingInputs`
  (and :func:`compute_epsilon`, :func:`calibrate_noise_multiplier`: the same, spelled out);
* :mod:`~workers.accounting.audit`: the independent verifier of the planner's figures (PRV
  accountant, independent RDP, Papernot-Steinke bounds, a sweep's composition); not imported
  here, so that this face costs no numpy.

Libraries are imported lazily, so callers without torch (the sweeper) can import this package.
"""

from __future__ import annotations

from dpsweep.accounting_inputs import AccountingInputs
from workers.accounting.compute import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    calibrate_for,
    calibrate_noise_multiplier,
    compute_epsilon,
    epsilon_for,
)
from workers.accounting.epsilon import (
    PLD_DISCRETIZATION,
    dp_rdp_epsilon,
    opacus_epsilon,
    pld_epsilon,
)
from workers.accounting.registry import (
    BUILTIN_ACCOUNTANTS,
    PLAN_TO_WORKER,
    WORKER_ALIASES,
    AccountantDescriptor,
    EpsilonFn,
    accountant_names,
    get_accountant,
    plan_accountant,
    register_accountant,
    spec_accountant,
    trial_accountant_for_plan,
    worker_accountant,
)

__all__ = [
    "ACCOUNTANTS",
    "BUILTIN_ACCOUNTANTS",
    "DEFAULT_ACCOUNTANT",
    "PLAN_TO_WORKER",
    "PLD_DISCRETIZATION",
    "WORKER_ALIASES",
    "AccountantDescriptor",
    "AccountingInputs",
    "EpsilonFn",
    "accountant_names",
    "calibrate_for",
    "calibrate_noise_multiplier",
    "compute_epsilon",
    "dp_rdp_epsilon",
    "epsilon_for",
    "get_accountant",
    "opacus_epsilon",
    "plan_accountant",
    "pld_epsilon",
    "register_accountant",
    "spec_accountant",
    "trial_accountant_for_plan",
    "worker_accountant",
]
