"""Temporary re-exports (issue 21): the accountant registry moved to workers.accounting.registry."""

from __future__ import annotations

from workers.accounting.registry import (  # noqa: F401
    FIELD,
    PLAN_ALIASES,
    PLAN_TO_WORKER,
    SPEC_ALIASES,
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
