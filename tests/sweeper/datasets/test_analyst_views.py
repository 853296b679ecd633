"""What analysts see of a dataset and what its owner reads of their use, on SQLite and
PostgreSQL: descriptions, lists, budgets, grant summaries, the audit log's pages and tenant
isolation, and the policy's merge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, DatasetNotFound, IllegalState, PermissionDenied
from sweeper.datasets import grants
from sweeper.datasets.access import Viewer
from sweeper.datasets.analyst_views import audit_page, dataset_policy, update_policy
from sweeper.datasets.uploads import store_upload
from sweeper.datasets.views import budget, describe, list_datasets
from sweeper.privacy import release_log
from sweeper.privacy.ledger.amounts import ZERO
from sweeper.store import Sweep
from sweeper.store.cursors import encode_cursor
from sweeper.sweeps.create import create_sweep

OLGA, ANA, BEA, MALLORY = Viewer("olga"), Viewer("ana"), Viewer("bea"), Viewer("mallory")
ADMIN = Viewer("root", admin=True)


@pytest.fixture
def engine(both_engines: Any) -> Any:
    return both_engines


def _content() -> bytes:
    rng = np.random.default_rng(1)
    x = np.round(rng.normal(size=(200, 3)), 3)
    lines = ["a,b,c,label"] + [
        ",".join(repr(float(v)) for v in row) + f",{int(row[0] > 0)}" for row in x
    ]
    return ("\n".join(lines) + "\n").encode()


def _upload(engine: Any, tmp_path: Path, owner: str) -> str:
    ds = str(
        store_upload(
            engine,
            owner=owner,
            content=_content(),
            fmt="csv",
            data_dir=tmp_path / owner,
            label_column="label",
            declare_counted=True,
        )["id"]
    )
    # DP evaluation scales by declared bounds only: the owner declares them in the view.
    grants.set_policy(engine, ds, Viewer(owner), view={"input_bounds": [-5.0, 5.0]})
    return ds


def _sweep(engine: Any, ds: str, owner: str) -> str:
    spec = {
        "name": f"{owner}-s",
        "dataset": {"name": ds, "input_bounds": [-5.0, 5.0]},
        "model": {"name": "logreg"},
        "training": {"steps": 4, "batch_size": 32, "eval_every": 2},
        "privacy": {"budgets": [1], "delta": 1e-5},
        "eval": {"mode": "dp"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
    }
    return create_sweep(engine, spec, owner=owner)


def _log(engine: Any, sweep_id: str, trial_ids: list[str]) -> None:
    with Session(engine) as s, s.begin():
        sweep = s.get(Sweep, sweep_id)
        assert sweep is not None
        for t in trial_ids:
            release_log.record(
                s, sweep, trial_id=t, kind="model", grid=None, epsilon=ZERO, delta=ZERO
            )


def test_analysts_see_the_public_description_their_allowance_and_their_sweeps(
    engine: Any, tmp_path: Path
) -> None:
    ds = _upload(engine, tmp_path, "olga")
    with pytest.raises(DatasetNotFound):
        describe(engine, ds, ANA)
    grants.grant(engine, ds, "ana", epsilon_allowance=3, viewer=OLGA, confirm=True)
    grants.grant(engine, ds, "bea", epsilon_allowance=0.1, viewer=OLGA, confirm=True)
    seen = describe(engine, ds, ANA)
    assert seen["role"] == "analyst" and seen["n_examples"] == 200
    assert not {"sha256", "size_bytes", "owner", "budget", "grants"} & set(seen)
    assert seen["allowance"] == {
        "epsilon_allowance": 3.0,
        "epsilon_used": 0.0,
        "epsilon_left": 3.0,
        "active": True,
    }
    assert [d for d in list_datasets(engine, ANA) if d["id"] == ds] == [seen]
    assert ds not in {d["id"] for d in list_datasets(engine, MALLORY)}
    with pytest.raises(DatasetNotFound):
        describe(engine, ds, MALLORY)
    # The owner's summary of the active grants: exact sums (3 + 0.1 is 3.1).
    assert describe(engine, ds, OLGA)["grants"] == {"active": 2, "epsilon_allowance": 3.1}

    first, second = _sweep(engine, ds, "ana"), _sweep(engine, ds, "ana")
    mine = budget(engine, ds, ANA)
    assert mine["role"] == "analyst" and 1.9 < mine["epsilon_used"] <= 2.0
    assert {s["sweep"] for s in mine["sweeps"]} == {first, second}
    assert "epsilon_committed" not in mine
    assert {s["owner"] for s in budget(engine, ds, OLGA)["sweeps"]} == {"ana"}
    assert budget(engine, ds, BEA)["sweeps"] == []


def test_the_audit_log_pages_and_stays_within_the_tenant(engine: Any, tmp_path: Path) -> None:
    ds = _upload(engine, tmp_path, "olga")
    grants.grant(engine, ds, "ana", epsilon_allowance=5, viewer=OLGA, confirm=True)
    grants.grant(engine, ds, "bea", epsilon_allowance=5, viewer=OLGA, confirm=True)
    _log(engine, _sweep(engine, ds, "ana"), ["a1", "a2", "a3"])
    _log(engine, _sweep(engine, ds, "bea"), ["b1"])
    # Mallory uploads the same records: a ledger of her own, her releases are not Olga's.
    other = _upload(engine, tmp_path, "mallory")
    _log(engine, _sweep(engine, other, "mallory"), ["m1"])

    first = audit_page(engine, ds, OLGA, limit=2)
    assert [e["trial_id"] for e in first.items] == ["a1", "a2"] and first.next_cursor
    rest = audit_page(engine, ds, OLGA, cursor=first.next_cursor, limit=10)
    assert [e["trial_id"] for e in rest.items] == ["a3", "b1"] and rest.next_cursor is None
    after = audit_page(engine, ds, OLGA, after=first.items[0]["id"]).items
    assert [e["trial_id"] for e in after] == ["a2", "a3", "b1"]
    assert [e["trial_id"] for e in audit_page(engine, ds, ANA).items] == ["a1", "a2", "a3"]
    assert [e["trial_id"] for e in audit_page(engine, ds, OLGA, analyst="bea").items] == ["b1"]
    assert audit_page(engine, ds, ANA, analyst="bea").items == []
    assert [e["trial_id"] for e in audit_page(engine, other, MALLORY).items] == ["m1"]
    for bad in ("garbage", encode_cursor([2**70]), encode_cursor(["1"])):
        with pytest.raises(ConfigError):
            audit_page(engine, ds, OLGA, cursor=bad)
    # An admin reads every release on the dataset's ledger (Mallory's is another).
    assert len(audit_page(engine, ds, ADMIN).items) == 4
    with pytest.raises(DatasetNotFound):
        audit_page(engine, ds, MALLORY)


def test_the_policy_merges_what_is_given_and_only_the_owner_sets_it(
    engine: Any, tmp_path: Path
) -> None:
    ds = _upload(engine, tmp_path, "olga")
    grants.grant(engine, ds, "ana", epsilon_allowance=1, viewer=OLGA, confirm=True)
    update_policy(engine, ds, OLGA, public_info={"label_names": ["neg", "pos"]})
    p = update_policy(engine, ds, OLGA, public_info={"description": "points"})
    assert p["public_info"] == {"label_names": ["neg", "pos"], "description": "points"}
    p = update_policy(
        engine, ds, OLGA, analyst_eval_modes=["dp"], public_info={"label_names": None}
    )
    assert p == {
        "dataset": ds,
        "analyst_eval_modes": ["dp"],
        "public_info": {"description": "points"},
        "view": {
            "test_fraction": 0.2,
            "split_seed": 0,
            "input_bounds": [-5.0, 5.0],
            "feature_clip": 5.0,
            "n_examples": 200,
            "classes": ["0", "1"],
            "input_shape": [3],
            "declared": ["n_examples", "classes", "input_shape"],
        },
    }
    assert dataset_policy(engine, ds, ANA) == p
    # The view: each setting given replaces the owner's; the others stay.
    p = update_policy(engine, ds, OLGA, view={"split_seed": 9, "input_bounds": None})
    assert p["view"] == {
        "test_fraction": 0.2,
        "split_seed": 9,
        "input_bounds": None,
        "feature_clip": 5.0,
        "n_examples": 200,
        "classes": ["0", "1"],
        "input_shape": [3],
        "declared": ["n_examples", "classes", "input_shape"],
    }
    # A declaration withdrawn: the owner still sees the count, the analyst sees none, and
    # their sweeps are refused (409) before anything is planned or reserved.
    p = update_policy(engine, ds, OLGA, view={"n_examples": None})
    assert p["view"]["n_examples"] == 200 and p["view"]["declared"] == ["classes", "input_shape"]
    assert dataset_policy(engine, ds, ANA)["view"]["n_examples"] is None
    seen = describe(engine, ds, ANA)
    assert seen["n_examples"] is None and seen["n_train"] is None and seen["num_classes"] == 2
    held = budget(engine, ds, OLGA)
    with pytest.raises(IllegalState, match="not declared n_examples"):
        _sweep(engine, ds, "ana")
    assert budget(engine, ds, OLGA) == held
    update_policy(engine, ds, OLGA, view={"n_examples": 180})
    assert describe(engine, ds, ANA)["n_examples"] == 180
    with pytest.raises(ConfigError) as refused:
        update_policy(engine, ds, OLGA, view={"test_fraction": 0})
    assert refused.value.field == "view.test_fraction"
    with pytest.raises(ConfigError):
        update_policy(engine, ds, OLGA, view={"layout": "nchw"})
    with pytest.raises(PermissionDenied):
        update_policy(engine, ds, ANA, view={"split_seed": 1})
    assert describe(engine, ds, ANA)["analyst_eval_modes"] == ["dp"]
    with pytest.raises(PermissionDenied):
        update_policy(engine, ds, ANA, analyst_eval_modes=["carve-out"])
    with pytest.raises(DatasetNotFound):
        dataset_policy(engine, ds, MALLORY)
