"""The pack trainer's parts (issue 50): preparation, records, measurement, and no upward import."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsweep.errors import ConfigError, PrivacyError
from tests.workers.training.test_dp_evaluation import _pack
from workers.datasets import load_dataset
from workers.plan_check import check_pack
from workers.training.measure import PackMeasure
from workers.training.prepare import prepare_pack
from workers.training.records import PackRecords


def test_the_trainer_and_the_engine_never_import_the_audit() -> None:
    """The audit imports the trainer; the arrows point one way (workers.canary_hook)."""
    code = (
        "import sys, workers.training.loop, workers.engine; "
        "bad = [m for m in sys.modules if m.startswith('workers.canary_audit')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=20),
    st.booleans(),
)
def test_records_select_the_best_evaluation(values: list[float], maximise: bool) -> None:
    records = PackRecords(1, objective="accuracy", maximise=maximise, flat=torch.zeros(1, 3))
    for step, v in enumerate(values, start=1):
        flat = torch.full((1, 3), float(step))
        records.record_evaluation(step, [{"accuracy": v, "reliability": [1]}], [True], flat)
    best = max(values) if maximise else min(values)
    first = values.index(best) + 1  # a tie keeps the earlier checkpoint
    assert records.best_step == [first] and records.best_metrics[0]["accuracy"] == best
    assert torch.equal(records.best_flat[0], torch.full((3,), float(first)))
    assert records.best_kept == ["raw"]
    assert all("reliability" not in h for h in records.history[0])


def test_records_mark_divergence_and_never_select_it() -> None:
    records = PackRecords(2, objective="accuracy", maximise=True, flat=torch.zeros(2, 1))
    flat = torch.ones(2, 1)
    records.record_evaluation(1, [{"accuracy": 0.5}, {"accuracy": 0.6}], [True, True], flat)
    records.record_evaluation(2, [{"accuracy": math.nan}, {"accuracy": 0.9}], [True, False], flat)
    assert records.diverged_at == [2, 2]
    assert records.best_step == [1, 1]  # neither the NaN nor the non-finite weights' 0.9
    assert records.history[0][-1] == {"step": 2, "diverged": True}
    assert records.last_metrics == [{"accuracy": 0.5}, {"accuracy": 0.6}]


def test_dp_evaluation_refuses_a_release_beyond_the_plan() -> None:
    """Fail closed: one more noisy evaluation than the plan charged raises, before it is made."""
    pack = prepare_pack(_pack(), dataset=None, canaries=None)
    try:
        assert pack.dp_eval and pack.n_releases > 0
        records = PackRecords(pack.k, objective="accuracy", maximise=True, flat=pack.model.flat)
        measure = PackMeasure(pack, records)
        assert measure.n_diag == 0  # no diagnostics on private evaluation records
        for _ in range(pack.n_releases):
            measure.measure()
        with pytest.raises(PrivacyError, match="more noisy counts than planned"):
            measure.measure()
    finally:
        pack.engine.noise.close()


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"trials": []}, "trials"), ({"eval_every": 0}, "training.eval_every")],
)
def test_prepare_refuses_bad_settings_before_loading(changes: dict, field: str) -> None:

    from workers.datasets.records import DatasetSpec

    # A dataset that cannot load: the settings are refused before it is touched.
    spec = replace(_pack(), dataset=DatasetSpec("csv", path="/nonexistent.csv"), **changes)
    with pytest.raises(ConfigError) as err:
        prepare_pack(spec, dataset=None, canaries=None)
    assert err.value.field == field


def test_the_expected_batch_size_is_the_plans_not_the_records_count() -> None:
    # b = q N divides every release and sizes the quantile count's noise: under one declared
    # size, a dataset and its neighbour without one training record must get the same b.
    spec = _pack()
    counted = load_dataset(spec.dataset)
    declared = replace(counted, declared_size=counted.n_private + 37)
    neighbour = replace(declared, x_train=declared.x_train[1:], y_train=declared.y_train[1:])
    sizes = []
    for data in (declared, neighbour):
        q, _ = check_pack(spec, data)
        engine = prepare_pack(spec, dataset=data, canaries=None).engine
        assert engine.n == data.n_train  # sampling runs over the records there are
        assert engine.expected_batch_size == pytest.approx(q * data.planning_n_train)
        sizes.append(engine.expected_batch_size)
    assert sizes[0] == sizes[1]
    # With no declaration the plan counts, and the two agree.
    q, _ = check_pack(spec, counted)
    engine = prepare_pack(spec, dataset=counted, canaries=None).engine
    assert engine.expected_batch_size == pytest.approx(q * counted.n_train)
