"""CIFAR-10 and CIFAR-100 from their standard "python version" batches in a local directory.

The directory is the one the archives ``cifar-10-python.tar.gz`` and ``cifar-100-python.tar.gz``
unpack to (dpsweep never downloads them):

* CIFAR-10 (``cifar10``): ``data_batch_1`` ... ``data_batch_5`` (50,000 training images),
  ``test_batch`` (10,000), ``batches.meta`` (``label_names``);
* CIFAR-100 (``cifar100``): ``train`` (50,000), ``test`` (10,000), ``meta``
  (``fine_label_names``, ``coarse_label_names``; option ``labels``: ``fine`` or ``coarse``).

Option ``part`` chooses the training part (default) or the test part; registered twice, the
test part declared public (``--public``), a sweep trains on one and evaluates on the other
(``eval: {mode: public, dataset: cifar10-test}``), as mnist1d and mnist1d-test.

Images are uint8 ``[N, 3, 32, 32]`` (the files' row-major 3072 values: red, green, blue planes),
pixel bounds [0, 255] from the format; labels are the class names of the meta file.

The files are Python pickles, and a data file is hostile input: unpickling may call any
importable function a file names. :class:`_BatchUnpickler` resolves only the few globals a
batch of numpy arrays needs and refuses every other one, before anything is called; a file that
names another is refused as not a CIFAR batch, and nothing in it runs.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dpsweep.errors import ConfigError, DatasetError
from workers.datasets.builtin_descriptors import CIFAR10, CIFAR100
from workers.datasets.records import DatasetSpec, RawData
from workers.datasets.registry import register_dataset

#: The globals a batch may name: numpy's array and dtype reconstruction (``numpy.core`` before
#: numpy 2, ``numpy._core`` since), and ``_codecs.encode``, with which Python 3 writes bytes
#: (an array's raw data) in pickle protocols 0-2. Each builds a value and runs nothing else.
_ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }
)

#: Values per image: 3 channels of 32 x 32.
_SHAPE = (3, 32, 32)
_VALUES = 3 * 32 * 32

#: The files of each format: training part, test part, meta file and its class-name keys.
LAYOUTS: dict[str, dict[str, Any]] = {
    "cifar10": {
        "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
        "test": ("test_batch",),
        "meta": "batches.meta",
        "names": {"fine": "label_names"},
        "labels": {"fine": "labels"},
    },
    "cifar100": {
        "train": ("train",),
        "test": ("test",),
        "meta": "meta",
        "names": {"fine": "fine_label_names", "coarse": "coarse_label_names"},
        "labels": {"fine": "fine_labels", "coarse": "coarse_labels"},
    },
}


class _BatchUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`_ALLOWED_GLOBALS`.

    Every opcode that could call or import something (``GLOBAL``, ``STACK_GLOBAL``, ``INST``,
    ``OBJ``, the extension registry's ``EXT*``) gets its callable from :meth:`find_class`, so a
    file naming ``os.system`` (through ``__reduce__``) is refused before anything runs.
    Persistent ids are refused by the base class.
    """

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise _Refused("a global a CIFAR batch never holds")
        return super().find_class(module, name)


class _Refused(DatasetError):
    """A pickle named a global outside :data:`_ALLOWED_GLOBALS` (turned into the message below)."""


