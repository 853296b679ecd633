"""Issue 54, stored datasets: the owner declares a privacy unit at registration or upload,
the number of units is a declared fact, analysts see "per unit" (never rows per unit), the
unit is fixed for every spec, and one ledger keeps one unit (real SQLite throughout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, DatasetError, IllegalState
from dpsweep.spec import SweepSpec
from sweeper.datasets import grants
from sweeper.datasets.access import Viewer
from sweeper.datasets.analyst_views import dataset_policy, update_policy
from sweeper.datasets.files import file_spec
from sweeper.datasets.fixed_view import apply_view, require_declared, stored_row, view_of
from sweeper.datasets.identity import ledger_key_of
from sweeper.datasets.registration import register_file
from sweeper.datasets.resolution import resolve
from sweeper.datasets.uploads import store_upload
from sweeper.datasets.views import describe, list_datasets
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.units import ledger_unit
from sweeper.store import Dataset
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade

OLGA, ANA = Viewer("olga"), Viewer("ana")
#: The big patient's rows: a number that must never appear in anything shown.
BIG = 50
#: 1 patient with BIG rows, 29 with 1-3 rows each.
N_PATIENTS = 30


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'units.db'}"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def patients_csv(unit_column: str = "patient_id", *, with_unit: bool = True) -> str:
    """Records of N_PATIENTS patients: patient 1000 has BIG rows, the others 1-3."""
    rng = np.random.default_rng(54)
    lines = ["a,b,c,label" + (f",{unit_column}" if with_unit else "")]
    for p in range(N_PATIENTS):
        for _ in range(BIG if p == 0 else 1 + p % 3):
            x = np.round(rng.normal(size=3), 3)
            row = ",".join(repr(float(v)) for v in x) + f",{int(x[0] > 0)}"
            lines.append(row + (f",{1000 + p}" if with_unit else ""))
    return "\n".join(lines) + "\n"


N_ROWS = BIG + sum(1 + p % 3 for p in range(1, N_PATIENTS))


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _register(engine: Any, tmp_path: Path, name: str = "clinic", **kw: Any) -> Any:
    kw.setdefault("privacy_unit", "patient_id")
    path = _file(tmp_path, f"{name}.csv", patients_csv())
    return register_file(engine, path, name=name, label_column="label", owner="olga", **kw)


def _row(engine: Any, name: str) -> Dataset:
    row = stored_row(engine, name)
    assert row is not None
    return row


def _numbers(value: Any) -> list[int]:
    """Every integer in a JSON-like value (to check that rows per unit never show)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return []


def _spec(name: str, **dataset: Any) -> SweepSpec:
    return SweepSpec.model_validate(
        {
            "name": "s",
            "dataset": {"name": name, **dataset},
            "model": {"name": "logreg"},
            "training": {"steps": 4, "batch_size": 16},
            "privacy": {"budgets": [1], "delta": 1e-5},
            "eval": {"mode": "dp"},
            "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
        }
    )


def test_registration_declares_the_unit_and_counts_units_once(engine: Any, tmp_path: Path) -> None:
    binding, info = _register(engine, tmp_path)
    assert info["privacy_unit"] == "patient_id" and info["n_units"] == N_PATIENTS
    assert info["n_examples"] == N_ROWS and info["input_shape"] == [3]  # never a feature
    row = _row(engine, "clinic")
    assert row.config["privacy_unit"] == "patient_id" and row.config["n_units"] == N_PATIENTS
    # Every load reads the file with the owner's unit; plans take the units from the view.
    assert file_spec(row).privacy_unit == "patient_id"
    worker = resolve(engine, {"name": "clinic"})
    assert worker.privacy_unit == "patient_id" and worker.declared_units == N_PATIENTS
    # The records' ledger counts patients.
    assert ledger_unit(engine, binding.ledger_key) == "patient_id"
    assert binding.privacy_unit == "patient_id"
    # The owner's description: the unit and its count, never rows per unit.
    desc = describe(engine, "clinic", OLGA)
    assert desc["privacy_unit"] == "patient_id" and desc["n_units"] == N_PATIENTS
    assert BIG not in _numbers(desc) and not any("per_unit" in k for k in desc)


def test_a_dataset_without_a_unit_reads_as_before(engine: Any, tmp_path: Path) -> None:
    path = _file(tmp_path, "plain.csv", patients_csv(with_unit=False))
    binding, info = register_file(engine, path, name="plain", label_column="label")
    assert "n_units" not in info and info["privacy_unit"] is None
    assert ledger_unit(engine, binding.ledger_key) == "example"
    row = _row(engine, "plain")
    assert "privacy_unit" not in row.config and file_spec(row).privacy_unit is None
    assert resolve(engine, {"name": "plain"}).declared_units is None
    desc = describe(engine, "plain", Viewer(None))
    assert desc["privacy_unit"] == "example" and desc["n_units"] is None
    view = dataset_policy(engine, "plain", Viewer(None))["view"]
    assert "privacy_unit" not in view and "n_units" not in view
    assert view["declared"] == []  # nothing declared at registration


