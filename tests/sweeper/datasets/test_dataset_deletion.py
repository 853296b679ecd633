"""Deleting a dataset name deletes the models its sweeps kept (rows, then files), and only
theirs; ``dpsweep datasets delete`` says how many (real SQLite, real local store)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from api.cli import main
from dpsweep.errors import IllegalState
from sweeper.datasets.registration import delete_name_and_models, register_file
from sweeper.settings import SweeperSettings
from sweeper.store import Dataset, ModelArtifact, Sweep
from sweeper.store.artifact_files import store_for, sweep_prefix
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.lifecycle import cancel_sweep
from tests.sweeper.artifacts.test_quota import keep_a_model, small_spec


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    # The default store, beside the SQLite file, as the CLI uses it.
    monkeypatch.delenv("DPSWEEP_ARTIFACT_URL", raising=False)
    monkeypatch.delenv("DPSWEEP_ARTIFACT_QUOTA_MB", raising=False)
    u = f"sqlite:///{tmp_path / 'deletion.db'}"
    upgrade(u)
    return u


@pytest.fixture
def engine(url: str) -> Any:
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _image_csv(path: Path) -> Path:
    """64 pixel columns (8x8 like digits) and a label: 10 classes, 100 rows."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 16, size=(100, 64))
    y = np.arange(100) % 10
    header = ",".join(f"p{i}" for i in range(64)) + ",label"
    rows = [",".join(str(int(v)) for v in r) + f",{int(t)}" for r, t in zip(x, y, strict=True)]
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def _models(engine: Any, sweep_id: str) -> int:
    with Session(engine) as s:
        return int(
            s.scalar(
                sa.select(sa.func.count())
                .select_from(ModelArtifact)
                .where(ModelArtifact.sweep_id == sweep_id)
            )
            or 0
        )


def test_deleting_a_name_deletes_its_sweeps_models_and_no_others(
    engine: Any, url: str, tmp_path: Path, capsys: Any
) -> None:
    register_file(engine, _image_csv(tmp_path / "pixels.csv"), name="pixels", label_column="label")
    store = store_for(engine, SweeperSettings())
    on_name, _ = keep_a_model(engine, store, small_spec(dataset={"name": "pixels"}))
    elsewhere, _ = keep_a_model(engine, store, small_spec())  # digits: not the name's
    assert _models(engine, on_name) == _models(engine, elsewhere) == 1
    assert store.folders(sweep_prefix(on_name))

    # A sweep holding a reservation on the records refuses the deletion: nothing is deleted.
    holder = create_sweep(engine, small_spec(dataset={"name": "pixels"}, name="holder"))
    with pytest.raises(IllegalState):
        delete_name_and_models(engine, "pixels", store=store)
    assert _models(engine, on_name) == 1
    cancel_sweep(engine, holder)

    assert main(["datasets", "delete", "pixels", "--db", url]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "deleted the name 'pixels' and 1 trained model(s) its sweeps kept" in out
    assert _models(engine, on_name) == 0
    assert store.folders(sweep_prefix(on_name)) == []
    # The sweep itself (its results and accounting) stays; the other dataset's model too.
    with Session(engine) as s:
        assert s.get(Sweep, on_name) is not None
        assert s.scalars(sa.select(Dataset).where(Dataset.name == "pixels")).first() is None
    assert _models(engine, elsewhere) == 1
    assert store.folders(sweep_prefix(elsewhere))
