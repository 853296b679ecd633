"""Measuring a pack's trials on the evaluation split: exact metrics, or DP noisy accuracy
(a noisy count of correct predictions; with a privacy unit, of units' mean correctness)."""

from __future__ import annotations

import math
from typing import Any

import torch

from dpsweep.errors import ConfigError, PrivacyError
from workers.datasets.records import Dataset
from workers.metrics import classification_metrics, reconstruction_metrics
from workers.packed.model import PackedModel
from workers.randomness import NoiseSource, add_snapped_noise
from workers.training.specs import PackSpec

# Size of the evaluation-split batch on which clipping diagnostics are measured.
DIAGNOSTIC_BATCH = 512


@torch.no_grad()
def _evaluate(
    model: PackedModel, x: torch.Tensor, y: torch.Tensor, task: str, chunk: int = 2048
) -> list[dict[str, Any]]:
    outs = []
    for start in range(0, x.shape[0], chunk):
        xb = x[start : start + chunk]
        xk = xb.unsqueeze(0).expand(model.k, *xb.shape)
        out, _ = model.forward(xk)
        outs.append(out)
    full = torch.cat(outs, dim=1)
    if task == "classification":
        return classification_metrics(full, y)
    return reconstruction_metrics(full, x)


def _dp_evaluation(spec: PackSpec, data: Dataset, task: str) -> bool:
    """Whether this pack evaluates with noisy counts; refuses inconsistent settings.

    Raises:
        PrivacyError: private evaluation records without planned noise (fail closed); with a
            privacy unit, evaluation rows without their unit.
        ConfigError: noise planned for public evaluation records, or DP evaluation of a model
            whose objective is not a count (reconstruction).
    """
    private_eval = getattr(data, "evaluation", "carve-out") == "dp"
    if private_eval and spec.eval_noise_multiplier is None:
        raise PrivacyError(
            "the evaluation records are private (eval mode dp) but no evaluation noise was "
            "planned; nothing was trained"
        )
    if spec.eval_noise_multiplier is not None and not private_eval:
        raise ConfigError(
            "an evaluation noise multiplier was given for public evaluation records; DP "
            "evaluation needs eval mode dp",
            field="eval.mode",
        )
    if private_eval and task != "classification":
        raise ConfigError(
            "DP evaluation releases noisy counts of correct predictions, so it needs a "
            "classification model; for reconstruction use eval mode carve-out or public",
            field="eval.mode",
        )
    if private_eval and data.has_units:
        _check_eval_units(data)
    sigma_e = spec.eval_noise_multiplier
    if sigma_e is not None and not (sigma_e > 0 and math.isfinite(sigma_e)):
        raise PrivacyError(f"evaluation noise multiplier {sigma_e} gives no privacy guarantee")
    return private_eval


def _check_eval_units(data: Dataset) -> None:
    """DP evaluation of records with a privacy unit: every evaluation row has its unit (the
    measurement, :mod:`workers.training.measure`, counts by it).

    Raises:
        PrivacyError: a row without its unit.
    """
    units = data.units_test
    if units is None or units.shape != (int(data.x_test.shape[0]),):
        raise PrivacyError(
            "the evaluation records have a privacy unit but not each row's unit; DP "
            "evaluation cannot count by unit, and nothing was trained"
        )


@torch.no_grad()
def _noisy_accuracy(
    model: PackedModel,
    x: torch.Tensor,
    y: torch.Tensor,
    noise: NoiseSource,
    *,
    noise_multiplier: float,
    n_records: int | None = None,
    units: torch.Tensor | None = None,
    chunk: int = 2048,
) -> list[dict[str, Any]]:
    """DP evaluation: each trial's accuracy from a noisy count of correct predictions.

    The count has sensitivity 1 (adding or removing one evaluation record changes it by at
    most 1, whatever the record holds); Gaussian noise of std ``noise_multiplier`` is added
    and snapped like every other release (:func:`workers.randomness.add_snapped_noise`).
    The noisy count is divided by ``n_records``: a public number (a stored dataset's
    declared size, :attr:`workers.datasets.Dataset.planning_n_eval`), never the private
    count of evaluation records unless no size was declared (local use; ``None``).
    Only the accuracy is released: no loss, calibration or per-bin counts.

    With a privacy unit (``units``: each evaluation row's dense unit id, ``0 .. U - 1``) the
    count is over units: each unit adds the mean of its rows' correctness, a value in
    [0, 1], so adding or removing one unit (all its rows) still moves it by at most 1, and
    ``n_records`` is the units' number (``planning_n_eval`` is in units; ``None``: ``U``).
    """
    if units is None:
        correct = _correct_counts(model, x, y, chunk)
        n = float(x.shape[0] if n_records is None else n_records)
    else:
        correct, n_units = _correct_unit_means(model, x, y, units, chunk)
        n = float(n_units if n_records is None else n_records)
    buf = correct.unsqueeze(1)
    z = noise.standard_normal(1)
    std = torch.full((model.k,), float(noise_multiplier), dtype=torch.float64, device=x.device)
    add_snapped_noise(buf, z, std)
    return [{"accuracy": min(max(float(buf[i, 0]) / n, 0.0), 1.0)} for i in range(model.k)]


def _correct_rows(model: PackedModel, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    """Whether each trial predicts each row right, ``[k, rows]``. A non-finite logit row
    predicts nothing: argmax of NaN is arbitrary, so it counts as wrong (the weights are a
    DP release; this is post-processing of them)."""
    out, _ = model.forward(xb.unsqueeze(0).expand(model.k, *xb.shape))
    return torch.isfinite(out).all(dim=-1) & (out.argmax(dim=-1) == yb.unsqueeze(0))


def _correct_counts(
    model: PackedModel, x: torch.Tensor, y: torch.Tensor, chunk: int
) -> torch.Tensor:
    """Each trial's number of correct predictions, float64 ``[k]``."""
    correct = torch.zeros(model.k, dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], chunk):
        ok = _correct_rows(model, x[start : start + chunk], y[start : start + chunk])
        correct += ok.sum(dim=1).to(torch.float64)
    return correct


def _correct_unit_means(
    model: PackedModel, x: torch.Tensor, y: torch.Tensor, units: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, int]:
    """Each trial's sum over units of the mean correctness of the unit's rows, float64
    ``[k]`` (each term in [0, 1]: one unit moves the sum by at most 1), and the number of
    units. The per-unit means are private and never leave this function.

    Raises:
        PrivacyError: units that are not one dense id per row (fail closed: a wrong grouping
            could let one unit move the count by more than 1).
    """
    units = units.to(device=x.device, dtype=torch.int64)
    if units.shape != (x.shape[0],) or (units.numel() and int(units.min()) < 0):
        raise PrivacyError("DP evaluation by unit needs one unit id >= 0 per evaluation row")
    n_units = int(units.max()) + 1 if units.numel() else 0
    per_unit = torch.zeros(model.k, n_units, dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], chunk):
        ok = _correct_rows(model, x[start : start + chunk], y[start : start + chunk])
        per_unit.index_add_(1, units[start : start + chunk], ok.to(torch.float64))
    rows = torch.bincount(units, minlength=n_units).to(torch.float64)
    # A unit id without rows (not dense) adds 0, never a division by zero.
    means = per_unit / rows.clamp(min=1.0).unsqueeze(0)
    return means.sum(dim=1), n_units
