"""Audits at the unit level (issue 54): on data with a privacy unit every canary is a whole unit
of several rows, sampled at the unit rate and bounded as one unit, and the claim is the plan's
epsilon per unit.

The real mechanism on ``mnist1d-people`` (public, 1-50 rows per person) never shows more than
it claims, under both boundings; a planted fault (the 1/m_u weighting of a unit's rows patched
away, so that a canary unit of 8 rows contributes 8 times its bound) is caught by the bound;
a canary unit contributes exactly one clipped canary whatever its rows; and black-box canary
units are appended whole and left out whole.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import workers.unit_step as unit_step_module
from workers.accounting.compute import calibrate_noise_multiplier
from workers.canary_audit.canaries import GradientCanaries, layer_ranges
from workers.canary_audit.inputs import with_input_canaries
from workers.canary_audit.run import AuditResult, run_audit
from workers.datasets.loading import load_dataset
from workers.datasets.records import Dataset, DatasetSpec
from workers.engine import DPEngine
from workers.generic.dispatch import build_pack_model
from workers.models.descriptors import ModelSpec
from workers.optim import PackedOptimizer
from workers.strategies import NoiseSource, get_strategy
from workers.training.specs import PackSpec, TrialSpec
from workers.unit_step import unit_sums
from workers.units import UnitBatch

DELTA = 1e-5


@pytest.fixture(scope="module")
def people() -> Dataset:
    return load_dataset(DatasetSpec(name="mnist1d-people"))


def audit(
    data: Dataset,
    *,
    bounding: str = "mean",
    epsilon: float = 8.0,
    steps: int = 10,
    canaries: int = 200,
    canary_rows: int = 4,
    trials: int = 2,
    setting: str = "white-box",
) -> AuditResult:
    """A full-batch unit-level audit (q = 1 over the units: where the bound comes nearest)."""
    n_units = data.n_units_train
    sigma = calibrate_noise_multiplier(
        target_epsilon=epsilon,
        target_delta=DELTA,
        sample_rate=1.0,
        steps=steps * trials,
        accountant="rdp",
    )
    spec = PackSpec(
        dataset=DatasetSpec(name="mnist1d-people"),
        model=ModelSpec("mlp", {}),
        strategy="fixed",
        trials=[
            TrialSpec(
                lr=0.3 + 0.1 * i,
                seed=i,
                noise_multiplier=sigma,
                target_delta=DELTA,
                params={"clip": 1.0},
            )
            for i in range(trials)
        ],
        batch_size=n_units,
        steps=steps,
        accountant="rdp",
        unit_bounding=bounding,
        rows_per_unit=8,
    )
    return run_audit(
        spec,
        setting=setting,  # type: ignore[arg-type]
        canaries=canaries,
        dataset=data,
        public_data=True,
        canary_rows=canary_rows,
    )


@pytest.mark.parametrize("bounding", ["mean", "capped"])
def test_a_unit_audit_never_shows_more_than_its_claim_per_unit(
    people: Dataset, bounding: str
) -> None:
    result = audit(people, bounding=bounding)
    assert result.privacy_unit == "person" and result.canary_rows == 4 and result.trials == 2
    assert result.epsilon_claimed == pytest.approx(8.0, rel=0.02)
    # Not vacuous: the canary units are found, and never beyond the claim.
    assert 0.5 < result.epsilon_lower_bound <= result.epsilon_claimed, result
    assert not result.exceeds_claim
    assert "The audit is per unit (unit: person)" in result.verdict
    assert result.to_dict()["privacy_unit"] == "person"


def test_a_missing_one_over_m_u_is_caught_at_the_unit_level(
    people: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planted fault: a unit's rows weigh 1 each instead of 1/m_u (and the per-unit check
    is disabled, as a bug that slipped past it would be): a canary unit of 8 rows moves the
    release by 8 times its bound, and the bound exceeds the claim per unit."""
    monkeypatch.setattr(UnitBatch, "row_share", lambda self: self.mask)
    monkeypatch.setattr(unit_step_module, "_check_unit_sum", lambda *a, **k: None)
    monkeypatch.setattr(unit_step_module, "_check_unit_scalar", lambda *a, **k: None)
    result = audit(people, epsilon=1.0, canaries=1000, canary_rows=8)
    assert result.exceeds_claim and result.epsilon_lower_bound > result.epsilon_claimed, result


