"""Scores: how strongly the releases say that each canary was in the training set.

White-box (every iterate): each step t gives, per trial k of the pack, the projection ``z`` of
the noised gradient release on the canary's direction, in units of the release's noise. If the
canary is out, ``z ~ N(0, 1)`` (plus the data's small projection); if it is in, trial k's step
sampled it with probability q, and then ``z`` is shifted by ``mu`` (its clipped contribution
over the noise). The score is the log-likelihood ratio of "in" against "out", summed over the
steps: the Neyman-Pearson test of the Poisson-subsampled Gaussian, the strongest adversary
DP-SGD's guarantee covers.

The data's own gradients project on each canary's direction too, and coherently: their sum
drifts slowly with the parameters, so over T steps it grows like T while the noise grows like
sqrt(T), and would drown the canaries. DP's adversary knows every other record, so on a public
dataset the engine subtracts their expected contribution at each step's parameters
(:meth:`workers.engine.DPEngine.expected_data_release`); only the batch's sampling noise is
left. On private data nothing may read the records outside the mechanism, so the scorer
removes the drift from what it sees: each projection minus the mean of its neighbours
(:data:`DETREND_WINDOW` steps on each side, itself excluded). The noise and a canary's spikes
are white and survive; the drift does not, and neither does a canary's constant part (at
q = 1 nothing is left: audit private data with q well below 1).

The trials of a pack see one dataset, so a canary is in or out for all of them, and each trial
samples it independently. The noise of different trials should be independent; the scorer
does not assume it. It estimates the trials' noise covariance from the projections themselves
and scores under that Gaussian, so noise shared between trials (a bug) cancels and the
canaries stand out, as they would to an adversary who noticed.

Black-box (final model): the score of an input canary is minus its loss under the released
model (a member has been fitted to its label).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

#: Steps on each side whose mean projection is subtracted from a step's (the drift's estimate).
DETREND_WINDOW = 8

#: Ridge added to the estimated noise covariance (in noise units), so that it stays invertible.
COVARIANCE_RIDGE = 1e-3


@dataclass(frozen=True)
class WhiteBoxScores:
    """Two scores per canary ``[m]``: the likelihood ratio, and its linear part.

    ``llr`` is the most powerful test per step and finds the few canaries that stand out (what
    the one-run bound counts); ``linear`` (``sum_t mu_t' P z_t``, P the noise precision) is a
    sum of many small independent terms, Gaussian by the central limit theorem, as the
    Gaussian bound assumes (at q = 1 the two are the same test).
    """

    llr: np.ndarray
    linear: np.ndarray


def white_box_scores(
    z: Tensor, mu: Tensor, *, sample_rate: float, data_removed: bool
) -> WhiteBoxScores:
    """Scores per canary from projections ``z [T, K, m]`` and shifts ``mu [T, K]``.

    ``data_removed``: the projections already exclude the data's expected part (an adversary
    who knows every other record); else they are detrended.
    """
    k = int(z.shape[1])
    zd = z.double() if data_removed else detrend(z.double(), window=DETREND_WINDOW)
    cov = robust_covariance(zd.permute(0, 2, 1).reshape(-1, k))
    cov = cov + COVARIANCE_RIDGE * torch.eye(k, dtype=cov.dtype)
    prec = torch.linalg.inv(cov)
    patterns = torch.tensor(list(itertools.product((0.0, 1.0), repeat=k)), dtype=torch.float64)
    n_in = patterns.sum(dim=1)
    q = min(max(float(sample_rate), 0.0), 1.0)
    # log P(pattern); at q = 1 every included canary is in every batch (log 0 = -inf).
    log_q = math.log(q) if q > 0 else -math.inf
    log_1q = math.log1p(-q) if q < 1 else -math.inf
    log_p = torch.where(n_in > 0, n_in * log_q, 0.0) + torch.where(
        n_in < k, (k - n_in) * log_1q, 0.0
    )  # [S]
    means = patterns.unsqueeze(0) * mu.double().unsqueeze(1)  # [T, S, K]
    mp = means @ prec  # [T, S, K]
    lin = mp @ zd  # [T, S, m]
    quad = 0.5 * (mp * means).sum(dim=-1)  # [T, S]
    llr = torch.logsumexp(log_p.view(1, -1, 1) + lin - quad.unsqueeze(-1), dim=1)  # [T, m]
    linear = (mu.double() @ prec).unsqueeze(1) @ zd  # [T, 1, m]
    return WhiteBoxScores(llr=llr.sum(dim=0).numpy(), linear=linear.sum(dim=(0, 1)).numpy())


def robust_covariance(x: Tensor, *, cut: float = 5.0) -> Tensor:
    """The ``[K, K]`` covariance of the rows of ``x [n, K]``, robust to a few huge values.

    A canary whose contribution escaped clipping shows as one huge projection; a plain
    covariance would inflate by it and hide the very canary that should stand out. Each
    column is winsorised at ``cut`` robust standard deviations (1.4826 MAD) first.
    """
    med = x.median(dim=0, keepdim=True).values
    scale = 1.4826 * (x - med).abs().median(dim=0, keepdim=True).values
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    w = torch.maximum(torch.minimum(x, med + cut * scale), med - cut * scale)
    centred = w - w.mean(dim=0, keepdim=True)
    return centred.T @ centred / max(x.shape[0] - 1, 1)


def detrend(z: Tensor, *, window: int) -> Tensor:
    """``z [T, ...]`` minus, at each step, the mean of up to ``window`` steps on each side."""
    t_steps = z.shape[0]
    if t_steps < 2 or window < 1:
        return z
    csum = torch.cat([torch.zeros_like(z[:1]), z.cumsum(dim=0)])  # csum[i] = sum z[:i]
    idx = torch.arange(t_steps)
    lo = (idx - window).clamp(min=0)
    hi = (idx + window + 1).clamp(max=t_steps)
    shape = (t_steps,) + (1,) * (z.dim() - 1)
    total = csum[hi] - csum[lo] - z
    count = (hi - lo - 1).to(z.dtype).view(shape)
    return z - total / count


def black_box_scores(losses: np.ndarray) -> np.ndarray:
    """Scores of input canaries from their losses under the final model (lower loss: in)."""
    return -np.asarray(losses, dtype=np.float64)
