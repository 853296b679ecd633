"""Refused work costs nothing (issue 37, items 1 and 2).

A model the generic path refuses (BatchNorm, Dropout) and a grid value a strategy refuses
(``clip: 0``) are refused by the one check that ``dpsweep plan``, ``dpsweep run``, ``dpsweep
train`` and the API's plan (``POST /api/v1/sweeps:plan``) and submit (``POST /api/v1/sweeps``)
share, before any reservation or charge. Every test reads the ledger's totals (every dataset's
spent and reserved, every ledger entry, every sweep) before and after each refusal, on SQLite
and on PostgreSQL, with one earlier spend in place so that the totals are not empty.

The models come from a tiny plug-in distribution written here: its ``module:function``
factories for the command line, and its entry point registering the same builders under
names for the API (which resolves registered names only; its planning processes are spawned
and find the distribution on ``sys.path``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.orm import Session

from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.rows import DatasetBudget, LedgerEntry, SweepTotals
from sweeper.store import Sweep
from sweeper.store.engine import make_engine
from tests.conftest import sqlite_or_postgres_url
from tests.workers.test_plugins import write_distribution

MODULE = "dpsweep_refused_models"

# Sequentials the packed path does not cover (BatchNorm1d and Dropout have no packed layer),
# so the generic path takes them, and refuses them.
CODE = '''
"""Models the generic DP path refuses: as local factories, and registered by an entry point."""

import math


def bn_net(input_shape, num_classes):
    from torch import nn

    features = int(math.prod(input_shape))
    return nn.Sequential(
        nn.Flatten(), nn.Linear(features, 8), nn.BatchNorm1d(8), nn.ReLU(),
        nn.Linear(8, num_classes),
    )


def dropout_net(input_shape, num_classes):
    from torch import nn

    features = int(math.prod(input_shape))
    return nn.Sequential(
        nn.Flatten(), nn.Linear(features, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, num_classes)
    )


def register():
    from workers.models.descriptors import ModelDescriptor
    from workers.models.registry import register_model

    register_model(ModelDescriptor(name="refused-bn-net", description="BatchNorm"))(
        lambda input_shape, num_classes: bn_net(input_shape, num_classes)
    )
    register_model(ModelDescriptor(name="refused-dropout-net", description="Dropout"))(
        lambda input_shape, num_classes: dropout_net(input_shape, num_classes)
    )
'''

#: (the CLI's factory, the API's registered name, what the refusal names, the fix it says)
MODELS = {
    "batchnorm": (f"{MODULE}:bn_net", "refused-bn-net", "BatchNorm1d", "GroupNorm"),
    "dropout": (f"{MODULE}:dropout_net", "refused-dropout-net", "Dropout", "probability to 0"),
}


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database at head, with one earlier spend on another dataset's ledger."""
    url = sqlite_or_postgres_url(request, tmp_path)
    engine = make_engine(url)
    try:
        ledger = BudgetLedger(engine)
        ledger.reserve("earlier", sweep_id="s0", epsilon=Decimal("2"), delta=Decimal("1e-6"))
        ledger.charge(
            "earlier", sweep_id="s0", trial_id="t0", epsilon=Decimal("1"), delta=Decimal("1e-7")
        )
    finally:
        engine.dispose()
    return url


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The plug-in distribution on ``sys.path`` (spawned planners inherit it); every registry
    it adds to is restored afterwards."""
    from workers import plugins
    from workers.factories import FACTORIES_ENV
    from workers.models.descriptors import DESCRIPTORS
    from workers.models.registry import MODELS as BUILDERS
    from workers.models.registry import load_builtin_models

    load_builtin_models()  # before the copy: restoring it must keep them

    folder = tmp_path / "site"
    folder.mkdir()
    write_distribution(
        folder, MODULE, f"[dpsweep.models]\nrefused = {MODULE}:register\n", {"__init__.py": CODE}
    )
    monkeypatch.syspath_prepend(str(folder))
    # `dpsweep run` exports its factories to the environment of the workers it starts.
    monkeypatch.setenv(FACTORIES_ENV, "")
    descriptors, builders = dict(DESCRIPTORS), dict(BUILDERS)
    plugins.reset_plugins()
    try:
        yield folder
    finally:
        DESCRIPTORS.clear()
        DESCRIPTORS.update(descriptors)
        BUILDERS.clear()
        BUILDERS.update(builders)
        plugins.reset_plugins()


def totals(url: str) -> dict[str, Any]:
    """Everything a refusal must leave as it was: every ledger's spent and reserved, and how
    many ledger entries, sweep totals and sweeps there are."""
    engine = make_engine(url)
    try:
        with Session(engine) as s:
            budgets = sorted(
                (b.dataset, b.epsilon_spent, b.delta_spent, b.epsilon_reserved, b.delta_reserved)
                for b in s.scalars(sa.select(DatasetBudget))
            )
            counts = [
                s.scalar(sa.select(sa.func.count()).select_from(t)) or 0
                for t in (LedgerEntry, SweepTotals, Sweep)
            ]
        return {"budgets": budgets, "counts": counts}
    finally:
        engine.dispose()


def spec(model: str, **arm: Any) -> dict[str, Any]:
    """A small sweep of ``model`` on digits (one arm, one level)."""
    return {
        "name": f"refused-{model.replace(':', '-')}",
        "dataset": {"name": "digits"},
        "model": {"name": model},
        "training": {"steps": 5, "batch_size": 64, "eval_every": 5},
        "privacy": {"budgets": [2.0], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], **arm.get("grid", {})}}],
    }


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run ``dpsweep ARGS`` here; its exit code and its one-line error."""
    from api.cli import main

    try:
        code = main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    return code, " ".join(err.split())


