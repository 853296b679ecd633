"""Issue 54 over real HTTP and the real CLI: an owner uploads (or registers) a CSV with a
``patient_id`` column as the privacy unit; analysts see the unit and, once declared, the
number of units (never rows per unit); the unit is fixed for every spec; one ledger keeps
one unit.

One ``dpsweep serve`` without a scheduler (sweeps are planned, reserved and stored, not run)
on a SQLite file; ``olga`` owns the data, ``ana`` is her analyst.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from api.cli import main
from api.testing.server import Server, start_server
from sweeper.datasets.identity import ledger_key_of
from sweeper.privacy.ledger.units import ledger_unit
from sweeper.store import Sweep
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.api.test_api import assert_problem
from tests.sweeper.datasets.test_privacy_units import BIG, N_PATIENTS, N_ROWS, patients_csv

V1 = "/api/v1"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("unit-datasets")
    url = f"sqlite:///{work / 'api.db'}"
    upgrade(url)
    s = start_server(url, work, scheduler=False)
    yield s
    s.stop()


def _spec(dataset: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "per-patient",
        "dataset": {"name": dataset, **extra},
        "model": {"name": "logreg"},
        "training": {"steps": 4, "batch_size": 8},
        "privacy": {"budgets": [1.0], "delta": 1e-5},
        "eval": {"mode": "dp"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
    }


def _upload(c: Any, text: str, unit: str) -> Any:
    return c.post(
        f"{V1}/datasets",
        files={"file": ("patients.csv", text.encode(), "text/csv")},
        data={"format": "csv", "label_column": "label", "privacy_unit": unit},
    )


def _shown_rows_per_unit(body: Any) -> bool:
    """Whether a response shows the big patient's row count, or a rows-per-unit field."""
    text = json.dumps(body)
    return "per_unit" in text or f": {BIG}," in text or f": {BIG}}}" in text


def test_units_over_http(server: Server) -> None:
    olga, ana = (server.client(server.token(n)) for n in ("olga", "ana"))
    r = _upload(olga, patients_csv(), "patient_id")
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    assert r.json()["privacy_unit"] == "patient_id" and r.json()["n_units"] == N_PATIENTS
    assert not _shown_rows_per_unit(r.json())
    # Everything but the number of units declared: no analyst yet (409, saying what to do).
    view = {"n_examples": N_ROWS, "classes": ["0", "1"], "input_shape": [3]}
    view |= {"input_bounds": [-5.0, 5.0]}
    r = olga.put(f"{V1}/datasets/{ds}/policy", json={"view": view})
    assert r.status_code == 200 and r.json()["view"]["privacy_unit"] == "patient_id", r.text
    grant = {"analyst": "ana", "epsilon_allowance": 3.0}
    body = assert_problem(olga.post(f"{V1}/datasets/{ds}/grants", json=grant), 409)
    assert "n_units" in body["detail"]
    r = olga.put(f"{V1}/datasets/{ds}/policy", json={"view": {"n_units": N_PATIENTS}})
    assert r.status_code == 200 and "n_units" in r.json()["view"]["declared"], r.text
    assert olga.post(f"{V1}/datasets/{ds}/grants", json=grant).status_code == 201
    # The analyst sees "per patient" and the declared number, never rows per unit.
    seen = ana.get(f"{V1}/datasets/{ds}").json()
    assert seen["privacy_unit"] == "patient_id" and seen["n_units"] == N_PATIENTS
    (listed,) = [d for d in ana.get(f"{V1}/datasets").json()["items"] if d["id"] == ds]
    assert listed["n_units"] == N_PATIENTS and not _shown_rows_per_unit(listed)
    # Withdrawn: null for the analyst, and their sweep waits for the declaration (409).
    olga.put(f"{V1}/datasets/{ds}/policy", json={"view": {"n_units": None}})
    assert ana.get(f"{V1}/datasets/{ds}").json()["n_units"] is None
    assert ana.get(f"{V1}/datasets/{ds}/policy").json()["view"]["n_units"] is None
    assert_problem(ana.post(f"{V1}/sweeps", json=_spec(ds)), 409)
    olga.put(f"{V1}/datasets/{ds}/policy", json={"view": {"n_units": N_PATIENTS}})
    # Another unit: refused before anything is planned or reserved, for the owner too.
    for who in (ana, olga):
        for path in ("/sweeps:plan", "/sweeps"):
            r = who.post(f"{V1}{path}", json=_spec(ds, privacy_unit="household"))
            body = assert_problem(r, 422, field="dataset.privacy_unit")
            assert "--privacy-unit" in body["detail"]
    assert ana.get(f"{V1}/datasets/{ds}/budget").json()["epsilon_used"] == 0
    # Left out: the stored sweep's spec carries the owner's unit.
    r = ana.post(f"{V1}/sweeps", json=_spec(ds))
    assert r.status_code == 201, r.text
    engine = make_engine(server.db_url)
    try:
        with Session(engine) as session:
            stored = session.get(Sweep, r.json()["id"])
            assert stored is not None and stored.spec["dataset"]["privacy_unit"] == "patient_id"
    finally:
        engine.dispose()
    # The same records with another unit: 409, and the first upload is unchanged.
    before = olga.get(f"{V1}/datasets/{ds}").json()
    r = _upload(olga, patients_csv("person"), "person")
    body = assert_problem(r, 409)
    assert "patient_id" in body["detail"]
    assert olga.get(f"{V1}/datasets/{ds}").json() == before
    ids = [d["id"] for d in olga.get(f"{V1}/datasets").json()["items"]]
    assert ids.count(ds) == 1 and len([i for i in ids if i.startswith("ds_")]) == 1
    # Once its ledger has reserved, the owner cannot change the unit (409).
    r = olga.put(f"{V1}/datasets/{ds}/policy", json={"privacy_unit": None})
    assert "was not changed" in assert_problem(r, 409)["detail"]


