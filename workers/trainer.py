"""Temporary re-exports (issue 21): the trainer now lives in :mod:`workers.training`."""

from __future__ import annotations

from workers.schedule import plan_steps  # noqa: F401
from workers.training.evaluation import (  # noqa: F401
    DIAGNOSTIC_BATCH,
    _dp_evaluation,
    _evaluate,
    _noisy_accuracy,
)
from workers.training.loop import train_pack, train_trial  # noqa: F401
from workers.training.specs import (  # noqa: F401
    PackSpec,
    Progress,
    TrialResult,
    TrialSpec,
    results_to_json,
)