def write(tmp_path: Path, body: dict[str, Any]) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_the_cli_refuses_a_refused_model_before_any_charge(
    kind: str, url: str, site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    factory, _, layer, fix = MODELS[kind]
    before = totals(url)
    path = write(tmp_path, spec(factory))
    for args in (
        ["plan", path, "--db", url],
        ["run", path, "--db", url, "--quiet"],
        ["train", "--model", factory, "--epsilon", "2", "--steps", "5", "--db", url],
    ):
        code, err = cli(args, capsys)
        assert code == 2, (args, err)
        assert layer in err and fix in err, err
        assert totals(url) == before, args


def test_plan_run_and_train_refuse_clip_zero_alike(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = totals(url)
    path = write(tmp_path, spec("mlp", grid={"clip": [0, 1.0]}))
    for args in (
        ["plan", path, "--db", url],
        ["run", path, "--db", url, "--quiet"],
        ["train", "--clip", "0", "--epsilon", "2", "--steps", "5", "--db", url],
    ):
        code, err = cli(args, capsys)
        assert code == 2, (args, err)
        assert "clip must be > 0" in err, err
        assert totals(url) == before, args


def test_the_api_refuses_them_with_a_422_naming_the_field(url: str, site: Path) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.settings import ApiSettings

    before = totals(url)
    app = create_app(ApiSettings(auth=False, planner_processes=1), database_url=url)
    headers = {"Content-Type": "application/yaml"}
    cases = [
        (spec(name), "model.name", (layer, fix)) for _, name, layer, fix in MODELS.values()
    ] + [(spec("mlp", grid={"clip": [0, 1.0]}), "arms.fixed.grid.clip", ("clip must be > 0",))]
    with TestClient(app) as client:
        for body, field, words in cases:
            for route in ("/api/v1/sweeps:plan", "/api/v1/sweeps"):
                r = client.post(route, content=yaml.safe_dump(body), headers=headers)
                assert r.status_code == 422, (route, r.text)
                problem = r.json()
                assert problem["errors"][0]["field"] == field, problem
                assert all(w in problem["detail"] for w in words), problem
                assert totals(url) == before, (route, field)


def test_the_model_check_is_cheap_for_a_declared_packed_model() -> None:
    """A built-in model declared packed is checked from its descriptor: planning it (the
    demo's path, in the API's planning processes too) imports no torch."""
    import subprocess
    import sys

    code = textwrap.dedent(
        """
        import sys
        from types import SimpleNamespace
        from dpsweep.spec import SweepSpec
        from sweeper.sweeps.checks import check_model_on_data

        spec = SweepSpec.model_validate({
            "name": "x", "dataset": {"name": "digits"}, "model": {"name": "cnn"},
            "training": {"steps": 5, "batch_size": 64},
            "privacy": {"budgets": [1.0], "delta": 1e-5},
            "arms": [{"strategy": "fixed", "grid": {"lr": [0.1]}}],
        })
        data = SimpleNamespace(input_shape=(1, 8, 8), num_classes=10, vocab_size=None)
        assert check_model_on_data(spec, data) == "packed"
        assert "torch" not in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
