"""Datasets: built-ins, file loaders (IDX, NPZ, CSV), deterministic splits, clear errors, and
bounded input scaling."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsweep.errors import ConfigError, DatasetError
from workers.datasets.formats import read_idx
from workers.datasets.loading import load_dataset
from workers.datasets.records import Dataset, DatasetSpec
from workers.datasets.registry import dataset_names
from workers.datasets.splits import _split


def write_idx(path: Path, arr: np.ndarray, *, gz: bool = False) -> Path:
    code = {np.dtype(np.uint8): 0x08, np.dtype(">f4"): 0x0D}[arr.dtype]
    header = bytes([0, 0, code, arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    data = header + arr.tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize(
    "name,n,shape,classes",
    [
        ("digits", 1797, (1, 8, 8), 10),
        ("breast_cancer", 569, (30,), 2),
        ("wine", 178, (13,), 3),
        ("synthetic", 2000, (20,), 4),
    ],
)
def test_builtin_sets(name: str, n: int, shape: tuple[int, ...], classes: int) -> None:
    ds = load_dataset(DatasetSpec(name))
    assert ds.input_shape == shape
    assert ds.num_classes == classes
    assert len(ds.x_train) + len(ds.x_test) == n
    assert abs(len(ds.x_test) - round(0.2 * n)) <= 1
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    lo, hi = ds.input_scaling["clip"]
    for x in (ds.x_train, ds.x_test):
        assert np.isfinite(x).all() and x.min() >= lo and x.max() <= hi
    if ds.kind == "image":
        assert ds.input_scaling["method"] == "pixel" and (lo, hi) == (0.0, 1.0)
    else:
        # Robustly standardised with the (public) evaluation split's median and IQR.
        assert ds.input_scaling == {
            "method": "public-robust",
            "clip": [-5.0, 5.0],
            "source": "public evaluation split",
        }
        np.testing.assert_allclose(np.median(ds.x_test, axis=0), 0.0, atol=1e-6)


def test_split_is_deterministic_by_seed() -> None:
    a = load_dataset(DatasetSpec("wine", split_seed=3))
    b = load_dataset(DatasetSpec("wine", split_seed=3))
    c = load_dataset(DatasetSpec("wine", split_seed=4))
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.x_test, c.x_test)


def test_synthetic_is_seeded_and_configurable() -> None:
    a = load_dataset(
        DatasetSpec("synthetic", options={"seed": 1, "n_samples": 300, "n_classes": 3})
    )
    b = load_dataset(
        DatasetSpec("synthetic", options={"seed": 1, "n_samples": 300, "n_classes": 3})
    )
    c = load_dataset(
        DatasetSpec("synthetic", options={"seed": 2, "n_samples": 300, "n_classes": 3})
    )
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert not np.array_equal(a.x_train, c.x_train)
    assert a.num_classes == 3 and len(a.x_train) + len(a.x_test) == 300
    with pytest.raises(ConfigError, match="unknown option"):
        load_dataset(DatasetSpec("synthetic", options={"n_sample": 3}))


@pytest.mark.parametrize("gz", [False, True])
def test_idx_loader(tmp_path: Path, gz: bool) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(50, 6, 7), dtype=np.uint8)
    labels = rng.integers(0, 3, size=50).astype(np.uint8)
    ip = write_idx(tmp_path / "img.idx", images, gz=gz)
    lp = write_idx(tmp_path / "lab.idx", labels, gz=gz)
    np.testing.assert_array_equal(read_idx(ip), images)
    ds = load_dataset(DatasetSpec("idx", path=str(ip), labels_path=str(lp), test_fraction=0.2))
    assert ds.kind == "image" and ds.input_shape == (1, 6, 7)
    assert ds.num_classes == 3
    # uint8 pixels are mapped to [0, 1] by the format's constant 255.
    all_x = np.concatenate([ds.x_train, ds.x_test])
    assert sorted(all_x.reshape(-1).tolist()) == sorted(
        (images.reshape(-1) / 255.0).astype(np.float32).tolist()
    )


def test_idx_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.idx"
    bad.write_bytes(b"\x01\x02\x08\x01")
    with pytest.raises(DatasetError, match=r"bad.idx.*magic"):
        read_idx(bad)
    trunc = tmp_path / "trunc.idx"
    trunc.write_bytes(bytes([0, 0, 0x08, 1]) + struct.pack(">I", 10) + b"\x00" * 4)
    with pytest.raises(DatasetError, match=r"trunc.idx.*declares shape \(10,\)"):
        read_idx(trunc)
    img = write_idx(tmp_path / "img.idx", np.zeros((5, 2, 2), dtype=np.uint8))
    lab = write_idx(tmp_path / "lab.idx", np.zeros(4, dtype=np.uint8))
    with pytest.raises(DatasetError, match="4 labels for 5 images"):
        load_dataset(DatasetSpec("idx", path=str(img), labels_path=str(lab)))
    with pytest.raises(DatasetError, match=r"nope.idx: file not found"):
        load_dataset(DatasetSpec("idx", path=str(tmp_path / "nope.idx"), labels_path=str(lab)))
    with pytest.raises(ConfigError, match="needs labels_path"):
        load_dataset(DatasetSpec("idx", path=str(img)))


def test_npz_loader_and_errors(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    p = tmp_path / "d.npz"
    np.savez(p, x=rng.normal(size=(40, 5)).astype(np.float32), y=rng.integers(0, 2, 40))
    ds = load_dataset(DatasetSpec("npz", path=str(p)))
    assert ds.kind == "tabular" and ds.input_shape == (5,) and ds.num_classes == 2
    imgs = tmp_path / "imgs.npz"
    np.savez(imgs, x=rng.integers(0, 256, size=(30, 4, 4), dtype=np.uint8), y=np.arange(30) % 3)
    ds = load_dataset(DatasetSpec("npz", path=str(imgs)))
    assert ds.kind == "image" and ds.input_shape == (1, 4, 4) and ds.x_train.max() <= 1.0
    noy = tmp_path / "noy.npz"
    np.savez(noy, x=np.zeros((4, 2)))
    with pytest.raises(DatasetError, match=r"noy.npz: NPZ file lacks array\(s\) \['y'\]"):
        load_dataset(DatasetSpec("npz", path=str(noy)))
    junk = tmp_path / "junk.npz"
    junk.write_text("not a zip")
    with pytest.raises(DatasetError, match=r"junk.npz: not a readable NPZ"):
        load_dataset(DatasetSpec("npz", path=str(junk)))


def test_csv_loader_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    rows = ["f1,species,f2"] + [f"{i * 0.5},{'cat' if i % 2 else 'dog'},{i % 7}" for i in range(40)]
    p.write_text("\n".join(rows) + "\n")
    ds = load_dataset(DatasetSpec("csv", path=str(p), label_column="species"))
    assert ds.input_shape == (2,) and ds.classes == ["cat", "dog"]
    with pytest.raises(
        DatasetError, match=r"d.csv: no column named 'label'; columns are \['f1', 'species', 'f2'\]"
    ):
        load_dataset(DatasetSpec("csv", path=str(p), label_column="label"))
    with pytest.raises(ConfigError, match="needs label_column"):
        load_dataset(DatasetSpec("csv", path=str(p)))
    bad = tmp_path / "bad.csv"
    bad.write_text("a,y\n1,0\nx,1\n")
    with pytest.raises(DatasetError, match=r"bad.csv: line 3: non-numeric feature value 'x'"):
        load_dataset(DatasetSpec("csv", path=str(bad), label_column="y"))
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("a,y\n1,0\n2\n")
    with pytest.raises(DatasetError, match=r"ragged.csv: line 3 has 1 fields, header has 2"):
        load_dataset(DatasetSpec("csv", path=str(ragged), label_column="y"))


def test_unknown_dataset_lists_choices() -> None:
    with pytest.raises(ConfigError) as exc:
        load_dataset(DatasetSpec("mnist"))
    for name in dataset_names():
        assert name in str(exc.value)


# --------------------------------------------------------------------------------------------
# Input scaling: bounded, float64 before the float32 cast, never from the training split.


def _in_clip(ds: Dataset) -> None:
    lo, hi = ds.input_scaling["clip"]
    for x in (ds.x_train, ds.x_test):
        assert x.dtype == np.float32 and np.isfinite(x).all()
        assert x.min() >= lo and x.max() <= hi


def test_digits_pixels_are_divided_by_the_format_constant() -> None:
    from sklearn.datasets import load_digits

    ds = load_dataset(DatasetSpec("digits"))
    all_x = np.sort(np.concatenate([ds.x_train, ds.x_test]).reshape(-1))
    expected = np.sort((load_digits().images / 16.0).astype(np.float32).reshape(-1))
    np.testing.assert_array_equal(all_x, expected)
    assert ds.input_scaling == {
        "method": "pixel",
        "clip": [0.0, 1.0],
        "source": "file format",
        "pixel_max": 16.0,
    }


def test_declared_bounds_clip_and_map_tabular_to_unit_interval(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    rows = ["a,b,y"] + [f"{i},{-i * 1e200},{i % 2}" for i in range(-20, 21)]
    p.write_text("\n".join(rows) + "\n")
    ds = load_dataset(DatasetSpec("csv", path=str(p), label_column="y", input_bounds=(-10, 10)))
    _in_clip(ds)
    assert ds.input_scaling == {
        "method": "declared",
        "clip": [-1.0, 1.0],
        "source": "data owner",
        "bounds": [-10.0, 10.0],
    }
    all_x = np.concatenate([ds.x_train, ds.x_test])
    # Column a: -20..20 clipped to [-10, 10] then mapped linearly; b: all beyond the bounds.
    np.testing.assert_allclose(np.sort(all_x[:, 0]), np.clip(np.arange(-20, 21), -10, 10) / 10)
    assert set(np.abs(all_x[:, 1]).tolist()) <= {0.0, 1.0}


def test_declared_bounds_map_images_to_0_1(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(-50, 300, size=(40, 3, 3))  # float64 "pixels", some outside [0, 255]
    p = tmp_path / "imgs.npz"
    np.savez(p, x=x, y=np.arange(40) % 2)
    ds = load_dataset(DatasetSpec("npz", path=str(p), input_bounds=(0.0, 255.0)))
    _in_clip(ds)
    assert ds.input_scaling["method"] == "declared" and ds.input_scaling["clip"] == [0.0, 1.0]
    all_x = np.sort(np.concatenate([ds.x_train, ds.x_test]).reshape(-1))
    np.testing.assert_allclose(all_x, np.sort(np.clip(x, 0, 255).reshape(-1) / 255), rtol=1e-6)
    with pytest.raises(ConfigError, match="input_bounds must be two finite numbers"):
        load_dataset(DatasetSpec("npz", path=str(p), input_bounds=(1.0, 1.0)))


def test_uint8_pixels_above_the_format_max_cannot_exist_and_float_ones_are_clipped(
    tmp_path: Path,
) -> None:
    p = tmp_path / "u8.npz"
    x = np.full((20, 2, 2), 255, dtype=np.uint8)
    x[::2] = 0
    np.savez(p, x=x, y=np.arange(20) % 2)
    ds = load_dataset(DatasetSpec("npz", path=str(p)))
    assert ds.input_scaling["method"] == "pixel" and ds.input_scaling["pixel_max"] == 255.0
    assert set(np.concatenate([ds.x_train, ds.x_test]).reshape(-1).tolist()) == {0.0, 1.0}


def test_float_images_of_unknown_range_use_a_robust_public_range(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    x = rng.uniform(0.0, 2.0, size=(200, 4, 4))
    y = np.arange(200) % 2
    spec = DatasetSpec("npz", path=str(tmp_path / "f.npz"), split_seed=1)
    np.savez(tmp_path / "f.npz", x=x, y=y)
    clean = load_dataset(spec)
    _in_clip(clean)
    assert clean.input_scaling == {
        "method": "public-robust",
        "clip": [0.0, 1.0],
        "source": "public evaluation split",
    }
    # One evaluation record with a pixel of 1e37 barely moves the range (no squashing to ~0).
    _, test_idx = _split(200, y, 0.2, 1)
    x[test_idx[3], 1, 2] = 1e37
    np.savez(tmp_path / "f.npz", x=x, y=y)
    poisoned = load_dataset(spec)
    _in_clip(poisoned)
    np.testing.assert_allclose(poisoned.x_train, clean.x_train, atol=0.05)
    assert poisoned.x_train.std() > 0.2


@given(
    rows=st.integers(3, 40),
    cols=st.integers(1, 4),
    extremes=st.lists(
        st.sampled_from([1e37, -1e37, 1e300, -1e300, 1.7e308, -1.7e308, 1e-300, 0.0]),
        min_size=0,
        max_size=6,
    ),
    seed=st.integers(0, 10_000),
    clip=st.sampled_from([1.0, 5.0, 50.0]),
)
@settings(max_examples=60, deadline=None)
def test_every_scaled_value_lies_in_the_recorded_clip_range(
    rows: int, cols: int, extremes: list[float], seed: int, clip: float
) -> None:
    """Whatever finite float64 values a file holds, the scaled inputs are finite and bounded."""
    import tempfile

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, cols)) * rng.choice([1e-3, 1.0, 1e6])
    for v in extremes:
        x[rng.integers(rows), rng.integers(cols)] = v
    y = np.arange(rows) % 2
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.npz"
        np.savez(p, x=x, y=y)
        tab = load_dataset(DatasetSpec("npz", path=str(p), feature_clip=clip))
        np.savez(p, x=x.reshape(rows, cols, 1), y=y)
        img = load_dataset(DatasetSpec("npz", path=str(p)))
    _in_clip(tab)
    _in_clip(img)
    assert tab.input_scaling["clip"] == [-clip, clip]


def test_non_finite_values_are_refused_with_their_positions(tmp_path: Path) -> None:
    x = np.ones((30, 2, 3))
    x[4, 1, 2] = np.nan
    x[17, 0, 0] = np.inf
    x[17, 1, 1] = -np.inf
    p = tmp_path / "bad.npz"
    np.savez(p, x=x, y=np.arange(30) % 2)
    with pytest.raises(DatasetError) as exc:
        load_dataset(DatasetSpec("npz", path=str(p)))
    msg = str(exc.value)
    assert "bad.npz: 3 non-finite input value(s) (NaN or inf) in 2 row(s)" in msg
    assert "row 4, position (1, 2): nan" in msg and "row 17, position (0, 0): inf" in msg
    assert "Replace them with finite numbers or drop those rows" in msg
    ylab = tmp_path / "ylab.npz"
    np.savez(ylab, x=np.ones((6, 2)), y=np.array([0.0, 1.0, np.nan, 1.0, 0.0, 1.0]))
    with pytest.raises(DatasetError, match=r"ylab.npz: 1 non-finite label value.*row 2: nan"):
        load_dataset(DatasetSpec("npz", path=str(ylab)))


@pytest.mark.parametrize("label", ["", "nan", "NaN", "inf"])
def test_missing_csv_labels_are_refused(tmp_path: Path, label: str) -> None:
    p = tmp_path / "l.csv"
    p.write_text(f"a,y\n1,0\n2,1\n3,{label}\n4,0\n")
    with pytest.raises(DatasetError, match=r"l.csv: line 4: missing label .* in column 'y'"):
        load_dataset(DatasetSpec("csv", path=str(p), label_column="y"))
