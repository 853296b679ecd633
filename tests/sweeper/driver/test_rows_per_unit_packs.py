"""rows_per_unit (an arm's grid axis, issue 54) is the unit step's R, not a strategy param:
trials of different values never share a pack, and the strategy never sees it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dpsweep.spec import SweepSpec
from sweeper.driver.packs import pack_spec
from workers.pack_keys import pack_key


def _spec() -> SweepSpec:
    return SweepSpec.model_validate(
        {
            "name": "rows",
            "dataset": {"name": "digits"},
            "model": {"name": "mlp", "options": {"hidden": [8]}},
            "training": {"steps": 2, "batch_size": 16, "unit_bounding": "capped"},
            "privacy": {"budgets": [4], "delta": 1e-5},
            "arms": [{"strategy": "fixed", "grid": {"lr": [0.5], "clip": [1.0]}}],
        }
    )


def _trial(rows: int | None, tid: str) -> SimpleNamespace:
    params = {"lr": 0.5, "clip": 1.0, **({"rows_per_unit": rows} if rows is not None else {})}
    return SimpleNamespace(
        id=tid, arm="fixed", strategy="fixed", params=params, seed=0,
        noise_multiplier=1.0, target_delta=1e-5,
    )  # fmt: skip


def test_rows_per_unit_splits_packs_and_stays_out_of_the_strategy() -> None:
    spec = _spec()
    p2 = pack_spec(spec, [_trial(2, "a"), _trial(2, "b")], dataset=None, accountant="pld")
    p4 = pack_spec(spec, [_trial(4, "c")], dataset=None, accountant="pld")
    assert (p2.rows_per_unit, p4.rows_per_unit) == (2, 4)
    assert p2.unit_bounding == "capped"  # the training section's
    assert all("rows_per_unit" not in t.params for t in p2.trials)
    assert pack_key(p2) != pack_key(p4)
    assert pack_key(pack_spec(spec, [_trial(2, "d")], dataset=None, accountant="pld")) == (
        pack_key(p2)
    )
    with pytest.raises(ValueError, match="mixes trials of rows_per_unit"):
        pack_spec(spec, [_trial(2, "e"), _trial(4, "f")], dataset=None, accountant="pld")
    # Without the axis, the training section's (default 8).
    assert pack_spec(spec, [_trial(None, "g")], dataset=None, accountant="pld").rows_per_unit == 8
