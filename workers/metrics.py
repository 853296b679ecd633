"""Evaluation metrics, vectorised over the trials of a pack.

Classification: accuracy, cross-entropy, and calibration (ECE, MCE) over 15 equal-width
confidence bins, with the bins kept for reliability diagrams (Guo et al. 2017, used in 000).
Reconstruction: mean squared error. All of it is computed on the evaluation split, which
dpsweep treats as public.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

N_BINS = 15


def classification_metrics(
    logits: Tensor, y: Tensor, *, n_bins: int = N_BINS
) -> list[dict[str, Any]]:
    """Metrics for each trial. ``logits`` ``[K, N, C]``, ``y`` ``[N]``."""
    k, n, c = logits.shape
    logits = logits.double()
    loss = (
        F.cross_entropy(logits.reshape(k * n, c), y.repeat(k), reduction="none")
        .view(k, n)
        .mean(dim=1)
    )
    probs = logits.softmax(dim=-1)
    conf, pred = probs.max(dim=-1)
    correct = (pred == y.unsqueeze(0)).double()
    acc = correct.mean(dim=1)
    # Bin m covers (m/M, (m+1)/M]; confidence 0 (impossible with softmax) would go to bin 0.
    idx = (torch.ceil(conf * n_bins).long() - 1).clamp_(0, n_bins - 1)
    counts = torch.zeros(k, n_bins, dtype=torch.float64, device=logits.device)
    counts.scatter_add_(1, idx, torch.ones_like(conf))
    conf_sum = torch.zeros_like(counts).scatter_add_(1, idx, conf)
    acc_sum = torch.zeros_like(counts).scatter_add_(1, idx, correct)
    gap = (acc_sum - conf_sum).abs()
    ece = gap.sum(dim=1) / n
    safe = counts.clamp(min=1)
    mce = torch.where(counts > 0, gap / safe, torch.zeros_like(gap)).max(dim=1).values
    # To Python once: indexing tensors element by element costs ~7 ms for a pack of 25. The
    # divisions below are the same IEEE float64 operations torch would do.
    counts_l, acc_l, conf_l = counts.tolist(), acc_sum.tolist(), conf_sum.tolist()
    acc_t, loss_t, ece_t, mce_t = acc.tolist(), loss.tolist(), ece.tolist(), mce.tolist()
    out = []
    for t in range(k):
        bins = []
        for m in range(n_bins):
            cnt = int(counts_l[t][m])
            bins.append(
                {
                    "lower": m / n_bins,
                    "upper": (m + 1) / n_bins,
                    "count": cnt,
                    "accuracy": acc_l[t][m] / cnt if cnt else None,
                    "confidence": conf_l[t][m] / cnt if cnt else None,
                }
            )
        out.append(
            {
                "accuracy": acc_t[t],
                "loss": loss_t[t],
                "ece": ece_t[t],
                "mce": mce_t[t],
                "reliability": bins,
            }
        )
    return out


def reconstruction_metrics(outputs: Tensor, targets: Tensor) -> list[dict[str, Any]]:
    """Mean squared error per trial. ``outputs`` ``[K, N, ...]``, ``targets`` ``[N, ...]``."""
    k = outputs.shape[0]
    err = (outputs.double() - targets.unsqueeze(0).double()).pow(2).reshape(k, -1).mean(dim=1)
    return [{"mse": float(err[t]), "loss": float(err[t])} for t in range(k)]
