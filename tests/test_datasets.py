"""Datasets: built-ins, file loaders (IDX, NPZ, CSV), deterministic splits, clear errors."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from workers.datasets import DatasetSpec, dataset_names, load_dataset, read_idx
from workers.errors import ConfigError, DatasetError


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
    if ds.kind == "image":
        assert ds.x_train.min() >= 0.0 and ds.x_train.max() <= 1.0
    else:
        # Standardised with the (public) evaluation split's statistics.
        np.testing.assert_allclose(ds.x_test.mean(0), 0.0, atol=1e-4)
        np.testing.assert_allclose(ds.x_test.std(0), 1.0, atol=1e-3)


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
