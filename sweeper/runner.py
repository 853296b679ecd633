"""Temporary re-exports (issue 21): the sweep driver lives in :mod:`sweeper.driver`."""

from __future__ import annotations

from sweeper.driver.loop import SweepRunner, run_sweep  # noqa: F401
from sweeper.driver.progress import RunOutcome, Snapshot, format_elapsed  # noqa: F401
from sweeper.driver.ray_backend import gpu_request, ray_session  # noqa: F401
