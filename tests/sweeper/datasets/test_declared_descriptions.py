"""What an upload or registration declares (issue 36): the class list (``config["classes"]``)
and an image folder's size and channels (``config["options"]``), computed once from the
owner's file; every later load of the stored file (:func:`file_spec`) uses them, never the
records. Rows stored before declarations keep counting classes in the records.
(Real SQLite, real files.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from sqlalchemy.orm import Session

from dpsweep.errors import DatasetError
from sweeper import datasets as catalog
from sweeper.datasets.files import file_spec
from sweeper.store import Dataset
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from workers.datasets.images import registered_options
from workers.datasets.loading import load_dataset


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'declared.db'}"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _csv_text(labels: list[str]) -> str:
    rng = np.random.default_rng(0)
    rows = ["f0,f1,label"] + [
        f"{rng.uniform():.6f},{rng.uniform():.6f},{label}" for label in labels
    ]
    return "\n".join(rows) + "\n"


def _row(engine: Any, name: str) -> Dataset:
    with Session(engine) as session:
        row = session.query(Dataset).filter_by(name=name).one()
        session.expunge(row)
        return row


def _labels() -> list[str]:
    # Class "b" has one record (the 4th): the file without it is a neighbouring dataset.
    labels = [("a", "c")[i % 2] for i in range(40)]
    labels[3] = "b"
    return labels


def _without_b(labels: list[str]) -> list[str]:
    return [lab for lab in labels if lab != "b"]


def test_an_upload_declares_its_classes_and_later_loads_use_them(
    engine: Any, tmp_path: Path
) -> None:
    labels = _labels()
    shown = catalog.store_upload(
        engine,
        owner="alice",
        content=_csv_text(labels).encode(),
        fmt="csv",
        data_dir=tmp_path,
        label_column="label",
    )
    row = _row(engine, shown["id"])
    cfg = dict(row.config or {})
    assert cfg["classes"] == ["a", "b", "c"] and cfg["num_classes"] == 3 == shown["num_classes"]
    assert file_spec(row).classes == ("a", "b", "c")
    # The stored file edited into its neighbour (the only "b" gone): a later load still has
    # the declared three classes and encoding.
    assert row.storage_path is not None
    Path(row.storage_path).write_text(_csv_text(_without_b(labels)))
    d = load_dataset(file_spec(row))
    assert d.num_classes == 3 and d.classes == ["a", "b", "c"]
    assert set(np.concatenate([d.y_train, d.y_test]).tolist()) == {0, 2}
    # A row stored before declarations (no "classes"): today's behaviour, the records' count.
    old = Dataset(
        name=row.name,
        storage_path=row.storage_path,
        format=row.format,
        config={k: v for k, v in cfg.items() if k != "classes"},
    )
    assert file_spec(old).classes is None
    assert load_dataset(file_spec(old)).num_classes == 2


def test_a_registration_declares_its_classes_and_registering_again_recomputes(
    engine: Any, tmp_path: Path
) -> None:
    path = tmp_path / "owned.csv"
    path.write_text(_csv_text(_labels()))
    _, info = catalog.register_file(engine, path, name="owned", label_column="label")
    cfg = dict(_row(engine, "owned").config or {})
    assert cfg["classes"] == ["a", "b", "c"] and info["num_classes"] == cfg["num_classes"] == 3
    # Edited after registration: its loads keep the declared list until the owner registers
    # the file again, which declares what the file now holds.
    path.write_text(_csv_text(_without_b(_labels())))
    assert load_dataset(file_spec(_row(engine, "owned"))).num_classes == 3
    _, info = catalog.register_file(engine, path, name="owned", label_column="label")
    cfg = dict(_row(engine, "owned").config or {})
    assert cfg["classes"] == ["a", "c"] and info["num_classes"] == cfg["num_classes"] == 2
    # A record of a class the list does not declare: refused, naming no label.
    path.write_text(_csv_text(_labels()))
    with pytest.raises(DatasetError, match="declared classes") as exc:
        load_dataset(file_spec(_row(engine, "owned")))
    assert "'b'" not in str(exc.value) and "line" not in str(exc.value)


def test_labels_spelt_two_ways_are_one_declared_class(engine: Any, tmp_path: Path) -> None:
    path = tmp_path / "spelt.csv"
    path.write_text(_csv_text(["1", "1.0", "2"] * 10))
    _, info = catalog.register_file(engine, path, name="spelt", label_column="label")
    cfg = dict(_row(engine, "spelt").config or {})
    # As for the identity, "1" and "1.0" are one class; what is shown is what loads give.
    assert cfg["classes"] == ["1", "2"] and info["num_classes"] == cfg["num_classes"] == 2
    d = load_dataset(file_spec(_row(engine, "spelt")))
    assert d.num_classes == 2 and d.n_train == cfg["n_train"]


def _folder(root: Path, sizes: dict[str, list[tuple[int, int]]], grey: bool = True) -> Path:
    for label, shapes in sizes.items():
        (root / label).mkdir(parents=True)
        for i, (h, w) in enumerate(shapes):
            shape = (h, w) if grey else (h, w, 3)
            pixels = np.full(shape, 30 * i, dtype=np.uint8)
            Image.fromarray(pixels).save(root / label / f"{i}.png")
    return root


def test_a_registered_image_folder_stores_its_size_and_channels(
    engine: Any, tmp_path: Path
) -> None:
    root = _folder(tmp_path / "pets", {"cat": [(5, 7)] * 4, "dog": [(5, 7)] * 4})
    _, info = catalog.register_file(engine, root, name="pets")
    row = _row(engine, "pets")
    cfg = dict(row.config or {})
    assert cfg["options"] == {"size": [5, 7], "mode": "grayscale"}
    assert cfg["classes"] == ["cat", "dog"] and info["input_shape"] == [1, 5, 7]
    spec = file_spec(row)
    assert spec.options == {"size": [5, 7], "mode": "grayscale"}
    assert load_dataset(spec).input_shape == (1, 5, 7)
    # What the owner gives is kept as given; only what is missing is resolved.
    colour = _folder(tmp_path / "colour", {"a": [(4, 4)] * 3, "b": [(4, 4)] * 3}, grey=False)
    _, info = catalog.register_file(engine, colour, name="colour", options={"size": [4, 4]})
    assert dict(_row(engine, "colour").config or {})["options"] == {"size": [4, 4], "mode": "rgb"}
    assert info["input_shape"] == [3, 4, 4]
    given = {"size": [4, 4], "mode": "rgb", "resize": "none"}
    assert registered_options(colour, given) == given
    # With resize the owner gives the size (the loader refuses without): nothing to resolve.
    assert registered_options(colour, {"resize": "nearest", "mode": "grayscale"}) == {
        "resize": "nearest",
        "mode": "grayscale",
    }


def test_registered_options_leave_a_grey_and_colour_mix_to_the_loader(tmp_path: Path) -> None:
    root = _folder(tmp_path / "mixed", {"a": [(3, 3)] * 2, "b": [(3, 3)] * 2})
    Image.fromarray(np.zeros((3, 3, 3), dtype=np.uint8)).save(root / "b" / "rgb.png")
    # The size is the first image's; "auto" stays, and the loader refuses the mix.
    assert registered_options(root, {}) == {"size": [3, 3]}
