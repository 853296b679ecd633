"""Public pre-tuning end to end (real planner, real training on MNIST-1D's public test part, real
SQLite): refusals before anything is reserved, and a plan whose grid is centred on the best
public point with K and sigma unchanged, whose trials are created from the centred grid."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from dpsweep.errors import ConfigError
from dpsweep.plan import GridPlan
from dpsweep.spec import load_spec
from sweeper.datasets.registration import register_file
from sweeper.privacy.ledger.rows import LedgerEntry
from sweeper.store import Sweep, Trial
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep, spec_hash
from sweeper.sweeps.planning import plan_sweep
from sweeper.sweeps.summary import summarize

pytest.importorskip("mnist1d")

LRS = [0.5, 2.0, 8.0]


def _spec(**arm: Any) -> dict[str, Any]:
    return {
        "name": "tuned",
        "dataset": {"name": "mnist1d"},
        "eval": {"mode": "public", "dataset": "mnist1d-test"},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "training": {"epochs": 1, "batch_size": 64, "eval_every": 25},
        "privacy": {"budgets": [3], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": LRS, "clip": [0.1, 1.0]}, **arm}],
        "seeds": 1,
        "search": {"method": "grid"},
        "objective": {"metric": "accuracy", "mode": "max"},
    }


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 't.db'}"
    upgrade(url)
    e = make_engine(url)
    yield e
    e.dispose()


def _nothing_stored(engine: Any) -> None:
    with engine.connect() as c:
        for table in (Sweep, Trial, LedgerEntry):
            assert c.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 0


def test_tune_on_with_tpe_is_refused_before_anything_is_reserved(engine: Any) -> None:
    spec = _spec(tune_on="mnist1d-test")
    spec["search"] = {"method": "tpe", "n": 3}
    with pytest.raises(ConfigError, match="tpe") as err:
        create_sweep(engine, spec)
    assert err.value.field == "arms.fixed.tune_on"
    _nothing_stored(engine)


@pytest.mark.parametrize(
    ("name", "why"),
    [("digits", "not a dataset declared public"), ("mnist1d", "training dataset")],
)
def test_tune_on_a_dataset_not_declared_public_is_refused(engine: Any, name: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as err:
        create_sweep(engine, _spec(tune_on=name))
    assert err.value.field == "arms.fixed.tune_on"
    _nothing_stored(engine)
    # Without a database (local planning) the same.
    with pytest.raises(ConfigError) as err:
        plan_sweep(load_spec(_spec(tune_on=name)))
    assert err.value.field == "arms.fixed.tune_on"


def _csv(path: Path, features: int, rows: int = 60) -> Path:
    rng = np.random.default_rng(0)
    lines = [",".join([*(f"f{i}" for i in range(features)), "label"])]
    for r in range(rows):
        lines.append(",".join([*(f"{v:.3f}" for v in rng.normal(size=features)), str(r % 10)]))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_registered_public_records_must_fit_the_model(engine: Any, tmp_path: Path) -> None:
    # Declared public, but 64 inputs against MNIST-1D's 40: the model cannot be the same.
    register_file(
        engine, _csv(tmp_path / "wide.csv", 64), name="wide", label_column="label", public=True
    )
    # The right shape, but its owner did not declare it public.
    register_file(engine, _csv(tmp_path / "same.csv", 40), name="unsure", label_column="label")
    with pytest.raises(ConfigError, match="do not fit the model") as err:
        create_sweep(engine, _spec(tune_on="wide"))
    assert err.value.field == "arms.fixed.tune_on"
    with pytest.raises(ConfigError, match="not declared public") as err:
        create_sweep(engine, _spec(tune_on="unsure"))
    assert err.value.field == "arms.fixed.tune_on"
    with engine.connect() as c:
        for table in (Sweep, Trial):
            assert c.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 0


def test_a_tuned_plan_centres_the_grid_and_keeps_k_and_sigma(engine: Any) -> None:
    untuned = plan_sweep(load_spec(_spec()))
    plan = plan_sweep(load_spec(_spec(tune_on="mnist1d-test")))
    (g,) = plan.grids
    (u,) = untuned.grids
    assert u.tuned_on is None and u.tuned_grid is None
    # The privacy plan is the untuned one: same K, sigma, steps and epsilon.
    assert (g.trials, g.noise_multiplier, g.steps_per_trial, g.epsilon_total) == (
        u.trials,
        u.noise_multiplier,
        u.steps_per_trial,
        u.epsilon_total,
    )
    assert g.tuned_on == "mnist1d-test"
    assert g.tuned_params is not None and g.tuned_params["lr"] in LRS
    assert g.tuned_params["clip"] in (0.1, 1.0)
    assert g.tuned_score is not None and 0.0 <= g.tuned_score <= 1.0
    # The centring rule: each list times best / geometric mean of its values.
    assert g.tuned_grid is not None
    for axis, values in (("lr", LRS), ("clip", [0.1, 1.0])):
        gm = math.exp(sum(map(math.log, values)) / len(values))
        want = [v * g.tuned_params[axis] / gm for v in values]
        assert g.tuned_grid[axis] == pytest.approx(want, rel=1e-12)
    # Stored and read back, the tuned fields round-trip.
    assert GridPlan.from_stored(g.to_stored()) == g

    # The submission plans again (public seeds: the same centring), and its trials carry the
    # centred values.
    sid = create_sweep(engine, _spec(tune_on="mnist1d-test"))
    with engine.connect() as c:
        stored = c.execute(sa.select(Sweep.plan).where(Sweep.id == sid)).scalar_one()
        params = list(c.execute(sa.select(Trial.params).where(Trial.sweep_id == sid)).scalars())
    (kept,) = stored
    assert kept["tuned_grid"] == g.tuned_grid and kept["tuned_params"] == g.tuned_params
    assert len(params) == g.trials == len(LRS) * 2
    want_points = sorted((lr, clip) for lr in g.tuned_grid["lr"] for clip in g.tuned_grid["clip"])
    assert sorted((p["lr"], p["clip"]) for p in params) == want_points
    # `dpsweep show` and the API's sweep say so too.
    (shown,) = summarize(engine, sid)["plan"]
    assert (shown["tuned_on"], shown["tuned_grid"]) == ("mnist1d-test", g.tuned_grid)


def test_a_spec_without_tune_on_keeps_its_resume_hash() -> None:
    spec = load_spec(_spec())
    before = spec.model_dump(mode="json", exclude={"resources", "artifacts"})
    for arm in before["arms"]:
        del arm["tune_on"]  # the dump as it was before the key existed
    for key in ("physical_batch_size", "augment", "tune_batch_scale"):
        del before["training"][key]  # likewise the training section's (issue 53)
    for key in ("unit_bounding", "rows_per_unit"):
        del before["training"][key]  # and the unit settings at their defaults (issue 54)
    del before["dataset"]["privacy_unit"]  # and a dataset without a unit
    old = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    assert spec_hash(spec) == old
    assert spec_hash(load_spec(_spec(tune_on="mnist1d-test"))) != old
