"""Temporary re-exports (issue 21): the scheduler lives in :mod:`sweeper.driver.scheduler`.

``python -m sweeper.scheduler`` (what ``dpsweep serve`` starts) still runs it.
"""

from __future__ import annotations

from sweeper.driver.scheduler import Scheduler, live_schedulers, main  # noqa: F401

if __name__ == "__main__":
    raise SystemExit(main())
