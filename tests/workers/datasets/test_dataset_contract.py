"""The dataset contract, run over every registered dataset (built-in, file format or plug-in).

Each described dataset loads (file formats from a small sample file written here), gives finite
float32 inputs inside its declared clip range and labels of at least two classes, and its
descriptor validates its own defaults and refuses an unknown option or a bad value by naming the
field. A plug-in is tested by registering it: the parameters are the registry's names.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpsweep.errors import ConfigError
from workers.datasets.descriptors import (
    INPUT_KINDS,
    STRING_KINDS,
    dataset_descriptor_names,
    get_dataset_descriptor,
)
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec
from workers.datasets.registry import dataset_names

NAMES = dataset_descriptor_names()
N = 60  # records of each sample file: enough for a split with both classes on each side


def _labels(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.uint8) % 3


def _images(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(n, 6, 6), dtype=np.uint8)


def _write_idx(path: Path, a: np.ndarray) -> None:
    # Magic: two zero bytes, the type code (0x08: uint8) and the number of dimensions.
    header = bytes([0, 0, 0x08, a.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in a.shape)
    path.write_bytes(header + a.tobytes())


def _idx_sample(tmp: Path) -> dict[str, Any]:
    _write_idx(tmp / "images.idx", _images(N))
    _write_idx(tmp / "labels.idx", _labels(N))
    return {"path": str(tmp / "images.idx"), "labels_path": str(tmp / "labels.idx")}


def _npz_sample(tmp: Path) -> dict[str, Any]:
    np.savez(tmp / "data.npz", x=_images(N), y=_labels(N))
    return {"path": str(tmp / "data.npz")}


def _csv_sample(tmp: Path) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    features, labels = rng.normal(size=(N, 2)), _labels(N)
    rows = [f"{a:.6f},{b:.6f},{y}" for (a, b), y in zip(features, labels, strict=True)]
    (tmp / "data.csv").write_text("f1,f2,label\n" + "\n".join(rows) + "\n")
    return {"path": str(tmp / "data.csv"), "label_column": "label"}


def _image_folder_sample(tmp: Path) -> dict[str, Any]:
    from PIL import Image

    for i, (image, label) in enumerate(zip(_images(N), _labels(N), strict=True)):
        folder = tmp / "images" / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, mode="L").save(folder / f"{i:03d}.png")
    return {"path": str(tmp / "images")}


def _text_csv_sample(tmp: Path) -> dict[str, Any]:
    words = ["good", "bad", "film", "plot", "long"]
    rows = [f"{words[i % 5]} {words[(i * 7) % 5]} film,{y}" for i, y in enumerate(_labels(N))]
    (tmp / "texts.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    # A public vocabulary, written by the test: never built from the records.
    (tmp / "vocab.txt").write_text("good\nbad\nfilm\n")
    return {
        "path": str(tmp / "texts.csv"),
        "label_column": "label",
        "options": {"vocab": str(tmp / "vocab.txt")},
    }


def _cifar10_sample(tmp: Path) -> dict[str, Any]:
    from tests.workers.datasets.cifar_files import write_cifar10

    return {"path": str(write_cifar10(tmp / "cifar-10-batches-py", per_batch=N // 5))}


def _cifar100_sample(tmp: Path) -> dict[str, Any]:
    from tests.workers.datasets.cifar_files import write_cifar100

    # Coarse labels: 20 classes of 3 records each, so that a split keeps every class.
    root = write_cifar100(tmp / "cifar-100-python", train=N)
    return {"path": str(root), "options": {"labels": "coarse"}}


#: Sample files for the datasets that read the user's files (``needs`` a path), by name. A
#: sample may also give the options it needs (``options``: a public vocabulary's path).
SAMPLES: dict[str, Callable[[Path], dict[str, Any]]] = {
    "idx": _idx_sample,
    "npz": _npz_sample,
    "csv": _csv_sample,
    "image_folder": _image_folder_sample,
    "text_csv": _text_csv_sample,
    "cifar10": _cifar10_sample,
    "cifar100": _cifar100_sample,
}


def dataset_spec(name: str, tmp: Path) -> DatasetSpec:
    """A spec that loads ``name`` at its default options (writing a sample file if it needs one)."""
    d = get_dataset_descriptor(name)
    files: dict[str, Any] = {}
    if d.needs:
        if name not in SAMPLES:
            pytest.skip(f"dataset {name!r} reads files ({', '.join(d.needs)}); no sample here")
        files = SAMPLES[name](tmp)
    options = d.validate(files.pop("options", {}))
    assert set(files) == set(d.needs), f"the sample gives {sorted(files)}, not {d.needs}"
    return DatasetSpec(name, options=options, **files)


def check_dataset_contract(name: str, tmp: Path) -> None:
    """Load ``name`` and check what every loaded dataset promises."""
    d = get_dataset_descriptor(name)
    data = load_dataset(dataset_spec(name, tmp))
    assert d.admits(data.kind), f"{name} declares {d.input_kind} inputs but loaded {data.kind}"
    lo, hi = data.input_scaling["clip"]
    for x in (data.x_train, data.x_test):
        # Token ids stay int64 (an embedding's indices); every other input is float32.
        assert x.dtype == (np.int64 if data.kind == "tokens" else np.float32) and len(x) > 0
        assert np.isfinite(x).all()
        assert x.min() >= lo and x.max() <= hi
        assert x.shape[1:] == data.input_shape
    if data.kind == "image":
        assert len(data.input_shape) == 3  # [C, H, W]
    if data.kind == "tokens":
        assert len(data.input_shape) == 1  # [T]
        assert data.vocab_size is not None and hi == data.vocab_size - 1
    for y in (data.y_train, data.y_test):
        assert y.dtype == np.int64 and y.min() >= 0 and y.max() < data.num_classes
    assert data.num_classes >= 2 and len(data.classes) == data.num_classes
    assert len(data.content_sha256) == 64


def check_descriptor_contract(name: str) -> None:
    """The descriptor validates its defaults and refuses what it does not declare."""
    d = get_dataset_descriptor(name)
    assert d.name == name and d.input_kind in INPUT_KINDS and d.description
    filled = d.validate({})
    assert set(filled) == set(d.options)
    assert d.validate(filled) == filled  # validated options stay valid, unchanged
    with pytest.raises(ConfigError, match="no_such_option") as exc:
        d.validate({"no_such_option": 1})
    assert exc.value.field == "dataset.options.no_such_option"
    for option, hp in d.options.items():
        length = getattr(hp, "length", 0)
        bad: list[Any]
        if hp.kind in STRING_KINDS:
            bad = [123, "", None if not hp.optional else 1.5, ["a"]]
        elif hp.kind == "choice":
            bad = ["not-a-choice"]
        else:
            bad = ["many", float("nan")]
            if hp.low is not None:
                bad.append(hp.low - 1)
            if hp.high is not None:
                bad.append(hp.high + 1)
            if hp.kind == "int":
                bad.append(float(hp.low if hp.low is not None else 0) + 0.5)
        if length:
            # A list option: a single value, a list of another length, or one bad member.
            good = hp.low if hp.low is not None else 1
            bad = [good, [good] * (length + 1), *([v] + [good] * (length - 1) for v in bad[1:])]
        for value in bad:
            with pytest.raises(ConfigError, match=option) as exc:
                d.validate({option: value})
            assert exc.value.field == f"dataset.options.{option}", (option, value)


def test_every_loader_is_described_and_every_description_has_a_loader() -> None:
    assert NAMES and set(dataset_names()) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_descriptor_contract(name: str) -> None:
    check_descriptor_contract(name)


@pytest.mark.parametrize("name", NAMES)
def test_dataset_contract(name: str, tmp_path: Path) -> None:
    check_dataset_contract(name, tmp_path)


def test_an_unknown_dataset_is_refused_by_field() -> None:
    with pytest.raises(ConfigError, match="unknown dataset 'nope'") as exc:
        get_dataset_descriptor("nope")
    assert exc.value.field == "dataset.name"
    assert "digits" in str(exc.value)


def test_synthetic_loader_and_descriptor_share_defaults() -> None:
    from workers.datasets.builtin import _SYNTHETIC_DEFAULTS

    assert get_dataset_descriptor("synthetic").validate({}) == _SYNTHETIC_DEFAULTS
