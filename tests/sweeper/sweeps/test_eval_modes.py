"""The three evaluation modes end to end (real SQLite, real Ray, the CLI's `show --json`):
what epsilon covers in each, and what each releases.

* carve-out (default): tests/sweeper/privacy/test_releases.py;
* public: a separately registered dataset its owner declared public; all private records
  are trained on;
* dp: noisy accuracy, charged in each grid's epsilon and the ledger.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from api.cli import main
from dpsweep.errors import ConfigError
from sweeper.datasets.identity import ledger_key_of
from sweeper.datasets.registration import register_file
from sweeper.driver.loop import run_sweep
from sweeper.driver.ray_backend import ray_session
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.settings import SweeperSettings
from sweeper.store import Sweep
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from tests.sweeper.sweeps.test_sweep import tiny_spec
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec


@pytest.fixture(scope="module")
def local_ray() -> Any:
    import ray

    with ray_session(SweeperSettings(), workers=2):
        yield ray


def _engine(tmp_path: Path) -> tuple[str, Any]:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    upgrade(url)
    return url, make_engine(url)


def _show(url: str, sid: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["show", sid, "--json", "--db", url]) == 0
    return json.loads(capsys.readouterr().out)


def _csv(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    cols = [f"p{i}" for i in range(x.shape[1])]
    lines = [",".join([*cols, "label"])]
    lines += [",".join([*(f"{v:g}" for v in r), str(int(c))]) for r, c in zip(x, y, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _digits_files(tmp_path: Path) -> tuple[Path, Path, int, int]:
    """Digits as two CSVs: 1500 private records and 297 public ones (raw 0-16 pixels)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = d.data, d.target
    private = _csv(tmp_path / "private.csv", x[:1500], y[:1500])
    public = _csv(tmp_path / "public.csv", x[1500:], y[1500:])
    return private, public, 1500, len(y) - 1500


def test_public_evaluation_dataset_end_to_end(
    tmp_path: Path, local_ray: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url, engine = _engine(tmp_path)
    private, public, n_private, n_public = _digits_files(tmp_path)
    register_file(engine, private, name="clinic", label_column="label")
    register_file(engine, public, name="clinic-public", label_column="label", public=True)
    bounds = {"name": "clinic"}

    # Not declared public: refused at the edge, naming the field, and nothing is stored.
    register_file(engine, public, name="clinic-unsure", label_column="label")
    with pytest.raises(ConfigError, match="not declared public") as err:
        create_sweep(engine, tiny_spec(dataset=bounds, eval={"dataset": "clinic-unsure"}))
    assert err.value.field == "eval.dataset"
    with engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(Sweep)).scalar() == 0

    sid = create_sweep(engine, tiny_spec(dataset=bounds, eval={"dataset": "clinic-public"}))
    assert run_sweep(engine, sid).state == "done"
    s = _show(url, sid, capsys)
    plan = s["plan"][0]
    # Every private record is trained on; the evaluation records are the public file's.
    assert (plan["n_train"], plan["n_eval"]) == (n_private, n_public)
    assert plan["eval_mode"] == "public" and plan["eval_dataset"] == "clinic-public"
    ev = s["privacy"]["evaluation"]
    assert ev["mode"] == "public" and ev["protected"] is True
    assert ev["statement"].startswith(f"ε covers the {n_private} training records")
    assert "'clinic-public'" in ev["statement"] and "declared public" in ev["statement"]
    # Exact metrics are fine on public records: calibration is released.
    assert main(["export", sid, "--format", "json", "--db", url]) == 0
    trials = json.loads(capsys.readouterr().out)["trials"]
    assert trials and all(t["state"] == "done" for t in trials)
    assert all(t["metrics"].get("ece") is not None for t in trials)
    engine.dispose()


def test_dp_evaluation_end_to_end(
    tmp_path: Path, local_ray: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url, engine = _engine(tmp_path)
    spec = tiny_spec(eval={"mode": "dp"})
    sid = create_sweep(engine, spec)
    assert run_sweep(engine, sid).state == "done"
    s = _show(url, sid, capsys)

    data = load_dataset(DatasetSpec("digits", evaluation="dp"))
    n_train, n_eval = data.n_train, len(data.y_test)
    assert n_train + n_eval == 1797
    for g in s["plan"]:
        assert g["eval_mode"] == "dp" and (g["n_train"], g["n_eval"]) == (n_train, n_eval)
        # 20 steps, an evaluation every 10, plus the fresh measurement of the chosen one.
        assert g["eval_releases"] == 3 and g["eval_noise_multiplier"] > 0
        # The grid's epsilon covers training and evaluation, and fits the budget.
        assert 0 < g["epsilon_eval"] < g["epsilon_total"] <= g["epsilon_budget"]
    ev = s["privacy"]["evaluation"]
    assert ev["mode"] == "dp" and ev["protected"] is True
    assert ev["statement"].startswith("ε covers all 1797 records")
    assert "noisy counts" in ev["statement"]

    # What was charged is each grid's epsilon, evaluations included.
    # (The run-by-run charge schedule composes in another order: never below the plan's.)
    spent = float(BudgetLedger(engine).summary(ledger_key_of(engine, "digits")).epsilon_spent)
    planned = sum(g["epsilon_total"] for g in s["plan"])
    assert planned <= spent <= planned * (1 + 1e-6)
    assert spent <= sum(g["epsilon_budget"] for g in s["plan"])

    # Released metrics: noisy accuracy only, never an exact count over the evaluation records.
    assert main(["export", sid, "--format", "json", "--db", url]) == 0
    trials = json.loads(capsys.readouterr().out)["trials"]
    assert trials and all(t["state"] == "done" for t in trials)
    for t in trials:
        assert t["metrics"].get("ece") is None and t["metrics"].get("loss") is None
        assert 0.0 <= t["metrics"]["accuracy"] <= 1.0
    counts = [t["metrics"]["accuracy"] * n_eval for t in trials]
    assert any(abs(c - round(c)) > 1e-6 for c in counts)
    # The CSV export says how every row's metrics were protected.
    assert main(["export", sid, "--format", "csv", "--db", url]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows and {r["evaluation"] for r in rows} == {"dp"}
    assert "ece" not in rows[0] and "loss" not in rows[0]
    # No calibration is released, so there is no accuracy-vs-calibration front.
    assert s["pareto"]["calibration"] == [] and s["pareto"]["epsilon"]
    engine.dispose()


def test_dp_evaluation_refuses_scaling_by_private_records(tmp_path: Path) -> None:
    """Tabular data without declared bounds would be scaled by statistics of the evaluation
    records, which are private in DP evaluation: refused at planning, naming the field."""
    _, engine = _engine(tmp_path)
    spec = tiny_spec(dataset={"name": "breast_cancer"}, eval={"mode": "dp"})
    with pytest.raises(ConfigError) as err:
        create_sweep(engine, spec)
    assert err.value.field == "dataset.input_bounds"
    engine.dispose()
