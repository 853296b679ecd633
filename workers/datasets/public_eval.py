"""Mode ``public``'s evaluation records: another dataset, declared public, checked to be the
model's input as the training records are (:func:`_public_eval_records`).

Its records are public (no epsilon covers them); the training records are not, so messages
never name a training label or class.
"""

from __future__ import annotations

import numpy as np

from dpsweep.errors import ConfigError, DatasetError
from workers.datasets.finite import _check_finite
from workers.datasets.identity import _canonical_labels
from workers.datasets.records import DatasetSpec, RawData
from workers.datasets.registry import DATASETS, dataset_names, has_loader


def _with_channel_axis(kind: str, x: np.ndarray) -> np.ndarray:
    """Images of one channel stored as ``[N, H, W]`` as ``[N, 1, H, W]``; others as they are."""
    if kind == "image" and x.ndim == 3:
        return x[:, None, :, :]  # add the channel axis
    return x


def _public_eval_records(
    eval_spec: DatasetSpec,
    raw: RawData,
    x: np.ndarray,
    index: dict[bytes, int],
    n_classes: int,
    *,
    bounds: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Mode ``public``: the records of the public evaluation dataset, with channel axis, and
    their labels as indices into the training classes (``index``: canonical label to class
    index; the declared list's when the training dataset declares one, so the evaluation
    encoding is the training encoding).

    Its kind and input shape must be the training data's (both are public: the model's input),
    and so must its pixel format unless ``bounds`` (declared ``input_bounds``) scale both.
    Messages never name a training label or class: those are the private data's.

    Raises:
        ConfigError: an unknown loader, or another kind, input shape or pixel format.
        DatasetError: a missing or malformed file, NaN / inf, no records, or labels that are
            not training classes.
    """
    pub, where = _read_public_eval(eval_spec)
    x_pub = _with_channel_axis(pub.kind, pub.x)
    _check_same_input(pub, raw, x_pub, x, bounds=bounds)
    return x_pub, _public_eval_labels(pub, index, n_classes, where)


def _read_public_eval(eval_spec: DatasetSpec) -> tuple[RawData, str]:
    """The public evaluation dataset's records, checked finite and not empty, and where they
    are (for messages).

    Raises:
        ConfigError: an unknown loader.
        DatasetError: a missing or malformed file, NaN / inf, or no records.
    """
    if not has_loader(eval_spec.name):
        raise ConfigError(
            f"unknown loader {eval_spec.name!r} for the evaluation dataset; choose one of: "
            f"{', '.join(dataset_names())}",
            field="eval.dataset",
        )
    where = eval_spec.path or f"built-in dataset {eval_spec.name!r}"
    pub = DATASETS[eval_spec.name](eval_spec)
    _check_finite(pub, eval_spec)
    if len(pub.x) < 1:
        raise DatasetError(f"evaluation dataset {where}: no records")
    return pub, where


def _check_same_input(
    pub: RawData, raw: RawData, x_pub: np.ndarray, x: np.ndarray, *, bounds: bool
) -> None:
    """The evaluation records are the model's input as the training records are: same kind,
    tokenization, input shape, and pixel format unless declared ``bounds`` scale both.

    Raises:
        ConfigError: another kind, tokenization, input shape or pixel format.
    """
    if pub.kind != raw.kind:
        raise ConfigError(
            f"the evaluation dataset holds {pub.kind} records but the training dataset "
            f"{raw.kind} records; evaluate on a dataset of the same kind",
            field="eval.dataset",
        )
    if raw.kind == "tokens" and (pub.encoding != raw.encoding or pub.vocab_size != raw.vocab_size):
        # Ids mean words only under one tokenizer: another one's ids would be other words.
        raise ConfigError(
            "the evaluation dataset is tokenized with another tokenizer, vocabulary or "
            "max_length than the training dataset; tokenize both with the same options",
            field="eval.dataset",
        )
    if x_pub.shape[1:] != x.shape[1:]:
        raise ConfigError(
            f"the evaluation dataset's records have input shape {tuple(x_pub.shape[1:])} but "
            f"the training dataset's {tuple(x.shape[1:])}; evaluate on records of the same "
            "shape (the model's input)",
            field="eval.dataset",
        )
    if raw.kind == "image" and not bounds and pub.pixel_max != raw.pixel_max:
        # Both splits are scaled by one rule chosen from the training data's format: a pixel
        # constant that is not the evaluation data's would scale its records wrongly (declared
        # bounds apply to both alike).
        def fmt(p: float | None) -> str:
            return "no known pixel range" if p is None else f"pixel maximum {p:g}"

        raise ConfigError(
            f"the evaluation dataset's pixel format ({fmt(pub.pixel_max)}) is not the "
            f"training dataset's ({fmt(raw.pixel_max)}); store both in the same format (e.g. "
            "uint8), or declare dataset.input_bounds",
            field="eval.dataset",
        )


def _public_eval_labels(
    pub: RawData, index: dict[bytes, int], n_classes: int, where: str
) -> np.ndarray:
    """The evaluation records' labels as training class indices.

    Raises:
        DatasetError: labels that are not training classes (naming neither).
    """
    # Labels agree across formats as they do for the identity: 1, 1.0 and "1" are one class.
    mapped = [index.get(c, -1) for c in _canonical_labels(pub.y)]
    y_pub = np.asarray(mapped, dtype=np.int64)
    unknown = int(np.count_nonzero(y_pub < 0))
    if unknown:
        # Neither the training classes nor the offending labels are named: which labels are
        # missing from the training data would say which classes it has.
        raise DatasetError(
            f"evaluation dataset {where}: {unknown} of its {len(y_pub)} records have a label "
            f"that is not one of the training dataset's {n_classes} classes; label the "
            "evaluation records with the training dataset's label values (same spelling), or "
            "drop records of other classes"
        )
    return y_pub
