"""CIFAR-10 and CIFAR-100 from their python batches: the layout, the parts, and the restricted
unpickler that refuses any pickle naming more than a batch of numpy arrays needs."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from dpsweep.errors import ConfigError, DatasetError
from tests.workers.datasets.cifar_files import (
    CIFAR10_NAMES,
    CIFAR100_COARSE,
    CIFAR100_FINE,
    write_cifar10,
    write_cifar100,
)
from workers.datasets.cifar import load_cifar, read_batch
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec


def test_cifar10_training_part_is_the_five_batches_in_order(tmp_path: Path) -> None:
    root = write_cifar10(tmp_path / "c10", per_batch=4)
    raw = load_cifar("cifar10", root, part="train")
    assert raw.kind == "image" and raw.pixel_max == 255.0
    assert raw.x.dtype == np.uint8 and raw.x.shape == (20, 3, 32, 32)
    first = read_batch(root / "data_batch_1", "test")
    # Row-major 3072 values: the red plane, then green, then blue.
    np.testing.assert_array_equal(raw.x[0, 1].reshape(-1), first["data"][0, 1024:2048])
    want = [CIFAR10_NAMES[k % 10] for k in range(20)]
    assert list(raw.y) == want


def test_cifar10_test_part_and_load_dataset(tmp_path: Path) -> None:
    root = write_cifar10(tmp_path / "c10", per_batch=4, test=6)
    raw = load_cifar("cifar10", root, part="test")
    assert raw.x.shape == (6, 3, 32, 32) and list(raw.y) == CIFAR10_NAMES[:6]
    data = load_dataset(
        DatasetSpec(
            "cifar10",
            path=str(root),
            evaluation="public",
            eval_dataset=DatasetSpec("cifar10", path=str(root), options={"part": "test"}),
        )
    )
    assert data.input_shape == (3, 32, 32) and data.n_train == 20 and len(data.x_test) == 6
    assert data.x_train.min() >= 0.0 and data.x_train.max() <= 1.0  # pixels / 255
    assert data.classes == CIFAR10_NAMES  # the meta file's names (alphabetical, as CIFAR's)


def test_cifar100_fine_and_coarse_labels(tmp_path: Path) -> None:
    root = write_cifar100(tmp_path / "c100", train=8, test=5)
    fine = load_cifar("cifar100", root, part="train")
    assert fine.x.shape == (8, 3, 32, 32)
    assert list(fine.y) == [CIFAR100_FINE[j * 7 % 100] for j in range(8)]
    coarse = load_cifar("cifar100", root, part="test", labels="coarse")
    assert list(coarse.y) == [CIFAR100_COARSE[j * 7 % 100 // 5] for j in range(5)]
    data = load_dataset(
        DatasetSpec("cifar100", path=str(root), options={"labels": "coarse"}, test_fraction=0.25)
    )
    assert data.input_shape == (3, 32, 32) and data.n_private == 8


def test_options_are_validated(tmp_path: Path) -> None:
    root = write_cifar10(tmp_path / "c10")
    with pytest.raises(ConfigError) as err:
        load_dataset(DatasetSpec("cifar10", path=str(root), options={"part": "validation"}))
    assert err.value.field == "dataset.options.part"
    with pytest.raises(ConfigError) as err:
        load_dataset(DatasetSpec("cifar10", path=str(root), options={"labels": "coarse"}))
    assert err.value.field == "dataset.options.labels"  # CIFAR-10 has one label set


class _Payload:
    """A pickle that would run a shell command when unpickled by ``pickle.load``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("where", ["data_batch_3", "batches.meta", "test_batch"])
def test_a_malicious_pickle_is_refused_without_running(tmp_path: Path, where: str) -> None:
    root = write_cifar10(tmp_path / "c10")
    marker = tmp_path / "ran"
    evil = {"labels": [0], "data": _Payload(marker), "label_names": _Payload(marker)}
    (root / where).write_bytes(pickle.dumps(evil, protocol=2))
    part = "test" if where == "test_batch" else "train"
    with pytest.raises(DatasetError, match="not a CIFAR batch") as err:
        load_cifar("cifar10", root, part=part)
    assert where in str(err.value) and "system" not in str(err.value)
    assert not marker.exists()
    # The same file under plain pickle would have run the command: the test is not vacuous.
    pickle.loads((root / where).read_bytes())
    assert marker.exists()


@pytest.mark.parametrize(
    "payload",
    [
        b"cbuiltins\neval\n(S'1+1'\ntR.",  # protocol 0 GLOBAL + REDUCE
        pickle.dumps(print, protocol=4),  # STACK_GLOBAL of builtins.print
        pickle.dumps(np.load, protocol=2),  # a numpy function outside the allowed few
    ],
)
def test_other_globals_are_refused(tmp_path: Path, payload: bytes) -> None:
    path = tmp_path / "batch"
    path.write_bytes(payload)
    with pytest.raises(DatasetError, match="not a CIFAR batch"):
        read_batch(path, "cifar10 train batch")


def test_malformed_batches_name_the_file_not_the_values(tmp_path: Path) -> None:
    root = write_cifar10(tmp_path / "c10", per_batch=4)
    batch = root / "data_batch_2"
    good = read_batch(batch, "test")
    cases = [
        ({**good, "labels": [0, 1, 2, 97]}, "outside the 10 classes"),
        ({**good, "labels": [0, 1]}, "4 whole class indices"),
        ({**good, "data": good["data"][:, :100]}, "3072 values"),
        ({**good, "data": good["data"].astype(np.float32)}, "uint8"),
        ([1, 2, 3], "not a CIFAR batch"),
    ]
    for obj, message in cases:
        batch.write_bytes(pickle.dumps(obj, protocol=2))
        with pytest.raises(DatasetError, match=message) as err:
            load_cifar("cifar10", root, part="train")
        # the label 97 must not be quoted (the temporary path itself may hold the digits 97)
        said = str(err.value).replace(str(root), "<root>")
        assert "data_batch_2" in said and "97" not in said
    batch.write_bytes(pickle.dumps(good, protocol=2)[:200])  # truncated
    with pytest.raises(DatasetError, match="not a CIFAR batch"):
        load_cifar("cifar10", root, part="train")
    batch.unlink()
    with pytest.raises(DatasetError, match="file not found"):
        load_cifar("cifar10", root, part="train")