def test_a_missing_unit_column_is_refused_and_stores_nothing(engine: Any, tmp_path: Path) -> None:
    path = _file(tmp_path, "c.csv", patients_csv())
    with pytest.raises(DatasetError, match="person"):
        register_file(engine, path, name="c", label_column="label", privacy_unit="person")
    assert stored_row(engine, "c") is None


def test_n_units_is_a_declared_fact_analysts_see_once_declared(engine: Any, tmp_path: Path) -> None:
    _register(engine, tmp_path)
    # Everything but the number of units declared by value: no grant yet.
    update_policy(
        engine,
        "clinic",
        OLGA,
        view={"n_examples": N_ROWS, "classes": ["0", "1"], "input_shape": [3]},
    )
    with pytest.raises(IllegalState, match="n_units") as refused:
        grants.grant(engine, "clinic", "ana", epsilon_allowance=1, viewer=OLGA, confirm=True)
    assert "--n-units" in str(refused.value) and '"n_units": U' in str(refused.value)
    assert view_of(_row(engine, "clinic")).undeclared() == ["n_units"]
    # The count published as it is: now all four are declared.
    p = update_policy(engine, "clinic", OLGA, declare_counted=True)
    assert p["view"]["declared"] == ["n_examples", "classes", "input_shape", "n_units"]
    assert p["view"]["n_units"] == N_PATIENTS and p["view"]["privacy_unit"] == "patient_id"
    grants.grant(engine, "clinic", "ana", epsilon_allowance=1, viewer=OLGA, confirm=True)
    seen = describe(engine, "clinic", ANA)
    assert seen["privacy_unit"] == "patient_id" and seen["n_units"] == N_PATIENTS
    assert BIG not in _numbers(seen)
    # Withdrawn: the owner still sees the count, the analyst none, and their sweeps wait.
    p = update_policy(engine, "clinic", OLGA, view={"n_units": None})
    assert p["view"]["n_units"] == N_PATIENTS and "n_units" not in p["view"]["declared"]
    assert describe(engine, "clinic", ANA)["n_units"] is None
    assert dataset_policy(engine, "clinic", ANA)["view"]["n_units"] is None
    (listed,) = [d for d in list_datasets(engine, ANA) if d["id"] == "clinic"]
    assert listed["n_units"] is None and listed["privacy_unit"] == "patient_id"
    with pytest.raises(IllegalState, match="n_units"):
        require_declared(_row(engine, "clinic"))
    # Declared by value: plans take it, never the count.
    update_policy(engine, "clinic", OLGA, view={"n_units": 40})
    assert describe(engine, "clinic", ANA)["n_units"] == 40
    assert resolve(engine, {"name": "clinic"}).declared_units == 40


def test_n_units_on_a_dataset_without_a_unit_is_refused(engine: Any, tmp_path: Path) -> None:
    path = _file(tmp_path, "plain.csv", patients_csv(with_unit=False))
    register_file(engine, path, name="plain", label_column="label")
    with pytest.raises(ConfigError) as refused:
        update_policy(engine, "plain", Viewer(None), view={"n_units": 3})
    assert refused.value.field == "view.n_units"


def test_the_unit_is_fixed_for_every_spec(engine: Any, tmp_path: Path) -> None:
    _register(engine, tmp_path)
    row = _row(engine, "clinic")
    for analyst in (True, False):
        # Left out: the owner's fills in (the stored spec carries it); repeated: the same.
        assert apply_view(_spec("clinic"), row, analyst=analyst).dataset.privacy_unit == (
            "patient_id"
        )
        same = apply_view(_spec("clinic", privacy_unit="patient_id"), row, analyst=analyst)
        assert same.dataset.privacy_unit == "patient_id"
        # Another unit: refused for everyone, the owner too, saying how it is set.
        with pytest.raises(ConfigError) as refused:
            apply_view(_spec("clinic", privacy_unit="household"), row, analyst=analyst)
        assert refused.value.field == "dataset.privacy_unit"
        assert "--privacy-unit" in str(refused.value) and "'patient_id'" in str(refused.value)
    path = _file(tmp_path, "plain.csv", patients_csv(with_unit=False))
    register_file(engine, path, name="plain", label_column="label")
    with pytest.raises(ConfigError, match="without a privacy unit") as refused:
        apply_view(_spec("plain", privacy_unit="patient_id"), _row(engine, "plain"), analyst=False)
    assert refused.value.field == "dataset.privacy_unit"
    assert (
        apply_view(_spec("plain"), _row(engine, "plain"), analyst=True).dataset.privacy_unit is None
    )


