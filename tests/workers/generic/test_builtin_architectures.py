"""The built-in architectures the fast path does not cover train on the generic path, end to end:
WRN-16-4 on synthetic 32x32 images as a packed 4-trial grid, and the text classifier on a small
CSV with a public vocabulary (real files, the real loaders, the real engine)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from workers.datasets.records import DatasetSpec
from workers.models import ModelSpec
from workers.training.loop import train_pack
from workers.training.specs import PackSpec, TrialSpec

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


@pytest.mark.slow
def test_wrn16_4_trains_a_packed_4_trial_grid_for_one_epoch(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 40
    y = np.arange(n) % 4
    # Each class a different mean colour: learnable, and the images are uint8 NHWC.
    x = rng.integers(0, 64, size=(n, 32, 32, 3)) + 48 * y[:, None, None, None]
    np.savez(tmp_path / "images.npz", x=x.astype(np.uint8), y=y)
    spec = PackSpec(
        dataset=DatasetSpec("npz", path=str(tmp_path / "images.npz"), test_fraction=0.2),
        model=ModelSpec("wrn16_4"),
        strategy="fixed",
        trials=[
            TrialSpec(lr=lr, seed=s, noise_multiplier=1.0, target_delta=1e-3, params={"clip": 1.0})
            for s, lr in enumerate([0.05, 0.1, 0.2, 0.4])
        ],
        batch_size=8,
        epochs=1.0,
        eval_every=4,
    )
    results = train_pack(spec)
    assert len(results) == 4
    for r in results:
        assert r.engine_path == "generic"
        summary = r.summary()
        for key in ("accuracy", "loss", "ece"):
            assert math.isfinite(summary[key]), (key, summary[key])
        assert summary["epsilon"] is not None and math.isfinite(summary["epsilon"])


def test_the_text_classifier_trains_on_a_csv_with_a_public_vocabulary(tmp_path: Path) -> None:
    good = ["great fun", "loved it", "great acting", "wonderful film", "loved the story"]
    bad = ["awful mess", "hated it", "boring plot", "terrible film", "hated the story"]
    rows = [f"{good[i % 5]} {i},pos" for i in range(60)] + [
        f"{bad[i % 5]} {i},neg" for i in range(60)
    ]
    (tmp_path / "reviews.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    # The vocabulary is public: written by the test, not built from the records.
    words = "great fun loved it acting wonderful film the story awful mess hated boring plot"
    (tmp_path / "vocab.txt").write_text("\n".join(words.split()) + "\n")
    spec = PackSpec(
        dataset=DatasetSpec(
            "text_csv",
            path=str(tmp_path / "reviews.csv"),
            label_column="label",
            options={"vocab": str(tmp_path / "vocab.txt"), "max_length": 8},
        ),
        model=ModelSpec("text_classifier", {"d_model": 32, "heads": 2, "ff_mult": 2}),
        strategy="fixed",
        trials=[
            TrialSpec(lr=0.5, seed=0, noise_multiplier=0.5, target_delta=1e-3, params={"clip": 1.0})
        ],
        batch_size=16,
        steps=30,
        eval_every=10,
        randomness="reproducible",
    )
    (result,) = train_pack(spec)
    summary = result.summary()
    assert result.engine_path == "generic"
    assert math.isfinite(summary["loss"]) and summary["accuracy"] > 0.7
