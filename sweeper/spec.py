"""The sweep spec, re-exported from :mod:`dpsweep.spec`.

The models live in the light ``dpsweep`` package so the SDK validates specs with the server's
own models; this module keeps every name importable from where it always was.
"""

from __future__ import annotations

from dpsweep.errors import ConfigError
from dpsweep.spec import *  # noqa: F403
from dpsweep.spec import (
    ACCOUNTING_METHODS,
    DEFAULT_EVAL_EPSILON_SHARE,
    DISTRIBUTIONS,
    EVAL_MODES,
    ArmConfig,
    Axis,
    DatasetConfig,
    EvalConfig,
    ModelConfig,
    ObjectiveConfig,
    PrivacyConfig,
    ResourcesConfig,
    SearchConfig,
    SearchDistribution,
    SweepSpec,
    TrainingConfig,
    load_spec,
    randomness_label,
)

# Private helpers, for modules that used them from here.
from dpsweep.spec import _first_error as _first_error
from dpsweep.spec import _Strict as _Strict

__all__ = [
    "ACCOUNTING_METHODS",
    "DEFAULT_EVAL_EPSILON_SHARE",
    "DISTRIBUTIONS",
    "EVAL_MODES",
    "ArmConfig",
    "Axis",
    "ConfigError",
    "DatasetConfig",
    "EvalConfig",
    "ModelConfig",
    "ObjectiveConfig",
    "PrivacyConfig",
    "ResourcesConfig",
    "SearchConfig",
    "SearchDistribution",
    "SweepSpec",
    "TrainingConfig",
    "load_spec",
    "randomness_label",
]
