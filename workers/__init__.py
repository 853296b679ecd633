"""dpsweep workers: everything that touches tensors.

Datasets, models, per-sample gradients, clipping strategies, noise, metrics and the training
loop. This package never touches the database and imports nothing from ``sweeper`` or ``api``.
Heavy modules (torch) are imported by the submodules, not here, so that ``import workers`` is
cheap for the light client install.
"""

from __future__ import annotations

from dpsweep.errors import ConfigError, DatasetError, DpsweepError, PrivacyError, TrainingError

__all__ = ["ConfigError", "DatasetError", "DpsweepError", "PrivacyError", "TrainingError"]
