"""scikit-learn's bundled tables read without it, and the carve-out split kept between
processes: the same records and the same split as scikit-learn's own code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_digits, load_wine
from sklearn.model_selection import train_test_split

from workers.datasets import bundled, splits
from workers.datasets.data_cache import CACHE_ENV


def test_bundled_tables_equal_scikit_learns_loaders() -> None:
    got = bundled.read_digits()
    assert got is not None
    d = load_digits()
    np.testing.assert_array_equal(got[0], d.images)
    np.testing.assert_array_equal(got[1], d.target)
    for filename, loader in (
        ("breast_cancer.csv", load_breast_cancer),
        ("wine_data.csv", load_wine),
    ):
        table = bundled.read_table(filename)
        assert table is not None
        ref = loader()
        np.testing.assert_array_equal(table[0], ref.data)
        np.testing.assert_array_equal(table[1], ref.target)


def test_missing_files_fall_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(bundled, "_data_dir", lambda: tmp_path)
    assert bundled.read_digits() is None and bundled.read_table("wine_data.csv") is None
    (tmp_path / "wine_data.csv").write_text("not,a header\n1,2\n")
    assert bundled.read_table("wine_data.csv") is None


def _sklearn_split(n: int, y: np.ndarray, n_test: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    a, b = train_test_split(np.arange(n), test_size=n_test, random_state=seed, stratify=y)
    return np.sort(a), np.sort(b)


def test_split_is_scikit_learns_and_is_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    y = np.random.default_rng(0).integers(0, 4, 200)
    want = _sklearn_split(200, y, 40, 7)
    first = splits._split(200, y, 0.2, 7)
    files = list((tmp_path / "splits").glob("*.npz"))
    assert len(files) == 1
    second = splits._split(200, y, 0.2, 7)  # from the file
    for got in (first, second):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    # Another seed, another label vector: other files, their own splits.
    splits._split(200, y, 0.2, 8)
    y2 = y.copy()
    y2[0] = (y2[0] + 1) % 4
    np.testing.assert_array_equal(
        splits._split(200, y2, 0.2, 7)[1], _sklearn_split(200, y2, 40, 7)[1]
    )
    assert len(list((tmp_path / "splits").glob("*.npz"))) == 3
    # Another file of the same labels (another tenant's upload of a guess): the same split,
    # computed again, never read from the first file's entry (a hit would be timeable).
    scoped = splits._split(200, y, 0.2, 7, scope="/uploads/ds_other.csv")
    np.testing.assert_array_equal(scoped[1], want[1])
    assert len(list((tmp_path / "splits").glob("*.npz"))) == 4


def test_a_bad_split_file_is_recomputed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    y = np.arange(100) % 5
    want = _sklearn_split(100, y, 20, 3)
    path = splits._split_cache_file(100, y, 0.2, 3, "")
    path.parent.mkdir(parents=True)
    # Not a partition: an index twice (a record both trained on and evaluated in the clear).
    np.savez(path, train=np.arange(80), test=np.arange(60, 80))
    np.testing.assert_array_equal(splits._split(100, y, 0.2, 3)[1], want[1])
    path.write_bytes(b"garbage")
    np.testing.assert_array_equal(splits._split(100, y, 0.2, 3)[1], want[1])
    with np.load(path) as f:  # rewritten whole
        np.testing.assert_array_equal(f["test"], want[1])


def test_a_warm_load_imports_no_scikit_learn(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from workers.datasets.loading import load_dataset\n"
        "from workers.datasets.records import DatasetSpec\n"
        "load_dataset(DatasetSpec('digits'))\n"
        "print('sklearn' in sys.modules)\n"
    )
    env = {CACHE_ENV: str(tmp_path), "PATH": "/usr/bin:/bin"}
    root = str(Path(__file__).resolve().parents[3])
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            env={**env, "PYTHONPATH": root},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for _ in range(2)
    ]
    assert runs == ["True", "False"]  # the first computes the split, the second reads it
