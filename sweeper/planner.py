"""Temporary re-exports (issue 21): the planner now lives in :mod:`sweeper.privacy`."""

from __future__ import annotations

from sweeper.privacy.calibration import calibrate  # noqa: F401
from sweeper.privacy.grids import GridPlan, GridRequest, InfeasiblePlan  # noqa: F401
from sweeper.privacy.noise_split import gradient_noise_multiplier  # noqa: F401
from sweeper.privacy.papernot_steinke import repeat_and_select_epsilon  # noqa: F401
from sweeper.privacy.planner import (  # noqa: F401
    SweepPlan,
    _plan_accountant_name,
    grid_requests,
    plan_grid,
    plan_sweep,
)
from sweeper.privacy.verification import verify_plan  # noqa: F401
