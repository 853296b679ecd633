"""Issue 54: every epsilon of a dataset with a privacy unit is labelled per unit. The plan
(`dpsweep plan`, its table, notes and JSON), the sweep's summary and `dpsweep show`, the
model card and its README, and a `dpsweep train` charge say "per person_id (unit:
person_id)"; an example-level plan's output is unchanged (real SQLite, real planner, a real
sweep on Ray).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from rich.console import Console
from sqlalchemy.orm import Session, selectinload

from api.cli import main
from api.cli.models import privacy_lines
from api.cli.sweeps import print_results
from dpsweep.spec import DatasetConfig, ModelConfig, TrainingConfig
from sweeper.artifacts.cards import model_card, render_card_markdown
from sweeper.datasets.access import Viewer
from sweeper.driver.loop import run_sweep
from sweeper.driver.ray_backend import ray_session
from sweeper.privacy.ledger.units import ledger_unit
from sweeper.runs.one_off_charge import charge_training_run
from sweeper.runs.single_run import SingleRun, check_single_run, prepare_single_run
from sweeper.settings import SweeperSettings
from sweeper.store import Trial, TrialState
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.summary import summarize
from tests.sweeper.sweeps.test_unit_planning import PEOPLE, people_csv, unit_spec, without_unit

PER = "per person_id (unit: person_id)"


def _plan_output(tmp_path: Path, spec: dict[str, Any], capsys: Any, *extra: str) -> str:
    file = tmp_path / "spec.yaml"
    file.write_text(yaml.safe_dump(spec))
    assert main(["plan", str(file), *extra]) == 0
    return str(capsys.readouterr().out)


def test_the_plan_says_what_it_protects(tmp_path: Path, capsys: Any) -> None:
    path, _ = people_csv(tmp_path / "people.csv")
    text = _plan_output(tmp_path, unit_spec(path), capsys)
    assert PER in text  # the table's title and the whole sweep's line
    assert "grid ε per person_id" in text  # the epsilon columns' headers
    assert "privacy unit person_id: every ε is per person_id" in text
    assert "units (person_id)" in text  # the evaluation statement counts units
    (row,) = json.loads(_plan_output(tmp_path, unit_spec(path), capsys, "--json"))
    assert row["privacy_unit"] == "person_id"
    assert row["n_train"] + row["n_eval"] == PEOPLE
    assert row["sample_rate"] == pytest.approx(8 / row["n_train"])


def test_an_example_level_plan_reads_as_before(tmp_path: Path, capsys: Any) -> None:
    path, _ = people_csv(tmp_path / "people.csv")
    text = _plan_output(tmp_path, without_unit(unit_spec(path)), capsys)
    assert " per " not in text.replace("per trial", "").replace("per grid", "")
    assert "privacy unit" not in text and "units (" not in text
    (row,) = json.loads(_plan_output(tmp_path, without_unit(unit_spec(path)), capsys, "--json"))
    assert row["privacy_unit"] == "example"


@pytest.fixture(scope="module")
def unit_sweep(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A finished sweep on the people CSV (one grid, one trial), its engine and id."""
    tmp = tmp_path_factory.mktemp("unit-sweep")
    path, _ = people_csv(tmp / "people.csv")
    url = f"sqlite:///{tmp / 'u.db'}"
    upgrade(url)
    engine = make_engine(url)
    sid = create_sweep(engine, unit_spec(path))
    with ray_session(SweeperSettings(), workers=1):
        assert run_sweep(engine, sid).state == "done"
    yield engine, sid
    engine.dispose()


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    """A real logistic regression's model_info, weights hash and size (the CSV: 3 -> 2)."""
    from workers.checkpoints import model_info, weights_bytes
    from workers.models.descriptors import ModelSpec
    from workers.models.registry import build_model

    module = build_model(ModelSpec("logreg", {}), input_shape=(3,), num_classes=2, seed=0)
    data = weights_bytes(module)
    info = model_info(
        module, name="logreg", options={}, input_shape=(3,), num_classes=2, engine_path="packed"
    )
    return {
        "model": info,
        "weights_sha256": hashlib.sha256(data).hexdigest(),
        "weights_size_bytes": len(data),
    }


def test_the_summary_and_show_say_per_unit(unit_sweep: Any) -> None:
    engine, sid = unit_sweep
    s = summarize(engine, sid)
    assert s["plan"][0]["privacy_unit"] == "person_id"
    (grid,) = s["privacy"]["grids"]
    assert grid["privacy_unit"] == "person_id" and PER in grid["covers"]
    assert PER in s["privacy"]["sweep"]["covers"]
    assert "units (person_id)" in s["privacy"]["evaluation"]["statement"]
    console = Console(record=True, width=200)
    print_results(console, s)
    shown = console.export_text()
    assert f"privacy {PER}: ε reserved" in shown
    assert f"per person_id for grid {grid['grid']}" in shown


