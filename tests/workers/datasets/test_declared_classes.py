"""Declared class lists (issue 36): the class count and label encoding of a stored file come
from the list its owner declared at upload or registration, never from the records.

* With a declared list equal to the one the records give, a load is identical to an
  undeclared load (arrays, class count, indices), for CSV (text labels, numeric-looking or
  not) and NPZ (int, float, float32, bool, big int64 and text labels), in every mode.
* Neighbouring datasets (one without the only record of a class) load with the same class
  count and the same encoding of their common records under one declared list; without it
  they do not (the channel this closes).
* A record whose label is not declared is refused without naming a label, row or count.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpsweep.errors import DatasetError
from workers.datasets.loading import class_names, load_dataset
from workers.datasets.records import DatasetSpec


def _csv(path: Path, x: np.ndarray, labels: list[str]) -> Path:
    rows = ["f0,f1,label"] + [
        f"{a!r},{b!r},{label}" for (a, b), label in zip(x.tolist(), labels, strict=True)
    ]
    path.write_text("\n".join(rows) + "\n")
    return path


def _features(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size=(n, 2))


def _same(a: Any, b: Any) -> None:
    for name in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert getattr(a, name).dtype == getattr(b, name).dtype
    assert a.num_classes == b.num_classes
    assert a.content_sha256 == b.content_sha256 and a.input_scaling == b.input_scaling


def _label_sets(seed: int) -> list[tuple[str, np.ndarray]]:
    """Random label sets of every kind the loaders give, with distinct canonical forms."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 7))
    n = 60
    ints = rng.choice(np.arange(-50, 200), size=k, replace=False)
    words = np.asarray(["cat", "dog", "ant", "émeu", "b c", "Zebra", "inf", "x1"])[:k]
    return [
        ("int64", rng.choice(ints, size=n).astype(np.int64)),
        ("uint8", rng.choice(np.abs(ints) % 256, size=n).astype(np.uint8)),
        ("float64", rng.choice(ints / 4.0, size=n)),
        ("float32", rng.choice((ints / 10.0).astype(np.float32), size=n)),
        ("big", rng.choice(2**60 + ints.astype(np.int64), size=n).astype(np.int64)),
        ("bool", rng.integers(0, 2, size=n).astype(bool)),
        ("text", rng.choice(words, size=n)),
    ]


@pytest.mark.parametrize("seed", range(4))
def test_a_declared_list_equal_to_the_records_loads_identically_npz(
    tmp_path: Path, seed: int
) -> None:
    for kind, y in _label_sets(seed):
        if len(np.unique(y)) < 2:
            continue
        path = tmp_path / f"{kind}-{seed}.npz"
        np.savez(path, x=_features(len(y), seed), y=y)
        for mode, bounds in (("carve-out", None), ("dp", (-1.0, 1.0))):
            base = DatasetSpec("npz", path=str(path), evaluation=mode, input_bounds=bounds)
            plain = load_dataset(base)
            declared = class_names(y)
            assert plain.declared_classes == declared and len(declared) == plain.num_classes
            again = load_dataset(replace(base, classes=declared))
            _same(plain, again)
            assert again.classes == list(declared) and again.declared_classes == declared


@pytest.mark.parametrize("seed", range(4))
def test_a_declared_list_equal_to_the_records_loads_identically_csv(
    tmp_path: Path, seed: int
) -> None:
    rng = np.random.default_rng(100 + seed)
    # CSV labels are text: numbers (sorted as text by an undeclared load: "10" < "9"),
    # decimals and words.
    pool = ["0", "1", "2", "9", "10", "-3", "0.5", "2.25", "cat", "dog", "b c"]
    k = int(rng.integers(2, 6))
    classes = list(rng.choice(pool, size=k, replace=False))
    labels = [str(c) for c in rng.choice(classes, size=50)]
    labels[:k] = classes  # every class present
    path = _csv(tmp_path / f"d{seed}.csv", _features(50, seed), labels)
    plain = load_dataset(DatasetSpec("csv", path=str(path), label_column="label"))
    declared = plain.declared_classes
    assert declared == class_names(np.asarray(labels)) and len(declared) == plain.num_classes
    again = load_dataset(DatasetSpec("csv", path=str(path), label_column="label", classes=declared))
    _same(plain, again)
    assert plain.classes == again.classes  # canonical text labels are their own names


def test_public_mode_maps_evaluation_labels_onto_the_declared_list(tmp_path: Path) -> None:
    y = np.asarray(["2", "0", "1"] * 20)
    private = _csv(tmp_path / "private.csv", _features(60, 0), list(y))
    public = _csv(tmp_path / "public.csv", _features(12, 1), ["1.0", "0", "2"] * 4)

    def spec(classes: tuple[str, ...] | None) -> DatasetSpec:
        return DatasetSpec(
            "csv",
            path=str(private),
            label_column="label",
            evaluation="public",
            eval_dataset=DatasetSpec("csv", path=str(public), label_column="label"),
            classes=classes,
        )

    _same(load_dataset(spec(None)), load_dataset(spec(("0", "1", "2"))))
    # Another declared order is another encoding, of training and evaluation records alike.
    d = load_dataset(spec(("2", "1", "0")))
    np.testing.assert_array_equal(d.y_train, np.asarray([0, 2, 1] * 20))
    np.testing.assert_array_equal(d.y_test, np.asarray([1, 2, 0] * 4))


