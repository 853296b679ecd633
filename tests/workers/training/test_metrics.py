"""Accuracy, cross-entropy, ECE and MCE with reliability bins."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.metrics import N_BINS, classification_metrics, reconstruction_metrics


def numpy_ece_mce(probs: np.ndarray, y: np.ndarray, bins: int = N_BINS) -> tuple[float, float]:
    conf = probs.max(1)
    correct = (probs.argmax(1) == y).astype(float)
    ece, mce = 0.0, 0.0
    edges = np.linspace(0, 1, bins + 1)
    for lo, hi in itertools.pairwise(edges):
        sel = (conf > lo) & (conf <= hi)
        if sel.any():
            gap = abs(correct[sel].mean() - conf[sel].mean())
            ece += sel.mean() * gap
            mce = max(mce, gap)
    return ece, mce


def test_metrics_match_a_direct_computation() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 300, 5, generator=gen) * 3
    y = torch.randint(5, (300,), generator=gen)
    res = classification_metrics(logits, y)
    for k in range(2):
        probs = logits[k].double().softmax(-1).numpy()
        ece, mce = numpy_ece_mce(probs, y.numpy())
        assert abs(res[k]["ece"] - ece) < 1e-9
        assert abs(res[k]["mce"] - mce) < 1e-9
        assert res[k]["accuracy"] == float((probs.argmax(1) == y.numpy()).mean())
        ce = torch.nn.functional.cross_entropy(logits[k].double(), y).item()
        assert abs(res[k]["loss"] - ce) < 1e-9
        bins = res[k]["reliability"]
        assert len(bins) == N_BINS and sum(b["count"] for b in bins) == 300


def test_perfectly_calibrated_and_overconfident() -> None:
    # Confidence 1.0 and always right: zero calibration error.
    y = torch.arange(4).repeat(25)
    logits = torch.full((1, 100, 4), -1e4)
    logits[0, torch.arange(100), y] = 1e4
    r = classification_metrics(logits, y)[0]
    assert r["accuracy"] == 1.0 and r["ece"] < 1e-12 and r["mce"] < 1e-12
    # Confident (~1.0) and always wrong: ECE = MCE = 1.
    r = classification_metrics(logits, (y + 1) % 4)[0]
    assert r["accuracy"] == 0.0 and abs(r["ece"] - 1.0) < 1e-9 and abs(r["mce"] - 1.0) < 1e-9


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.floats(0.01, 20.0), n=st.integers(1, 200))
def test_ece_bounds(seed: int, scale: float, n: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, n, 3, generator=gen) * scale
    y = torch.randint(3, (n,), generator=gen)
    r = classification_metrics(logits, y)[0]
    assert 0.0 <= r["ece"] <= r["mce"] + 1e-12 <= 1.0 + 1e-9


def test_reconstruction_mse() -> None:
    out = torch.zeros(2, 3, 4)
    out[1] += 0.5
    r = reconstruction_metrics(out, torch.ones(3, 4))
    assert r[0]["mse"] == 1.0 and r[1]["mse"] == 0.25
