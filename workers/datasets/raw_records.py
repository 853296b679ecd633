"""A dataset's evaluation records as they are on disk: the inputs before any scaling.

A kept model whose file carries its input transform takes raw records
(:mod:`workers.datasets.input_transform`); ``dpsweep model --check`` feeds it these, the very
records :func:`workers.datasets.loading.load_dataset` evaluated on, split the same way (by
unit when the dataset declares one).
"""

from __future__ import annotations

import numpy as np

from workers.datasets.loading import (
    _check_settings,
    _encode_labels,
    _training_and_evaluation,
    read_records,
    with_declarations,
)
from workers.datasets.public_eval import _with_channel_axis
from workers.datasets.records import DatasetSpec


def raw_evaluation_inputs(spec: DatasetSpec) -> np.ndarray:
    """The evaluation records' inputs, unscaled, in the order ``load_dataset`` gives them.

    Raises:
        ConfigError, DatasetError: as :func:`workers.datasets.loading.load_dataset`.
    """
    _check_settings(spec)
    spec = with_declarations(spec)
    raw = read_records(spec)
    labels = _encode_labels(raw, spec)
    x = _with_channel_axis(raw.kind, raw.x)
    return np.asarray(_training_and_evaluation(spec, raw, x, labels).x_eval)


__all__ = ["raw_evaluation_inputs"]