def test_the_same_records_with_another_unit_are_refused_and_nothing_changes(
    engine: Any, tmp_path: Path
) -> None:
    binding, _ = _register(engine, tmp_path)
    before = _row(engine, "clinic")
    # The same records, their unit column named otherwise: the same identity (the unit column
    # is not part of it), whose ledger counts patient_id.
    renamed = _file(tmp_path, "renamed.csv", patients_csv("person"))
    for name in ("clinic", "clinic-2"):
        with pytest.raises(IllegalState, match="patient_id") as refused:
            register_file(
                engine,
                renamed,
                name=name,
                label_column="label",
                owner="olga",
                privacy_unit="person",
            )
        assert "Nothing stored before changed" in str(refused.value)
    after = _row(engine, "clinic")
    assert (after.config, after.content_sha256, after.storage_path, after.n_examples) == (
        before.config,
        before.content_sha256,
        before.storage_path,
        before.n_examples,
    )
    assert stored_row(engine, "clinic-2") is None
    assert ledger_unit(engine, binding.ledger_key) == "patient_id"
    # Registering again with the same unit is fine (and keeps the ledger).
    again, _ = _register(engine, tmp_path)
    assert again.ledger_key == binding.ledger_key


def test_an_upload_declares_the_unit_and_a_refused_one_leaves_nothing(
    engine: Any, tmp_path: Path
) -> None:
    def upload(text: str, unit: str | None) -> dict[str, Any]:
        return store_upload(
            engine,
            owner="olga",
            content=text.encode(),
            fmt="csv",
            data_dir=tmp_path,
            filename="patients.csv",
            label_column="label",
            declare_counted=True,
            privacy_unit=unit,
        )

    out = upload(patients_csv(), "patient_id")
    assert out["privacy_unit"] == "patient_id" and out["n_units"] == N_PATIENTS
    row = _row(engine, out["id"])
    assert view_of(row).declared == ("n_examples", "classes", "input_shape", "n_units")
    assert ledger_unit(engine, ledger_key_of(engine, out["id"])) == "patient_id"
    with Session(engine) as s:
        count = len(s.scalars(select(Dataset.name)).all())
    with pytest.raises(IllegalState, match="patient_id"):
        upload(patients_csv("person"), "person")
    with Session(engine) as s:
        assert len(s.scalars(select(Dataset.name)).all()) == count
    assert sorted(p.name for p in (tmp_path / "uploads").iterdir()) == [Path(row.storage_path).name]


def test_the_owner_sets_the_unit_later_while_nothing_is_spent(engine: Any, tmp_path: Path) -> None:
    # Registered without a unit: patient_id is a feature (a mistake the owner corrects).
    path = _file(tmp_path, "late.csv", patients_csv())
    register_file(engine, path, name="late", label_column="label", owner="olga")
    update_policy(engine, "late", OLGA, declare_counted=True)
    assert view_of(_row(engine, "late")).input_shape == (4,)
    p = update_policy(engine, "late", OLGA, set_unit=True, privacy_unit="patient_id")
    row = _row(engine, "late")
    assert row.config["privacy_unit"] == "patient_id" and row.config["n_units"] == N_PATIENTS
    # The column left the features: the declared shape and the number of units wait for the
    # owner's declaration.
    assert p["view"]["input_shape"] == [3] and p["view"]["declared"] == ["n_examples", "classes"]
    key = ledger_key_of(engine, "late")
    assert ledger_unit(engine, key) == "patient_id"
    # Once the records' ledger has spent, the unit stays (409), and nothing changes.
    BudgetLedger(engine).reserve(
        key, sweep_id="s1", epsilon=0.5, delta=0.0, privacy_unit="patient_id"
    )
    with pytest.raises(IllegalState, match="was not changed"):
        update_policy(engine, "late", OLGA, view={"privacy_unit": None, "split_seed": 3})
    after = _row(engine, "late")
    assert after.config == row.config and after.content_sha256 == row.content_sha256
    # A bad setting in the same request is refused before the unit changes.
    with pytest.raises(ConfigError):
        update_policy(
            engine, "late", OLGA, set_unit=True, privacy_unit=None, view={"test_fraction": 2.0}
        )
    assert _row(engine, "late").config == row.config
    assert json.dumps(describe(engine, "late", OLGA)).count("per_unit") == 0
