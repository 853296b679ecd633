"""Issue 54: planning in units. A dataset with a privacy unit (a CSV's ``person_id`` column) is
planned per person: N, q = b / n_train and delta's bound count units, the plan says what it
protects, and a spec that mixes unit and example accounting, or sets unit options on data
without a unit, is refused before anything is reserved (real SQLite, the real planner).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, DpsweepError, IllegalState
from dpsweep.plan import SweepPlan
from dpsweep.spec import load_spec
from sweeper.datasets.identity import bind_name
from sweeper.privacy.ledger import LedgerEntry
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.units import bind_privacy_unit, ledger_unit
from sweeper.store import Sweep, Trial
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.checks import check_spec, check_units_on_data
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.planning import plan_sweep
from workers.datasets.loading import dataset_content_sha256, load_dataset
from workers.datasets.records import DatasetSpec

#: People in the CSV, and the most rows one of them has.
PEOPLE, MOST_ROWS = 80, 4


def people_csv(path: Path, *, seed: int = 0) -> tuple[Path, int]:
    """A CSV of PEOPLE persons with 1..MOST_ROWS rows each (a ``person_id`` column, three
    features, a label); the file and its number of rows."""
    rng = np.random.default_rng(seed)
    lines = ["person_id,f0,f1,f2,label"]
    for person in range(PEOPLE):
        label = person % 2
        for _ in range(1 + person % MOST_ROWS):
            x = rng.normal(loc=label, scale=1.0, size=3)
            lines.append(f"{person},{x[0]:.4f},{x[1]:.4f},{x[2]:.4f},{label}")
    path.write_text("\n".join(lines) + "\n")
    return path, len(lines) - 1


def unit_spec(path: Path, **over: Any) -> dict[str, Any]:
    """A small spec on the people CSV, its unit declared (``over`` replaces sections)."""
    spec: dict[str, Any] = {
        "name": "people",
        "dataset": {
            "name": "csv",
            "path": str(path),
            "label_column": "label",
            "privacy_unit": "person_id",
            "input_bounds": [-4, 4],
        },
        "model": {"name": "logreg"},
        "training": {"steps": 10, "batch_size": 8, "eval_every": 5},
        "privacy": {"budgets": [2.0], "delta": 1e-3},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
    }
    spec.update(over)
    return spec


def without_unit(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with its dataset's unit left out (each row its own unit)."""
    dataset = {k: v for k, v in spec["dataset"].items() if k != "privacy_unit"}
    return {**spec, "dataset": dataset}


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'units.db'}"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def nothing_stored(engine: Any) -> None:
    """No sweep, trial, ledger entry or ledger row was written."""
    with Session(engine) as s:
        for table in (Sweep, Trial, LedgerEntry):
            assert s.scalar(select(func.count()).select_from(table)) == 0, table


def test_a_unit_dataset_is_planned_in_units(tmp_path: Path) -> None:
    path, rows = people_csv(tmp_path / "people.csv")
    plan = plan_sweep(load_spec(unit_spec(path)))
    (g,) = plan.grids
    # The plan says what it protects, and its sizes count people, never rows.
    assert plan.privacy_unit == g.privacy_unit == "person_id"
    assert plan.has_units and plan.n_units == plan.n_examples == PEOPLE
    assert g.n_train is not None and g.n_eval is not None
    assert g.n_train + g.n_eval == PEOPLE < rows
    # q = b / n_train in units: the units the engine samples over.
    assert g.sample_rate == pytest.approx(8 / g.n_train)
    data = load_dataset(DatasetSpec("csv", path=str(path), label_column="label",
                                    privacy_unit="person_id"))  # fmt: skip
    assert g.n_train == data.n_units_train
    # Stored and read back, the unit stays (older plans read as example-level).
    back = SweepPlan.from_stored(plan.to_stored())
    assert back.privacy_unit == "person_id"
    old = [{k: v for k, v in d.items() if k != "privacy_unit"} for d in plan.to_stored()]
    assert SweepPlan.from_stored(old).privacy_unit == "example"


def test_the_same_rows_without_a_unit_are_planned_per_row(tmp_path: Path) -> None:
    path, rows = people_csv(tmp_path / "people.csv")
    plan = plan_sweep(load_spec(without_unit(unit_spec(path))))
    (g,) = plan.grids
    assert plan.privacy_unit == g.privacy_unit == "example" and not plan.has_units
    assert g.n_train is not None and g.n_eval is not None
    assert g.n_train + g.n_eval == rows


