"""Temporary re-exports (issue 21): the API's reads moved to :mod:`sweeper.sweeps`.

Cursors in :mod:`sweeper.sweeps.cursors`, sweep pages in :mod:`sweeper.sweeps.sweep_pages`,
trial pages in :mod:`sweeper.sweeps.trial_pages`, one trial in
:mod:`sweeper.sweeps.trial_detail`.
"""

from __future__ import annotations

from dpsweep.errors import SweepNotFound, TrialNotFound  # noqa: F401
from sweeper.sweeps.cursors import Page, decode_cursor, encode_cursor  # noqa: F401
from sweeper.sweeps.sweep_pages import (  # noqa: F401
    SweepHead,
    check_sweep,
    page_sweeps,
    sweep_head,
    sweep_item,
)
from sweeper.sweeps.trial_detail import metric_history, trial_detail  # noqa: F401
from sweeper.sweeps.trial_pages import SORTS, page_trials  # noqa: F401
