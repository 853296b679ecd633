"""The input transform a trainer applied, and whether it may leave with a kept model.

:func:`workers.datasets.scaling._normalise` scales every numeric input as

    ``clip((clip(x, bounds) - centre) / scale, clip)`` in float64, then casts to float32,

with ``bounds`` only when the data owner declared them. A kept model was trained on those
scaled inputs, so it scores its card's accuracy on raw records only if the same transform is
applied first. :class:`InputTransform` holds it; :func:`transform_tensors` writes it as the
tensors a kept model's safetensors file carries beside the weights
(:func:`workers.checkpoints.weights_bytes`), which :func:`workers.checkpoints.build_trained`
applies in front of the network (and the ONNX export with it).

**Privacy: which transforms may be exported.** The constants become part of a released file,
so they must be public or declared values, never statistics of private records:

* ``declared``: the data owner's ``input_bounds`` (a declaration, not a statistic);
* ``pixel``: the file format's pixel maximum (255 for uint8, 16 for digits);
* ``public-robust`` in eval mode ``public``: order statistics of the public evaluation
  dataset, a separate dataset its owner declared public; no private record enters them.

They are exported. ``public-robust`` in eval mode ``carve-out`` is **not**: its medians and
IQRs are exact feature values of individual carve-out records, and which records form the
carve-out is a seeded, stratified shuffle of *all* records, so a neighbouring dataset (one
private training record relabelled, added or removed) gives other values. The carve-out is
released only through metrics and the choice of checkpoint; its records' values are not, so
such a model is kept without its transform and its card says why and how to get one
(declare ``dataset.input_bounds``, or evaluate on a public dataset). Token ids need no
transform. ``tests/workers/datasets/test_input_transform.py`` runs each method on
neighbouring datasets and compares the exported bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: The prefix of the transform's tensors in a kept model's safetensors file.
PREFIX = "dpsweep_input_transform."

NOT_EXPORTABLE = (
    "the inputs were scaled by the median and IQR of the evaluation carve-out, a part of "
    "the private dataset: those numbers are values of individual records (outside epsilon), "
    "so they are not written into the model file, which therefore takes inputs scaled as the "
    "trainer scaled them, not raw records. For a model that takes raw records, declare "
    "dataset.input_bounds (the range of every raw value) or evaluate on a public dataset "
    "(eval: {dataset: NAME})"
)


@dataclass(frozen=True)
class InputTransform:
    """``clip((clip(x, bounds) - centre) / scale, clip)`` over each record's flat features.

    Attributes:
        method: ``declared``, ``pixel`` or ``public-robust`` (``input_scaling["method"]``).
        centre: float64, one value for all features or one per flat feature.
        scale: float64, the same shape as ``centre``; every value finite and > 0.
        clip: the output range.
        bounds: the declared raw range (applied first), or None.
        exportable: whether the constants may be written into a released file (module
            docstring); when False, ``reason`` says why and how to get one that is.
        reason: why it is not exportable ("" when it is).
    """

    method: str
    centre: np.ndarray
    scale: np.ndarray
    clip: tuple[float, float]
    bounds: tuple[float, float] | None
    exportable: bool
    reason: str = ""

    @classmethod
    def of(
        cls,
        method: str,
        centre: Any,
        scale: Any,
        clip: tuple[float, float],
        bounds: tuple[float, float] | None,
        *,
        exportable: bool,
    ) -> InputTransform:
        """The transform with ``centre`` and ``scale`` as flat float64 arrays."""
        return cls(
            method=method,
            centre=np.asarray(centre, dtype=np.float64).reshape(-1).copy(),
            scale=np.asarray(scale, dtype=np.float64).reshape(-1).copy(),
            clip=(float(clip[0]), float(clip[1])),
            bounds=None if bounds is None else (float(bounds[0]), float(bounds[1])),
            exportable=exportable,
            reason="" if exportable else NOT_EXPORTABLE,
        )


def transform_tensors(transform: InputTransform | None) -> dict[str, np.ndarray]:
    """The tensors a kept model's file carries for ``transform``: none when there is no
    transform (token ids) or it may not be exported (module docstring): fail closed."""
    if transform is None or not transform.exportable:
        return {}
    tensors = {
        PREFIX + "centre": transform.centre,
        PREFIX + "scale": transform.scale,
        PREFIX + "clip": np.asarray(transform.clip, dtype=np.float64),
    }
    if transform.bounds is not None:
        tensors[PREFIX + "bounds"] = np.asarray(transform.bounds, dtype=np.float64)
    return {k: np.ascontiguousarray(v, dtype=np.float64) for k, v in tensors.items()}


def describe(transform: InputTransform | None, kind: str) -> dict[str, Any]:
    """What a model card says of the transform: whether the model file holds it (so the
    model takes raw records), and if not, why. Names and formulas only, never a value."""
    if transform is None and kind != "tokens":
        return {
            "in_model_file": False,
            "raw_inputs": False,
            "reason": "the data was scaled without a recorded transform",
        }
    if transform is None:
        return {
            "in_model_file": False,
            "raw_inputs": True,
            "reason": "token ids are the model's input as they are; nothing is scaled",
        }
    if not transform.exportable:
        return {"in_model_file": False, "raw_inputs": False, "reason": transform.reason}
    formula = "clip((x - centre) / scale, clip)"
    if transform.bounds is not None:
        formula = "clip((clip(x, bounds) - centre) / scale, clip)"
    return {
        "in_model_file": True,
        "raw_inputs": True,
        "method": transform.method,
        "applies": f"{formula} in float64 over each record's flattened features, then float32",
        "tensors": sorted(transform_tensors(transform)),
    }


__all__ = ["PREFIX", "InputTransform", "describe", "transform_tensors"]
