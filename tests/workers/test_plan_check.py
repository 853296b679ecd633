"""Plan equals run: a trial touches data only with the q, T, sigma, strategy and data that its
reservation was planned for (workers/plan_check.py, the runner's check before charging, and
the worker's check after loading)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session

from sweeper.driver.failures import PLAN_MISMATCH, for_category
from sweeper.driver.loop import run_sweep
from sweeper.driver.ray_backend import ray_session
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.rows import EntryKind
from sweeper.settings import SweeperSettings
from sweeper.store import Sweep, Trial, TrialState
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec
from workers.models import ModelSpec
from workers.plan_check import PlanMismatch, PlannedRun, check_plan
from workers.training.loop import train_pack
from workers.training.specs import PackSpec, TrialSpec

PLANNED = PlannedRun(
    strategy="fixed", sample_rate=0.05, steps=30, noise_multiplier=1.25, dataset_sha256="ab" * 32
)
HONEST: dict[str, Any] = {
    "strategy": "fixed",
    "sample_rate": 0.05,
    "steps": 30,
    "noise_multipliers": [1.25, 1.25],
    "dataset_sha256": "ab" * 32,
}


def test_the_planned_run_passes() -> None:
    check_plan(PLANNED, **HONEST)


@pytest.mark.parametrize(
    "change, says",
    [
        ({"strategy": "automatic"}, "strategy"),
        ({"sample_rate": 0.05 * (1 + 2**-52)}, "sample rate"),
        ({"steps": 31}, "steps"),
        ({"noise_multipliers": [1.25, 1.2499999]}, "noise multiplier of 1 trial"),
        ({"noise_multipliers": [None, 1.25]}, "noise multiplier"),
        ({"dataset_sha256": "cd" * 32}, "records differ"),
    ],
)
def test_any_difference_is_refused(change: dict[str, Any], says: str) -> None:
    with pytest.raises(PlanMismatch, match=says) as err:
        check_plan(PLANNED, **(HONEST | change))
    # The hash of the records is never shown: it would let a guesser test candidate data.
    assert "ab" * 32 not in str(err.value) and "cd" * 32 not in str(err.value)


@settings(max_examples=60, deadline=None)
@given(
    q=st.floats(1e-6, 1.0),
    steps=st.integers(1, 10**6),
    sigma=st.floats(0.1, 100.0),
    factor=st.sampled_from([0.5, 0.999, 1.001, 2.0]),
)
def test_a_scaled_quantity_never_passes(q: float, steps: int, sigma: float, factor: float) -> None:
    planned = PlannedRun("fixed", q, steps, sigma, None)
    honest = {
        "strategy": "fixed",
        "sample_rate": q,
        "steps": steps,
        "noise_multipliers": [sigma],
        "dataset_sha256": None,
    }
    check_plan(planned, **honest)
    for name, value in (
        ("sample_rate", q * factor),
        ("noise_multipliers", [sigma * factor]),
        ("steps", steps + (1 if factor > 1 or steps == 1 else -1)),
    ):
        with pytest.raises(PlanMismatch):
            check_plan(planned, **(honest | {name: value}))


def _digits_csv(path: Path) -> Path:
    """The digits dataset as a CSV file a user might register."""
    data = load_dataset(DatasetSpec("digits"))
    x = np.concatenate([data.x_train, data.x_test]).reshape(-1, 64)
    y = np.concatenate([data.y_train, data.y_test])
    cols = [f"p{i}" for i in range(64)]
    lines = [",".join([*cols, "label"])]
    lines += [
        ",".join([*(f"{v:.6g}" for v in row), str(int(c))]) for row, c in zip(x, y, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _pack(path: Path, planned: PlannedRun | None) -> PackSpec:
    return PackSpec(
        dataset=DatasetSpec("csv", path=str(path), label_column="label"),
        model=ModelSpec("logreg"),
        strategy="fixed",
        trials=[TrialSpec(lr=0.1, noise_multiplier=1.25, params={"clip": 1.0})],
        batch_size=64,
        steps=5,
        eval_every=5,
        randomness="reproducible",
        planned=planned,
    )


def test_the_worker_refuses_data_edited_after_the_plan(tmp_path: Path) -> None:
    path = _digits_csv(tmp_path / "digits.csv")
    data = load_dataset(DatasetSpec("csv", path=str(path), label_column="label"))
    planned = PlannedRun("fixed", 64 / data.n_train, 5, 1.25, data.content_sha256)
    steps: list[int] = []
    assert len(train_pack(_pack(path, planned), progress=lambda p: steps.append(p.step))) == 1
    assert steps == [1, 2, 3, 4, 5]
    # One pixel of one record changes: same N (so the same q and T), other records.
    text = path.read_text().splitlines()
    first = text[1].split(",")
    first[10] = "16" if first[10] != "16" else "0"
    text[1] = ",".join(first)
    path.write_text("\n".join(text) + "\n")
    steps.clear()
    with pytest.raises(PlanMismatch, match="records differ"):
        train_pack(_pack(path, planned), progress=lambda p: steps.append(p.step))
    assert steps == []  # refused before the first step


@pytest.fixture(scope="module")
def local_ray() -> Any:
    import ray

    with ray_session(SweeperSettings(), workers=2):
        yield ray


@pytest.mark.parametrize("edit", ["one value", "more rows"])
def test_a_sweep_on_an_edited_file_refuses_and_charges_nothing(
    tmp_path: Path, local_ray: Any, edit: str
) -> None:
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    upgrade(url)
    engine = make_engine(url)
    path = _digits_csv(tmp_path / "digits.csv")
    spec = {
        "name": "edited",
        "dataset": {"name": "csv", "path": str(path), "label_column": "label"},
        "model": {"name": "logreg"},
        "training": {"steps": 5, "batch_size": 64, "eval_every": 5},
        "privacy": {"budgets": [2.0], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1, 0.5], "clip": [1.0]}}],
    }
    sid = create_sweep(engine, spec)
    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        assert sweep is not None
        key = sweep.ledger_key or sweep.dataset
    reserved = BudgetLedger(engine).sweep_balance(key, sweep_id=sid).epsilon_reserved
    assert reserved > 0
    lines = path.read_text().splitlines()
    if edit == "one value":
        row = lines[1].split(",")
        row[20] = "15" if row[20] != "15" else "1"
        lines[1] = ",".join(row)
    else:
        lines += lines[1:40]
    path.write_text("\n".join(lines) + "\n")

    run_sweep(engine, sid)

    with Session(engine) as s:
        trials = list(s.scalars(sa.select(Trial).where(Trial.sweep_id == sid)))
    assert trials and all(t.state == TrialState.failed for t in trials)
    # What its owner sees is the failure's category and fixed reason (issue 36): the check's
    # own message names the sample rate the edited file implies, which goes to the log only.
    refused = f"not run, and not charged: {for_category(PLAN_MISMATCH).text}"
    for t in trials:
        assert t.error == refused
        assert "reserved for" in t.error and not re.search(r"\d", t.error)
    entries = BudgetLedger(engine).entries(key, sid)
    assert not [e for e in entries if e.kind == EntryKind.CHARGE]
    balance = BudgetLedger(engine).sweep_balance(key, sweep_id=sid)
    assert balance.epsilon_charged == 0 and balance.epsilon_released == reserved
    assert BudgetLedger(engine).summary(key).epsilon_spent == 0
    engine.dispose()
