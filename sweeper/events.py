"""Temporary re-exports (issue 21): the sweep event log moved to :mod:`sweeper.sweeps.events`.

Kept as a module so that ``from sweeper import events`` (then ``events.emit``,
``events.TRIAL``, ...) keeps working; its users become
``from sweeper.sweeps import events``.
"""

from __future__ import annotations

from sweeper.sweeps.events import (  # noqa: F401
    METRIC,
    SWEEP,
    TRIAL,
    Event,
    emit,
    lock_sweep,
    read_events,
    trial_event,
)
