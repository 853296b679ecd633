"""Temporary re-exports (issue 21): charging rules now in :mod:`sweeper.privacy.charges`."""

from __future__ import annotations

from sweeper.privacy.charges import (  # noqa: F401
    EXACT,
    ChargeSchedule,
    charge_schedule,
    exact_sum,
    ps_charge_note,
)
