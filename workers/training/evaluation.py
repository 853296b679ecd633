"""Measuring a pack's trials on the evaluation split: exact metrics, or DP noisy accuracy."""

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
        PrivacyError: private evaluation records without planned noise (fail closed).
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
    sigma_e = spec.eval_noise_multiplier
    if sigma_e is not None and not (sigma_e > 0 and math.isfinite(sigma_e)):
        raise PrivacyError(f"evaluation noise multiplier {sigma_e} gives no privacy guarantee")
    return private_eval


@torch.no_grad()
def _noisy_accuracy(
    model: PackedModel,
    x: torch.Tensor,
    y: torch.Tensor,
    noise: NoiseSource,
    *,
    noise_multiplier: float,
    n_records: int | None = None,
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
    """
    correct = torch.zeros(model.k, dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], chunk):
        xb = x[start : start + chunk]
        out, _ = model.forward(xb.unsqueeze(0).expand(model.k, *xb.shape))
        # A non-finite logit row predicts nothing: argmax of NaN is arbitrary, so count it
        # as wrong (the weights are a DP release; this is post-processing of them).
        yb = y[start : start + chunk].unsqueeze(0)
        ok = torch.isfinite(out).all(dim=-1) & (out.argmax(dim=-1) == yb)
        correct += ok.sum(dim=1).to(torch.float64)
    buf = correct.unsqueeze(1)
    z = noise.standard_normal(1)
    std = torch.full((model.k,), float(noise_multiplier), dtype=torch.float64, device=x.device)
    add_snapped_noise(buf, z, std)
    n = float(x.shape[0] if n_records is None else n_records)
    return [{"accuracy": min(max(float(buf[i, 0]) / n, 0.0), 1.0)} for i in range(model.k)]
