"""Temporary re-exports (issue 21): sweep results moved to :mod:`sweeper.sweeps.results`."""

from __future__ import annotations

from sweeper.sweeps.results import (  # noqa: F401
    ArmLevelResult,
    FrontPoint,
    best_per_arm_level,
    calibration_front,
    epsilon_front,
    pareto_mask,
)