def _neighbours(tmp_path: Path, single: str) -> tuple[Path, Path, Path]:
    """D (classes 0, 1, 2; ``single`` has one record, the 7th), D' = D without it, and a
    public evaluation file of class 0 only."""
    labels = [("0", "1", "2")[i % 3] for i in range(60)]
    labels = [lab if lab != single else ("0" if single != "0" else "1") for lab in labels]
    labels[6] = single
    x = _features(60, 3)
    d = _csv(tmp_path / f"d-{single}.csv", x, labels)
    keep = [i for i in range(60) if i != 6]
    d2 = _csv(tmp_path / f"d2-{single}.csv", x[keep], [labels[i] for i in keep])
    pub = _csv(tmp_path / "pub.csv", _features(9, 4), ["0"] * 9)
    return d, d2, pub


@pytest.mark.parametrize("single", ["2", "1"])
def test_neighbouring_datasets_share_the_declared_count_and_encoding(
    tmp_path: Path, single: str
) -> None:
    d, d2, pub = _neighbours(tmp_path, single)

    def load(path: Path, classes: tuple[str, ...] | None) -> Any:
        return load_dataset(
            DatasetSpec(
                "csv",
                path=str(path),
                label_column="label",
                evaluation="public",  # every record trains, in file order
                eval_dataset=DatasetSpec("csv", path=str(pub), label_column="label"),
                classes=classes,
            )
        )

    declared = ("0", "1", "2")
    a, b = load(d, declared), load(d2, declared)
    assert a.num_classes == b.num_classes == 3 and a.classes == b.classes == list(declared)
    np.testing.assert_array_equal(np.delete(a.y_train, 6), b.y_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    # Without a declaration the count is the records' (the channel): one class fewer, and
    # with the middle class gone every later class moves down one index.
    u, v = load(d, None), load(d2, None)
    assert (u.num_classes, v.num_classes) == (3, 2)
    if single == "1":
        assert not np.array_equal(np.delete(u.y_train, 6), v.y_train)
    # The model's output layer follows num_classes: declared, it is the same for both.
    assert a.y_train.max() < a.num_classes and b.y_train.max() < b.num_classes


def test_an_undeclared_label_is_refused_without_naming_it(tmp_path: Path) -> None:
    labels = ["cat", "dog"] * 10 + ["zebra"]
    path = _csv(tmp_path / "edited.csv", _features(21, 5), labels)
    with pytest.raises(DatasetError, match="not one of the dataset's declared classes") as exc:
        load_dataset(
            DatasetSpec("csv", path=str(path), label_column="label", classes=("cat", "dog"))
        )
    message = str(exc.value)
    assert "zebra" not in message and "line" not in message and "21" not in message
    assert "1 " not in message  # no count of offending records either


def test_the_two_class_check_and_bad_declarations(tmp_path: Path) -> None:
    path = _csv(tmp_path / "one.csv", _features(10, 6), ["a"] * 10)
    with pytest.raises(DatasetError, match="has fewer than two classes"):
        load_dataset(DatasetSpec("csv", path=str(path), label_column="label"))
    # Declared, the check reads the list, not the records: a file whose records are all of
    # one class loads with the declared two (and its count does not say so).
    d = load_dataset(DatasetSpec("csv", path=str(path), label_column="label", classes=("a", "b")))
    assert d.num_classes == 2 and set(d.y_train.tolist()) == {0}
    with pytest.raises(DatasetError, match="declares fewer than two classes"):
        load_dataset(DatasetSpec("csv", path=str(path), label_column="label", classes=("a",)))
    with pytest.raises(DatasetError, match="name one class twice"):
        load_dataset(
            DatasetSpec("csv", path=str(path), label_column="label", classes=("a", "1", "1.0"))
        )


def test_class_names_are_canonical() -> None:
    # One class however it is spelled, as for the identity: the first spelling's place.
    assert class_names(np.asarray(["1", "1.0", "2 ", "b", "a"])) == ("1", "2", "a", "b")
    assert class_names(np.asarray([1.0, 0.5, -0.0])) == ("0", "0.5", "1")
    assert class_names(np.asarray([True, False])) == ("0", "1")
    # Exact beyond 2**53 (an int64 label is not a float), and float32 at its own value.
    big = np.asarray([2**60 + 1, 2**60], dtype=np.int64)
    assert class_names(big) == (str(2**60), str(2**60 + 1))
    assert class_names(np.asarray([0.1, 0.2], dtype=np.float32))[0] == repr(float(np.float32(0.1)))
    # Text that reads as a non-finite number stays text.
    assert class_names(np.asarray(["inf", "nan", "cat"])) == ("cat", "inf", "nan")
