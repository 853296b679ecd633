"""A plug-in package adds one of each kind and runs a sweep (issue 39, "done when").

The distribution ``dpsweep-testplugins`` (``tests/plugin_pkg``: its package and its
``pyproject.toml``) adds, each through its documented entry-point group, the strategy
``testplug-clip``, the model ``testplug-mlp``, the accountant ``testplug-rdp`` and the dataset
format ``testplug-ssv``. The test writes the distribution's ``*.dist-info`` (the entry points
read from that ``pyproject.toml``) into a temporary folder, puts it and the package on
``sys.path`` here and on the ``PYTHONPATH`` that a local Ray's workers inherit, registers an
``.ssv`` file under a name, and runs a real sweep (create_sweep, then the driver on a real local
Ray) that uses all four. Nothing in this process registers the plug-ins by hand: every registry
here and in the workers finds them through their entry points.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sweeper.datasets.registration import register_file
from sweeper.driver.loop import run_sweep
from sweeper.driver.ray_backend import ray_session
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.rows import EntryKind
from sweeper.settings import SweeperSettings
from sweeper.store import Sweep, SweepState, Trial, TrialState
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from workers.accounting import registry as accounting_registry
from workers.accounting.registry import cached_epsilon, clear_epsilon_cache
from workers.datasets.descriptors import DATASET_DESCRIPTORS
from workers.datasets.registry import DATASETS
from workers.models.descriptors import DESCRIPTORS as MODEL_DESCRIPTORS
from workers.models.registry import MODELS
from workers.plugins import GROUPS, reset_plugins
from workers.strategies.base import STRATEGIES
from workers.strategies.descriptors import DESCRIPTORS as STRATEGY_DESCRIPTORS

ROOT = Path(__file__).resolve().parents[3]
PACKAGE_ROOT = ROOT / "tests" / "plugin_pkg"
DISTRIBUTION = "dpsweep_testplugins"

# The plug-ins' names, as the package spells them (read from its source, not imported here, so
# that the package is imported only through its entry points).
STRATEGY = "testplug-clip"
MODEL = "testplug-mlp"
ACCOUNTANT = "testplug-rdp"
DATASET_FORMAT = "testplug-ssv"


def _entry_points_txt() -> str:
    """``entry_points.txt`` for the distribution: exactly its ``pyproject.toml``'s groups."""
    project = tomllib.loads((PACKAGE_ROOT / "pyproject.toml").read_text())["project"]
    groups = project["entry-points"]
    assert set(groups) == set(GROUPS.values()), "the package adds one of each kind"
    return "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
        for group, eps in groups.items()
    )


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The distribution installed for this process and for the Ray workers it starts; every
    registry restored afterwards (the plug-ins are dropped)."""
    site = tmp_path / "site"
    info = site / f"{DISTRIBUTION}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: dpsweep-testplugins\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text(_entry_points_txt())
    paths = [str(site), str(PACKAGE_ROOT)]
    inherited = filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([*paths, str(ROOT), *inherited]))
    saved: list[tuple[dict[str, object], dict[str, object]]] = [
        (registry, dict(registry))  # type: ignore[arg-type]
        for registry in (
            STRATEGY_DESCRIPTORS,
            STRATEGIES,
            accounting_registry._REGISTRY,
            MODEL_DESCRIPTORS,
            MODELS,
            DATASET_DESCRIPTORS,
            DATASETS,
        )
    ]
    sys.path[:0] = paths
    importlib.invalidate_caches()  # the new dist-info is found by a fresh scan
    reset_plugins()
    try:
        yield
    finally:
        for path in paths:
            sys.path.remove(path)
        for module in [m for m in sys.modules if m.split(".")[0] == DISTRIBUTION]:
            del sys.modules[module]
        for registry, before in saved:
            registry.clear()
            registry.update(before)
        clear_epsilon_cache()
        importlib.invalidate_caches()
        reset_plugins()


@pytest.fixture
def own_ray(plugins: None) -> Iterator[None]:
    """A local Ray started after the PYTHONPATH was set (so that its workers inherit it)."""
    import ray

    if ray.is_initialized():  # another module's Ray would not know the plug-ins
        pytest.skip("a Ray is already running in this process")
    with ray_session(SweeperSettings(), workers=1):
        yield


def _ssv(path: Path, n: int = 160) -> None:
    """Two separable classes as semicolon-separated values, the label column last."""
    rng = np.random.default_rng(0)
    y = np.arange(n) % 2
    x = rng.normal(size=(n, 3)) + 2.0 * y[:, None]
    rows = ["a;b;c;label"]
    rows += [
        ";".join([*(f"{v:.6f}" for v in r), "yes" if c else "no"])
        for r, c in zip(x, y, strict=True)
    ]
    path.write_text("\n".join(rows) + "\n")


def test_a_plugin_package_adds_one_of_each_kind_and_runs_a_sweep(
    tmp_path: Path, own_ray: None
) -> None:
    url = f"sqlite:///{tmp_path / 'plugins.db'}"
    upgrade(url)
    engine = make_engine(url)
    data = tmp_path / "records.ssv"
    _ssv(data)
    # The format is told by the file's suffix: the plug-in's descriptor declares ``.ssv``.
    binding, info = register_file(engine, data, name="plug-records", label_column="label")
    assert info["n_examples"] == 160
    with Session(engine) as s:
        (fmt,) = s.scalars(sa.text("SELECT format FROM datasets WHERE name = 'plug-records'"))
    assert fmt == DATASET_FORMAT

    spec = {
        "name": "all-plugins",
        "dataset": {"name": "plug-records", "test_fraction": 0.25},
        "model": {"name": MODEL, "options": {"width": 4}},
        "training": {"epochs": 1, "batch_size": 16, "eval_every": 4},
        "privacy": {"budgets": [4], "delta": 1e-3, "accountant": ACCOUNTANT},
        "arms": [{"strategy": STRATEGY, "grid": {"lr": [0.5, 0.1], "clip": [1.0]}}],
    }
    sid = create_sweep(engine, spec)

    # The plan names the plug-in accountant, and its epsilon figures are that accountant's.
    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        assert sweep is not None
        (grid,) = sweep.plan
    assert grid["accountant"] == ACCOUNTANT
    assert grid["trials"] == 2 and grid["noise_multiplier"] > 0
    assert 0 < grid["epsilon_total"] <= grid["epsilon_budget"] == 4
    assert grid["epsilon_total"] == pytest.approx(
        cached_epsilon(
            ACCOUNTANT,
            noise_multiplier=grid["noise_multiplier"],
            sample_rate=grid["sample_rate"],
            steps=grid["trials"] * grid["steps_per_trial"],
            target_delta=grid["delta"],
        )
    )
    # The second, independent accountant verified it too.
    assert math.isfinite(grid["epsilon_verified"]) and grid["verified_by"]

    outcome = run_sweep(engine, sid)
    assert outcome.state == SweepState.done.value, outcome

    with Session(engine) as s:
        trials = list(s.scalars(sa.select(Trial).where(Trial.sweep_id == sid)))
        results = {t.id: t.result for t in trials}
        assert len(trials) == 2
        assert all(t.state == TrialState.done for t in trials), [t.error for t in trials]
        assert {t.strategy for t in trials} == {STRATEGY}
        assert sorted(t.params["lr"] for t in trials) == [0.1, 0.5]
        for result in results.values():
            assert result is not None and result.accountant == ACCOUNTANT
            assert result.epsilon is not None and 0 < result.epsilon <= 4
        stored_model = s.get(Sweep, sid).spec["model"]["name"]  # type: ignore[union-attr]
    assert stored_model == MODEL

    # The ledger of the registered records charged each trial's run.
    ledger = BudgetLedger(engine)
    charges = [e for e in ledger.entries(binding.ledger_key, sid) if e.kind == EntryKind.CHARGE]
    assert {e.trial_id for e in charges} == set(results)
    balance = ledger.sweep_balance(binding.ledger_key, sweep_id=sid)
    assert 0 < balance.epsilon_charged <= balance.epsilon_reserved
    engine.dispose()
