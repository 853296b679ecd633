"""A bad model or dataset (name or option) is refused at submission, naming its field, before
anything is reserved; `dpsweep train` refuses bad model and training flags before it reads data
or charges. The checks read the torch-free descriptors of the model and dataset registries.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError
from dpsweep.spec import load_spec
from sweeper.privacy.ledger import LedgerEntry
from sweeper.store import Sweep, Trial
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.checks import check_spec
from sweeper.sweeps.create import create_sweep

DPSWEEP = str(Path(sys.executable).parent / "dpsweep")


def spec_with_model(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "model-check",
        "dataset": {"name": "digits"},
        "model": model,
        "training": {"steps": 5, "batch_size": 64, "eval_every": 5},
        "privacy": {"budgets": [2], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
    }


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({"name": "resnet9000"}, "model.name"),
        ({"name": "mlp", "options": {"hidden": [0]}}, "model.options.hidden"),
        ({"name": "mlp", "options": {"hidden": [12.5]}}, "model.options.hidden"),
        ({"name": "mlp", "options": {"activation": "sparkle"}}, "model.options.activation"),
        ({"name": "logreg", "options": {"hidden": [8]}}, "model.options.hidden"),
    ],
)
def test_check_spec_refuses_a_bad_model_naming_the_field(model: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        check_spec(load_spec(spec_with_model(model)))
    assert exc.value.field == field


def test_check_spec_accepts_declared_model_options() -> None:
    check_spec(load_spec(spec_with_model({"name": "mlp", "options": {"hidden": [32, 16]}})))


def test_create_sweep_refuses_a_bad_model_option_and_reserves_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sweeps.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        with pytest.raises(ConfigError) as exc:
            create_sweep(engine, spec_with_model({"name": "mlp", "options": {"hidden": [-4]}}))
        assert exc.value.field == "model.options.hidden"
        with Session(engine) as s:
            for table in (Sweep, Trial, LedgerEntry):
                assert s.scalar(select(func.count()).select_from(table)) == 0
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("dataset", "field"),
    [
        ({"name": "synthetic", "options": {"n_samples": -3}}, "dataset.options.n_samples"),
        ({"name": "synthetic", "options": {"n_classes": 1}}, "dataset.options.n_classes"),
        ({"name": "digits", "options": {"zoom": 2}}, "dataset.options.zoom"),
    ],
)
def test_create_sweep_refuses_a_bad_dataset_option_and_reserves_nothing(
    tmp_path: Path, dataset: dict[str, Any], field: str
) -> None:
    url = f"sqlite:///{tmp_path / 'sweeps.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        spec = spec_with_model({"name": "logreg"}) | {"dataset": dataset}
        with pytest.raises(ConfigError) as exc:
            create_sweep(engine, spec)
        assert exc.value.field == field
        with Session(engine) as s:
            for table in (Sweep, Trial, LedgerEntry):
                assert s.scalar(select(func.count()).select_from(table)) == 0
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--momentum", "1.5"], "--momentum"),
        (["--model", "mlp", "--model-option", "hidden=[0]"], "hidden"),
    ],
)
def test_train_refuses_bad_flags_before_charging(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    db = tmp_path / "ledger.db"
    base = [DPSWEEP, "train", "--dataset", "digits", "--steps", "2", "--epsilon", "2", "--json"]
    r = subprocess.run(
        [*base, "--db", f"sqlite:///{db}", *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
    if db.exists():  # a ledger may exist (migrated), but nothing was charged to it
        engine = make_engine(f"sqlite:///{db}")
        try:
            with Session(engine) as s:
                assert s.scalar(select(func.count()).select_from(LedgerEntry)) == 0
        finally:
            engine.dispose()
    assert not r.stdout.strip() or "epsilon" not in json.loads(r.stdout or "{}")