def _engine(bounding: str, canary_rows: int) -> tuple[DPEngine, GradientCanaries]:
    """An engine over 6 data units of 1-3 rows, with 2 canary units (both included)."""
    torch.manual_seed(0)
    model, _ = build_pack_model([torch.nn.Sequential(torch.nn.Linear(5, 3))])
    can = GradientCanaries(
        2,
        ranges=layer_ranges(model),
        numel=int(model.numel),
        device=torch.device("cpu"),
        direction="dirac",
        unit_rows=canary_rows,
    )
    can.included = np.ones(2, dtype=bool)
    can.ids_in = torch.arange(2)
    units = np.array([0, 1, 1, 2, 3, 3, 3, 4, 5, 5])
    g = torch.Generator().manual_seed(1)
    engine = DPEngine(
        model=model,  # type: ignore[arg-type]
        strategy=get_strategy("fixed")(
            [{"clip": 0.5}], n_layers=model.n_param_layers, device="cpu"
        ),
        optimizer=PackedOptimizer("sgd", torch.full((1,), 0.1)),
        x=torch.randn(10, 5, generator=g),
        y=torch.randint(0, 3, (10,), generator=g),
        task="classification",
        sample_rate=0.5,
        noise_multiplier=torch.ones(1),
        sample_streams=[],
        noise=NoiseSource([], "cpu"),
        canaries=can,
        units=units,
        unit_bounding=bounding,
        rows_per_unit=8,
    )
    return engine, can


@pytest.mark.parametrize("bounding", ["mean", "capped"])
def test_a_canary_unit_contributes_one_clipped_canary_whatever_its_rows(bounding: str) -> None:
    for rows in (1, 4, 8):
        engine, can = _engine(bounding, rows)
        assert engine.n == 6 + 2  # the canary units are units of the sampler
        # Canary unit 1 alone (rows n_data + rows .. n_data + 2 rows - 1).
        idx = torch.tensor([[10 + rows + j for j in range(rows)] + [0] * (8 - rows)])
        mask = (torch.arange(8) < rows).float().view(1, 8)
        batch = UnitBatch(idx=idx, mask=mask, counts=torch.tensor([[float(rows)]]), rows_per_unit=8)
        _, totals, _ = unit_sums(engine, batch)
        assert can.entered == rows
        # Exactly the canary's direction at the clip norm 0.5, from every row count.
        got = totals[0][0] * engine.expected_batch_size
        torch.testing.assert_close(got, 0.5 * can.directions[1], atol=1e-5, rtol=1e-4)


def test_black_box_canary_units_are_appended_and_left_out_whole(people: Dataset) -> None:
    data = dataclasses.replace(people, declared_units=400)
    bb = with_input_canaries(data, 50, rows=4)
    n_in = int(bb.included.sum())
    out = bb.data
    assert out.n_train == data.n_train + 4 * n_in
    assert out.declared_units == 400 + 25
    units = out.units_train
    assert units is not None and out.n_units_train == data.n_units_train + n_in
    assert set(np.unique(units)) == set(range(out.n_units_train))  # dense
    # Each new unit is exactly one included canary's 4 rows; no left-out canary row is there.
    rows_of = {tuple(r) for r in out.x_train.tolist()}
    for j in range(50):
        canary = bb.x[4 * j : 4 * j + 4]
        present = [tuple(r) in rows_of for r in canary.tolist()]
        assert all(present) if bb.included[j] else not any(present)
    for u in range(data.n_units_train, out.n_units_train):
        xs = out.x_train[units == u]
        assert len(xs) == 4
        got = {tuple(r) for r in xs.tolist()}
        sets = [{tuple(r) for r in bb.x[4 * c : 4 * c + 4].tolist()} for c in range(50)]
        assert got in sets  # one whole canary, and nothing else


def test_a_black_box_unit_audit_runs_per_unit(people: Dataset) -> None:
    result = audit(people, setting="black-box", canaries=100, steps=20, trials=1)
    assert result.privacy_unit == "person" and result.canary_rows == 4
    assert 0.0 <= result.epsilon_lower_bound <= result.epsilon_claimed
    assert "per unit" in result.verdict