def test_deltas_bound_counts_units(tmp_path: Path) -> None:
    path, rows = people_csv(tmp_path / "people.csv")
    # Between 1/rows and 1/people: too large per row, fine per person.
    delta = 0.5 * (1 / rows + 1 / PEOPLE)
    spec = unit_spec(path, privacy={"budgets": [2.0], "delta": delta})
    (g,) = plan_sweep(load_spec(spec)).grids
    assert g.delta == pytest.approx(delta)
    with pytest.raises(ConfigError, match=f"N = {rows}"):
        plan_sweep(load_spec(without_unit(spec)))
    # At 1/people or more, refused per person too.
    with pytest.raises(ConfigError, match=f"N = {PEOPLE}"):
        plan_sweep(load_spec(unit_spec(path, privacy={"budgets": [2.0], "delta": 1 / PEOPLE})))


@pytest.mark.parametrize("value", [0, 1025, 2.5, True, "4", float("inf")])
def test_a_rows_per_unit_axis_takes_whole_numbers_in_range(tmp_path: Path, value: Any) -> None:
    path, _ = people_csv(tmp_path / "people.csv")
    arm = {"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0], "rows_per_unit": [2, value]}}
    with pytest.raises(ConfigError, match="rows_per_unit") as exc:
        check_spec(load_spec(unit_spec(path, arms=[arm])))
    assert exc.value.field == "arms.fixed.grid.rows_per_unit"
    fixed = {"strategy": "fixed", "grid": {"lr": [0.1]}, "params": {"rows_per_unit": value}}
    with pytest.raises(ConfigError) as exc:
        check_spec(load_spec(unit_spec(path, arms=[fixed])))
    assert exc.value.field == "arms.fixed.params.rows_per_unit"


def test_a_rows_per_unit_axis_plans_on_a_unit_dataset(tmp_path: Path) -> None:
    path, _ = people_csv(tmp_path / "people.csv")
    arm = {"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0], "rows_per_unit": [1, 4]}}
    (g,) = plan_sweep(load_spec(unit_spec(path, arms=[arm]))).grids
    # Two points, one epsilon: rows_per_unit changes no sensitivity.
    assert g.trials == 2 and g.privacy_unit == "person_id"


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"training": {"steps": 10, "batch_size": 8, "unit_bounding": "capped"}},
         "training.unit_bounding"),
        ({"training": {"steps": 10, "batch_size": 8, "rows_per_unit": 2}},
         "training.rows_per_unit"),
        ({"arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "rows_per_unit": [2, 4]}}]},
         "arms.fixed.grid.rows_per_unit"),
        ({"arms": [{"strategy": "fixed", "grid": {"lr": [0.1]}, "params": {"rows_per_unit": 2}}]},
         "arms.fixed.params.rows_per_unit"),
    ],
)  # fmt: skip
def test_unit_settings_on_data_without_a_unit_are_refused_and_spend_nothing(
    engine: Any, tmp_path: Path, over: dict[str, Any], field: str
) -> None:
    path, _ = people_csv(tmp_path / "people.csv")
    spec = without_unit(unit_spec(path, **over))
    with pytest.raises(ConfigError, match="the dataset has no privacy unit") as exc:
        create_sweep(engine, spec)
    assert exc.value.field == field
    nothing_stored(engine)
    # A built-in without a unit likewise.
    with pytest.raises(ConfigError, match="the dataset has no privacy unit") as exc:
        create_sweep(engine, {**spec, "dataset": {"name": "digits"}})
    assert exc.value.field == field
    nothing_stored(engine)


def test_unit_settings_at_their_defaults_pass_on_data_without_a_unit(tmp_path: Path) -> None:
    # A spec dumped and read back (the API plans a copy) carries every default.
    path, _ = people_csv(tmp_path / "people.csv")
    training = {"steps": 10, "batch_size": 8, "unit_bounding": "mean", "rows_per_unit": 8}
    plan = plan_sweep(load_spec(without_unit(unit_spec(path, training=training))))
    assert plan.privacy_unit == "example"