def test_the_csv_export_says_what_each_epsilon_protects(unit_sweep: Any) -> None:
    import csv
    import io

    from sweeper.sweeps.export import export_sweep

    engine, sid = unit_sweep
    rows = list(csv.DictReader(io.StringIO(export_sweep(engine, sid, fmt="csv"))))
    assert rows and all(r["privacy_unit"] == "person_id" for r in rows)
    assert all(float(r["single_run_epsilon"]) > 0 for r in rows)


def test_the_model_card_says_per_unit(unit_sweep: Any, model: dict[str, Any]) -> None:
    engine, sid = unit_sweep
    with Session(engine) as s:
        trial = s.scalars(
            sa.select(Trial)
            .where(Trial.sweep_id == sid, Trial.state == TrialState.done)
            .options(selectinload(Trial.result))
        ).first()
        assert trial is not None
        card = model_card(s, trial, **model)
    assert card["privacy"]["privacy_unit"] == card["dataset"]["privacy_unit"] == "person_id"
    assert PER in card["privacy"]["covers"]
    text = render_card_markdown(card)
    assert f"{PER} at δ" in text
    assert "units (person_id; the sizes count units, not records)" in text
    # `dpsweep model`'s lines, read from the card.
    assert all("per person_id" in line for line in privacy_lines(card))


def test_a_training_run_is_charged_and_labelled_per_unit(tmp_path: Path) -> None:
    path, _ = people_csv(tmp_path / "people.csv")
    url = f"sqlite:///{tmp_path / 't.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        run = SingleRun(
            dataset=DatasetConfig(
                name="csv",
                path=str(path),
                label_column="label",
                privacy_unit="person_id",
                input_bounds=(-4, 4),
            ),
            model=ModelConfig(name="logreg"),
            training=TrainingConfig(steps=5, batch_size=8),
            strategy="fixed",
            accountant="opacus-rdp",
            delta=1e-3,
            epsilon=2.0,
            lrs=(0.1,),
        )
        prepared = prepare_single_run(
            engine, run, Viewer(None), params=check_single_run(run), name="unit-train"
        )
        # q and delta's bound in units: the units the engine samples over.
        assert prepared.privacy_unit == "person_id"
        assert prepared.sample_rate == pytest.approx(8 / prepared.data.planning_n_train)
        assert prepared.data.planning_n_private == PEOPLE
        charge = charge_training_run(engine, prepared, dataset=f"csv:{path}")
        assert charge is not None
        assert charge["privacy_unit"] == "person_id" and PER in charge["covers"]
        with engine.connect() as c:
            (key,) = c.execute(sa.text("SELECT dataset FROM dataset_budgets")).scalars()
        assert ledger_unit(engine, key) == "person_id"
    finally:
        engine.dispose()


def _train(path: Path, db: str, *flags: str) -> list[str]:
    return [
        "train",
        "--dataset",
        "csv",
        "--data-path",
        str(path),
        "--label-column",
        "label",
        "--model",
        "logreg",
        "--epsilon",
        "2",
        "--delta",
        "1e-3",
        "--steps",
        "3",
        "--batch-size",
        "8",
        "--eval-every",
        "3",
        "--db",
        db,
        "--json",
        "--yes",
        *flags,
    ]


def test_dpsweep_train_takes_a_unit_and_says_per_unit(tmp_path: Path, capsys: Any) -> None:
    path, _ = people_csv(tmp_path / "people.csv")
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    flags = ("--privacy-unit", "person_id", "--rows-per-unit", "2", "--unit-bounding", "capped")
    assert main(_train(path, db, *flags)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ledger"]["privacy_unit"] == "person_id" and PER in out["ledger"]["covers"]


def test_dpsweep_train_refuses_unit_flags_on_data_without_a_unit(
    tmp_path: Path, capsys: Any
) -> None:
    path, _ = people_csv(tmp_path / "people.csv")
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    with pytest.raises(SystemExit) as exc:
        main(_train(path, db, "--rows-per-unit", "2"))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--rows-per-unit" in err and "the dataset has no privacy unit" in err
    engine = make_engine(db)
    try:
        with engine.connect() as c:
            charged = c.execute(sa.text("SELECT count(*) FROM budget_ledger_entries")).scalar()
        assert charged == 0  # refused before the charge: nothing spent
    finally:
        engine.dispose()
