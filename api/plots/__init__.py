"""Pareto-front plots for the CLI and reports.

Two figures summarise a sweep:

* the privacy/utility front: per-grid ε budget (x, lower is better) against the best mean
  objective of each arm at that level (y), one series per arm, with seed error bars;
* the calibration front: every finished trial's objective (x) against its expected calibration
  error (y, lower is better), coloured by arm.

On both, the non-dominated points are overlaid by one scatter artist whose ``gid`` is
:data:`PARETO_GID` and joined by a step line whose ``gid`` is :data:`PARETO_STEP_GID`, so
callers and tests can find them on the returned figure.

Matplotlib is imported lazily inside the functions (the light client install does not need it)
and only through :class:`matplotlib.figure.Figure` with an Agg canvas: no ``pyplot``, no global
figure manager, no interactive backend, so the functions are safe to call from worker threads.
"""

from __future__ import annotations

from api.plots.drawing import (
    DOMINATED_LEGEND,
    NO_TRIALS_TEXT,
    PARETO_GID,
    PARETO_LEGEND,
    PARETO_STEP_GID,
)
from api.plots.figures import calibration_front_figure, epsilon_front_figure
from api.plots.files import FORMATS, pareto_figures, save_figure, write_pareto_plots

__all__ = [
    "DOMINATED_LEGEND",
    "FORMATS",
    "NO_TRIALS_TEXT",
    "PARETO_GID",
    "PARETO_LEGEND",
    "PARETO_STEP_GID",
    "calibration_front_figure",
    "epsilon_front_figure",
    "pareto_figures",
    "save_figure",
    "write_pareto_plots",
]