def test_augmentation_on_a_unit_dataset_is_refused_and_spends_nothing(
    engine: Any, tmp_path: Path
) -> None:
    path, _ = people_csv(tmp_path / "people.csv")
    training = {"steps": 10, "batch_size": 8, "augment": {"multiplicity": 2, "ops": ["flip"]}}
    with pytest.raises(ConfigError, match="augmentation is not supported") as exc:
        create_sweep(engine, unit_spec(path, training=training))
    assert exc.value.field == "training.augment"
    nothing_stored(engine)


def test_a_unit_the_data_does_not_have_is_refused(engine: Any, tmp_path: Path) -> None:
    path, _ = people_csv(tmp_path / "people.csv")
    spec = unit_spec(path)
    # digits has no unit: naming one is refused before anything is planned or stored.
    with pytest.raises(DpsweepError, match="privacy_unit"):
        create_sweep(engine, {**spec, "dataset": {"name": "digits", "privacy_unit": "person"}})
    nothing_stored(engine)
    # Records read with their unit (an owner's declaration, a built-in's own) against a spec
    # that names another: one spec is accounted at one level, the data's.
    data = load_dataset(
        DatasetSpec("csv", path=str(path), label_column="label", privacy_unit="person_id")
    )
    other = {**spec, "dataset": {**spec["dataset"], "privacy_unit": "household"}}
    with pytest.raises(ConfigError, match="'household' is not the dataset's") as exc:
        check_units_on_data(load_spec(other), data)
    assert exc.value.field == "dataset.privacy_unit"
    # Leaving it out, or repeating the data's own, passes.
    check_units_on_data(load_spec(without_unit(spec)), data)
    check_units_on_data(load_spec(spec), data)


def test_a_sweep_reserves_at_the_plans_unit(engine: Any, tmp_path: Path) -> None:
    path, _ = people_csv(tmp_path / "people.csv")
    sid = create_sweep(engine, unit_spec(path))
    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        assert sweep is not None
        key = str(sweep.ledger_key)
        plan = SweepPlan.from_stored(sweep.plan)
    assert plan.privacy_unit == "person_id"
    # The reservation bound the records' ledger to the unit: it can never be charged per row.
    assert ledger_unit(engine, key) == "person_id"


def test_a_ledger_bound_to_another_unit_refuses_before_reserving(
    engine: Any, tmp_path: Path
) -> None:
    path, _ = people_csv(tmp_path / "people.csv")
    spec = unit_spec(path)
    # The records' ledger, already spent per row (bound to example) under the spec's name.
    content = dataset_content_sha256(
        DatasetSpec("csv", path=str(path), label_column="label", privacy_unit="person_id")
    )
    key = bind_name(engine, f"csv:{path}", content).ledger_key
    bind_privacy_unit(engine, key, None)
    with pytest.raises(IllegalState, match="per row"):  # HTTP 409
        create_sweep(engine, spec)
    # Nothing reserved, nothing stored; the ledger keeps its unit.
    nothing_stored(engine)
    assert ledger_unit(engine, key) == "example"
    assert BudgetLedger(engine).summary(key).epsilon_reserved == 0


def test_a_rows_per_unit_axis_is_not_tuned_on_public_records(tmp_path: Path) -> None:
    # Public tuning records have no units: such a point could not be tried there.
    path, _ = people_csv(tmp_path / "people.csv")
    arm = {
        "strategy": "fixed",
        "tune_on": "mnist1d-test",
        "grid": {"lr": [0.1, 0.5], "rows_per_unit": [2, 4]},
    }
    with pytest.raises(ConfigError, match="no privacy unit") as exc:
        check_spec(load_spec(unit_spec(path, arms=[arm])))
    assert exc.value.field == "arms.fixed.tune_on"


def test_the_people_example_plans_per_person_over_the_built_in_people() -> None:
    """examples/mnist1d-people.yaml (the README's pointer) plans per person: q = b / people."""
    root = Path(__file__).resolve().parents[3]
    spec = load_spec(root / "examples" / "mnist1d-people.yaml")
    plan = plan_sweep(spec)
    assert plan.privacy_unit == "person"
    for grid in plan.grids:
        assert grid.privacy_unit == "person"
        assert grid.sample_rate == pytest.approx(spec.training.batch_size / 381)
    # Two caps of a person's rows: a grid axis, which changes no epsilon.
    assert {len(plan.grids)} == {len(spec.privacy.budgets)}
