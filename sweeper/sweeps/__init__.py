"""Sweeps in the store: create, end, results, export, and the API's reads.

The database is the single source of truth for a sweep's state; the runner, the CLI and the
API all go through these modules. Nothing here imports torch.

* :mod:`~sweeper.sweeps.stored`: a stored sweep (typed spec, grids, terminal states, loading);
* :mod:`~sweeper.sweeps.checks`: submission checks against the strategies' descriptors;
* :mod:`~sweeper.sweeps.search`: which hyperparameters each trial of a grid runs;
* :mod:`~sweeper.sweeps.create`: plan, store and reserve a sweep;
* :mod:`~sweeper.sweeps.lifecycle`: cancel, fail, find one to resume;
* :mod:`~sweeper.sweeps.events`: the sweep's event log (live streams);
* :mod:`~sweeper.sweeps.released`: what may be released (papernot-steinke secrecy);
* :mod:`~sweeper.sweeps.results`: best per arm and level, Pareto fronts (pure);
* :mod:`~sweeper.sweeps.summary` and :mod:`~sweeper.sweeps.export`: what users are shown;
* :mod:`~sweeper.sweeps.cursors`, :mod:`~sweeper.sweeps.sweep_pages`,
  :mod:`~sweeper.sweeps.trial_pages`, :mod:`~sweeper.sweeps.trial_detail`: the API's reads.
"""

from __future__ import annotations

# Temporary re-exports (issue 21): the names other files import from `sweeper.sweeps`, which
# was one module; each line names the module where they live now.
from dpsweep.errors import IllegalState, SweepNotFound  # noqa: F401
from sweeper.sweeps.checks import _check_arms, check_spec  # noqa: F401
from sweeper.sweeps.create import (  # noqa: F401
    PreparedSweep,
    _arm_trials,
    create_sweep,
    dataset_key,
    prepare_sweep,
    spec_hash,
)
from sweeper.sweeps.export import export_sweep  # noqa: F401
from sweeper.sweeps.lifecycle import (  # noqa: F401
    PS_CANCEL_NOTE,
    cancel_sweep,
    fail_sweep,
    find_resumable,
)
from sweeper.sweeps.released import (  # noqa: F401
    released_records,
    search_completed,
    selected_trial,
    trial_record,
)
from sweeper.sweeps.search import draw_run_count  # noqa: F401
from sweeper.sweeps.stored import (  # noqa: F401
    TERMINAL_SWEEPS,
    TERMINAL_TRIALS,
    get_sweep,
    grid_key,
    hidden_grids,
    load_sweep,
    randomness_fields,
    schedules,
)
from sweeper.sweeps.summary import (  # noqa: F401
    SweepResults,
    list_sweeps,
    summarize,
    sweep_results,
)
