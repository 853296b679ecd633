"""Temporary re-exports (issue 21): search methods moved to :mod:`sweeper.sweeps.search`."""

from __future__ import annotations

from sweeper.sweeps.search import (  # noqa: F401
    draw_run_count,
    optuna_distributions,
    random_point,
    random_points,
)
