"""`dpsweep datasets register` over the image and text formats (real SQLite, real files):
an image folder (a directory), NPZ images channels-last, and a text CSV with its options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError
from sweeper import datasets as catalog
from sweeper.datasets.names import REGISTER_FORMATS, format_of
from sweeper.store import Dataset
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'register.db'}"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _images(n: int = 20) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, size=(n, 3, 4, 6), dtype=np.uint8)


def test_formats_of_the_new_kinds(tmp_path: Path) -> None:
    assert {"image_folder", "text_csv"} <= set(REGISTER_FORMATS)
    assert format_of(tmp_path, None) == "image_folder"  # a directory
    assert format_of(tmp_path / "t.csv", None) == "csv"  # texts are named: --format text_csv
    assert format_of(tmp_path / "t.csv", "text_csv") == "text_csv"


def test_an_image_folder_and_the_same_images_as_nhwc_npz_share_one_ledger(
    engine: Any, tmp_path: Path
) -> None:
    x = _images()
    labels = np.asarray(["a" if i % 2 else "b" for i in range(len(x))])
    for i, (image, label) in enumerate(zip(x, labels, strict=True)):
        (tmp_path / "folder" / label).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image.transpose(1, 2, 0)).save(tmp_path / "folder" / label / f"{i}.png")
    np.savez(tmp_path / "nhwc.npz", x=x.transpose(0, 2, 3, 1), y=labels)
    folder, info = catalog.register_file(engine, tmp_path / "folder", name="pics")
    assert info["kind"] == "image" and info["input_shape"] == [3, 4, 6] and info["n_examples"] == 20
    npz, _ = catalog.register_file(engine, tmp_path / "nhwc.npz", name="pics-npz")
    assert npz.ledger_key == folder.ledger_key and npz.shared_with == ("pics",)
    with Session(engine) as s:
        row = s.query(Dataset).filter_by(name="pics").one()
        assert row.format == "image_folder" and row.size_bytes and row.size_bytes > 0


def test_a_text_csv_registers_with_its_public_vocabulary(engine: Any, tmp_path: Path) -> None:
    rows = [f"review {i} was great,{'pos' if i % 2 else 'neg'}" for i in range(30)]
    (tmp_path / "t.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    (tmp_path / "vocab.txt").write_text("great\nwas\n")
    options = {"vocab": str(tmp_path / "vocab.txt"), "max_length": 8}
    with pytest.raises(ConfigError, match="label-column"):
        catalog.register_file(engine, tmp_path / "t.csv", name="reviews", fmt="text_csv")
    with pytest.raises(ConfigError, match="no_such"):
        catalog.register_file(
            engine,
            tmp_path / "t.csv",
            name="reviews",
            fmt="text_csv",
            label_column="label",
            options={"no_such": 1},
        )
    binding, info = catalog.register_file(
        engine,
        tmp_path / "t.csv",
        name="reviews",
        fmt="text_csv",
        label_column="label",
        options=options,
    )
    assert info["kind"] == "tokens" and info["input_shape"] == [8] and info["num_classes"] == 2
    with Session(engine) as s:
        row = s.query(Dataset).filter_by(name="reviews").one()
        assert row.format == "text_csv" and (row.config or {})["options"] == options
    # The same texts under another public vocabulary are the same records: one ledger.
    (tmp_path / "other.txt").write_text("review\n")
    again, _ = catalog.register_file(
        engine,
        tmp_path / "t.csv",
        name="reviews-2",
        fmt="text_csv",
        label_column="label",
        options={"vocab": str(tmp_path / "other.txt")},
    )
    assert again.ledger_key == binding.ledger_key


def test_a_registered_text_csv_resolves_with_its_stored_options_and_path_options_are_admin_only(
    engine: Any, tmp_path: Path
) -> None:
    from sweeper.datasets.access import Viewer, check_access
    from sweeper.datasets.resolution import resolve

    rows = [f"review {i} was great,{'pos' if i % 2 else 'neg'}" for i in range(30)]
    (tmp_path / "t.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    (tmp_path / "vocab.txt").write_text("great\nwas\n")
    options = {"vocab": str(tmp_path / "vocab.txt"), "max_length": 8}
    catalog.register_file(
        engine,
        tmp_path / "t.csv",
        name="reviews",
        fmt="text_csv",
        label_column="label",
        options=options,
    )
    # A spec names the registered dataset only: the stored (public) vocabulary applies.
    spec = resolve(engine, {"name": "reviews"})
    assert spec.name == "text_csv" and spec.options == options
    # A spec's own option overrides a stored one, but no analyst may name a server file.
    assert (
        resolve(engine, {"name": "reviews", "options": {"max_length": 4}}).options["max_length"]
        == 4
    )
    analyst = Viewer(owner="ana")
    with pytest.raises(ConfigError) as exc:
        check_access(engine, {"name": "reviews", "options": {"vocab": "/etc/passwd"}}, analyst)
    assert exc.value.field == "dataset.options.vocab"
    check_access(engine, {"name": "reviews", "options": {"vocab": "/x"}}, Viewer(None))
    check_access(engine, {"name": "reviews", "options": {"vocab": "/x"}}, Viewer("a", True))


def test_the_cli_registers_an_image_folder_with_options(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    for label in ("cat", "dog"):
        (tmp_path / "pets" / label).mkdir(parents=True)
        for i in range(6):
            pixels = np.full((5, 5), 40 * i, dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "pets" / label / f"{i}.png")
    dpsweep = str(Path(sys.executable).parent / "dpsweep")
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    base = [dpsweep, "datasets", "register", str(tmp_path / "pets"), "--db", db, "--json"]
    r = subprocess.run(
        [*base, "--name", "pets", "--option", "mode=grayscale"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["kind"] == "image" and out["input_shape"] == [1, 5, 5] and out["num_classes"] == 2
    bad = subprocess.run(
        [*base, "--name", "pets2", "--option", "mode=sepia"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "mode" in bad.stderr