def _cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(list(argv)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_units_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    upgrade(url)
    db = ["--db", url]
    first = tmp_path / "patients.csv"
    first.write_text(patients_csv())
    register = ["datasets", "register", str(first), "--name", "clinic", "--label-column", "label"]
    out = _cli_json(capsys, *register, "--privacy-unit", "patient_id", "--json", *db)
    assert out["privacy_unit"] == "patient_id" and out["n_units"] == N_PATIENTS
    assert main([*register, "--privacy-unit", "patient_id", *db]) == 0
    assert "privacy unit: patient_id" in capsys.readouterr().out
    p = _cli_json(capsys, "datasets", "policy", "clinic", "--declare-counted", "--json", *db)
    assert p["view"]["n_units"] == N_PATIENTS and "n_units" in p["view"]["declared"]
    assert main(["datasets", "policy", "clinic", *db]) == 0
    assert "units: 30 (declared public)" in capsys.readouterr().out
    # The same records, the unit column named otherwise: another unit than their ledger's.
    renamed = tmp_path / "renamed.csv"
    renamed.write_text(patients_csv("person"))
    again = ["datasets", "register", str(renamed), "--name", "clinic", "--label-column", "label"]
    assert main([*again, "--privacy-unit", "person", *db]) == 1
    assert "patient_id" in capsys.readouterr().err
    listed = {r["name"]: r for r in _cli_json(capsys, "datasets", "list", "--json", *db)}
    assert listed["clinic"]["privacy_unit"] == "patient_id"
    shown = _cli_json(capsys, "datasets", "show", "clinic", "--json", *db)
    assert shown["privacy_unit"] == "patient_id"
    assert main(["datasets", "show", "clinic", *db]) == 0
    assert "budgeted per patient_id" in capsys.readouterr().out
    # Registered without a unit (the column is a feature), set later while nothing is spent.
    late = ["datasets", "register", str(first), "--name", "late", "--label-column", "label"]
    assert main([*late, *db]) == 0
    capsys.readouterr()
    p = _cli_json(
        capsys, "datasets", "policy", "late", "--privacy-unit", "patient_id", "--json", *db
    )
    assert p["view"]["privacy_unit"] == "patient_id" and p["view"]["input_shape"] == [3]
    engine = make_engine(url)
    try:
        assert ledger_unit(engine, ledger_key_of(engine, "late")) == "patient_id"
    finally:
        engine.dispose()