def read_batch(path: Path, what: str) -> dict[str, Any]:
    """One pickled CIFAR file as a dict with ``str`` keys (``bytes`` keys decoded as latin-1).

    ``encoding="latin1"`` reads the Python 2 pickles the archives hold (numpy's own advice for
    arrays pickled by Python 2); files written by Python 3 read the same.

    Raises:
        DatasetError: the file is missing, names a global a CIFAR batch never needs, or is not
            a pickled dict (the message names the file, never its contents).
    """
    if not path.is_file():
        raise DatasetError(f"{path}: file not found ({what})")
    not_cifar = f"{path}: not a CIFAR batch ({what}: a pickled dict of the python version)"
    try:
        with path.open("rb") as f:
            obj = _BatchUnpickler(f, encoding="latin1").load()
    except _Refused:
        raise DatasetError(
            f"{not_cifar}; it names a Python object a CIFAR batch never holds, and was not "
            "unpickled further"
        ) from None
    except Exception:  # any malformed stream: truncated, a bad opcode, a failed numpy call
        raise DatasetError(not_cifar) from None
    if not isinstance(obj, dict):
        raise DatasetError(not_cifar)
    return {k.decode("latin-1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _class_names(meta: Mapping[str, Any], key: str, path: Path) -> list[str]:
    names = meta.get(key)
    if not isinstance(names, list) or len(names) < 2:
        raise DatasetError(f"{path}: the meta file lacks its list of class names {key!r}")
    out = [n.decode("latin-1") if isinstance(n, bytes) else n for n in names]
    if not all(isinstance(n, str) and n for n in out) or len(set(out)) != len(out):
        raise DatasetError(f"{path}: {key!r} must be distinct, non-empty class names")
    return out


def _images(batch: Mapping[str, Any], path: Path) -> np.ndarray:
    data = batch.get("data")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
        raise DatasetError(f"{path}: 'data' must be a uint8 array of [N, {_VALUES}] pixels")
    if data.ndim != 2 or data.shape[1] != _VALUES or data.shape[0] == 0:
        raise DatasetError(
            f"{path}: 'data' must hold N >= 1 images of {_VALUES} values (3 x 32 x 32); "
            f"got shape {list(data.shape)}"
        )
    return data.reshape(-1, *_SHAPE)


def _label_indices(batch: Mapping[str, Any], key: str, n: int, classes: int, path: Path) -> Any:
    labels = batch.get(key)
    if not isinstance(labels, list | np.ndarray):
        raise DatasetError(f"{path}: the batch lacks its list of labels {key!r}")
    try:
        idx = np.asarray(labels)
    except Exception:  # a ragged or odd list
        raise DatasetError(f"{path}: {key!r} must be a list of class indices") from None
    if idx.shape != (n,) or not np.issubdtype(idx.dtype, np.integer):
        raise DatasetError(f"{path}: {key!r} must be {n} whole class indices, one per image")
    if n and (int(idx.min()) < 0 or int(idx.max()) >= classes):
        raise DatasetError(
            f"{path}: {key!r} holds an index outside the {classes} classes of the meta file"
        )
    return idx


def load_cifar(fmt: str, root: Path, *, part: str, labels: str = "fine") -> RawData:
    """The images and class names of one part of a CIFAR directory.

    Raises:
        DatasetError: a missing or malformed file (named), or one that is not a CIFAR batch.
    """
    layout = LAYOUTS[fmt]
    if not root.is_dir():
        raise DatasetError(f"{root}: not a directory (the unpacked {fmt} python batches)")
    meta_path = root / layout["meta"]
    names = _class_names(
        read_batch(meta_path, f"{fmt} meta file"), layout["names"][labels], meta_path
    )
    xs, ys = [], []
    for file in layout[part]:
        path = root / file
        batch = read_batch(path, f"{fmt} {part} batch")
        x = _images(batch, path)
        ys.append(_label_indices(batch, layout["labels"][labels], len(x), len(names), path))
        xs.append(x)
    x = np.concatenate(xs) if len(xs) > 1 else xs[0]
    y = np.asarray(names, dtype=object)[np.concatenate(ys)].astype(str)
    return RawData(x=x, y=y, kind="image", pixel_max=255.0)


def _root(spec: DatasetSpec) -> Path:
    if not spec.path:
        raise ConfigError(
            f"dataset {spec.name!r} needs path (the directory of the python batches)",
            field="dataset.path",
        )
    return Path(spec.path)


@register_dataset("cifar10")
def _cifar10(spec: DatasetSpec) -> RawData:
    opts = CIFAR10.validate(spec.options)
    return load_cifar("cifar10", _root(spec), part=opts["part"])


@register_dataset("cifar100")
def _cifar100(spec: DatasetSpec) -> RawData:
    opts = CIFAR100.validate(spec.options)
    return load_cifar("cifar100", _root(spec), part=opts["part"], labels=opts["labels"])
