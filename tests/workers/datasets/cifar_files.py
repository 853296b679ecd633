"""Tiny fake CIFAR directories in the real layout of the python batches (written with pickle,
a few records per batch), for the loader's tests and the example spec's planning test."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

CIFAR10_NAMES = [
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"
]  # fmt: skip
CIFAR100_COARSE = [f"super{i:02d}" for i in range(20)]
CIFAR100_FINE = [f"class{i:03d}" for i in range(100)]


def _dump(path: Path, obj: Any) -> None:
    # Protocol 2, as the archives' files (Python 2's cPickle); keys and names as bytes would
    # be Python 2's str, and read the same.
    path.write_bytes(pickle.dumps(obj, protocol=2))


def _pixels(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 3072), dtype=np.uint8)


def write_cifar10(root: Path, per_batch: int = 4, test: int = 6) -> Path:
    """``data_batch_1..5`` of ``per_batch`` images, ``test_batch`` of ``test``, and
    ``batches.meta``; labels cycle over the ten classes, on through the batches."""
    root.mkdir(parents=True, exist_ok=True)
    _dump(root / "batches.meta", {"label_names": CIFAR10_NAMES, "num_cases_per_batch": per_batch})
    for i in range(1, 6):
        labels = [((i - 1) * per_batch + j) % 10 for j in range(per_batch)]
        _dump(
            root / f"data_batch_{i}",
            {
                "batch_label": f"training batch {i} of 5",
                "labels": labels,
                "data": _pixels(per_batch, seed=i),
                "filenames": [f"img_{i}_{j}.png" for j in range(per_batch)],
            },
        )
    _dump(
        root / "test_batch",
        {
            "batch_label": "testing batch 1 of 1",
            "labels": [j % 10 for j in range(test)],
            "data": _pixels(test, seed=0),
            "filenames": [f"test_{j}.png" for j in range(test)],
        },
    )
    return root


def write_cifar100(root: Path, train: int = 8, test: int = 5) -> Path:
    """``train``, ``test`` and ``meta``; fine label j of a part is j * 7 % 100, its coarse
    label that // 5."""
    root.mkdir(parents=True, exist_ok=True)
    _dump(
        root / "meta",
        {"fine_label_names": CIFAR100_FINE, "coarse_label_names": CIFAR100_COARSE},
    )
    for part, n, seed in (("train", train, 1), ("test", test, 2)):
        fine = [j * 7 % 100 for j in range(n)]
        _dump(
            root / part,
            {
                "batch_label": f"{part}ing batch 1 of 1",
                "fine_labels": fine,
                "coarse_labels": [f // 5 for f in fine],
                "data": _pixels(n, seed=seed),
                "filenames": [f"{part}_{j}.png" for j in range(n)],
            },
        )
    return root
