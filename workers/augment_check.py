"""The refusals of ``training.augment``, torch-free (the sweep's checks run them in a driver
that never imports torch); the augmentations themselves are in :mod:`workers.augment`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpsweep.errors import ConfigError

FIELD = "training.augment"
#: The augmentations' names: the built-ins, and any :func:`workers.augment.register_augment` adds.
AUGMENT_NAMES: set[str] = {"crop", "flip"}


def augment_ops() -> list[str]:
    """The known augmentations' names."""
    return sorted(AUGMENT_NAMES)


def check_augment(
    augment: Any, *, input_shape: Sequence[int], ascent: bool, audit: bool = False
) -> None:
    """Refuse augmentation where it is not exact (before anything is reserved).

    Args:
        augment: the spec's ``training.augment`` (or None).
        input_shape: one example's shape; augmentation needs images ``[C, H, W]``.
        ascent: the strategy takes a perturbed gradient pass (BAM): its ascent is per copy,
            so the mean over copies would not be the strategy's gradient.
        audit: an audit's gradient canaries have no images to augment.

    Raises:
        ConfigError: naming ``training.augment``.
    """
    if augment is None:
        return
    if len(tuple(input_shape)) != 3:
        raise ConfigError(
            "augmentation multiplicity needs image data (examples shaped [C, H, W]); "
            f"this dataset's examples are shaped {list(input_shape)}",
            field=FIELD,
        )
    unknown = [op for op in augment.ops if op not in AUGMENT_NAMES]
    if unknown:
        raise ConfigError(
            f"unknown augmentation {unknown[0]!r}; known: {', '.join(augment_ops())}",
            field=FIELD,
        )
    if ascent:
        raise ConfigError(
            "augmentation multiplicity is not exact for a strategy with a perturbed "
            "gradient pass (bam): leave training.augment out",
            field=FIELD,
        )
    if audit:
        raise ConfigError(
            "an audit's gradient canaries cannot be augmented: audit without training.augment",
            field=FIELD,
        )


__all__ = ["AUGMENT_NAMES", "FIELD", "augment_ops", "check_augment"]
