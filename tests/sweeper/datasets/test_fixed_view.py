"""The owner's view of a stored dataset (``sweeper.datasets.fixed_view``): what an analyst's
spec may and may not set, what a spec leaving it out gets, and how it is kept (real SQLite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError
from dpsweep.spec import load_spec
from sweeper import datasets as catalog
from sweeper.datasets import grants
from sweeper.datasets.access import Viewer
from sweeper.datasets.fixed_view import DatasetView, apply_view, checked_view, stored_row, view_of
from sweeper.datasets.resolution import resolve
from sweeper.store import Dataset
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade

ADMIN = Viewer(None, admin=True)


@pytest.fixture
def registered(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'view.db'}"
    upgrade(url)
    engine = make_engine(url)
    rng = np.random.default_rng(5)
    x = np.round(rng.normal(size=(120, 3)), 3)
    lines = ["a,b,c,label"] + [",".join(map(str, r)) + f",{int(r[0] > 0)}" for r in x]
    path = tmp_path / "data.csv"
    path.write_text("\n".join(lines) + "\n")
    catalog.register_file(engine, path, name="alpha", label_column="label")
    yield engine, path
    engine.dispose()


def _spec(**dataset: Any) -> Any:
    return load_spec(
        {
            "name": "s",
            "dataset": {"name": "alpha", **dataset},
            "model": {"name": "logreg"},
            "training": {"steps": 2, "batch_size": 8},
            "privacy": {"budgets": [1.0], "delta": 1e-5},
            "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
        }
    )


def test_a_spec_leaving_the_view_out_gets_the_owners_and_an_analyst_may_not_change_it(
    registered: Any,
) -> None:
    engine, _ = registered
    grants.set_policy(engine, "alpha", ADMIN, view={"split_seed": 4, "input_bounds": [-3, 3]})
    row = stored_row(engine, "alpha")
    assert row is not None
    effective = apply_view(_spec(), row, analyst=True)
    assert effective.dataset.split_seed == 4
    assert effective.dataset.input_bounds == (-3.0, 3.0)
    assert effective.dataset.test_fraction == 0.2
    # Repeating the owner's value is no change; another is refused, naming the field.
    assert apply_view(_spec(split_seed=4), row, analyst=True).dataset.split_seed == 4
    for field, value in (
        ("split_seed", 5),
        ("test_fraction", 0.25),
        ("input_bounds", [-3, 4]),
        ("feature_clip", 2.0),
        ("options", {"delimiter": ";"}),
        ("label_column", "a"),
    ):
        with pytest.raises(ConfigError) as refused:
            apply_view(_spec(**{field: value}), row, analyst=True)
        assert refused.value.field == f"dataset.{field}"
        assert "owner" in str(refused.value)
    # The owner may read their own data another way.
    assert apply_view(_spec(split_seed=5), row, analyst=False).dataset.split_seed == 5


def test_sizes_come_from_the_declaration(registered: Any) -> None:
    engine, _ = registered
    worker = resolve(engine, {"name": "alpha"})
    assert worker.declared_size == 120  # the count at registration, declared by default
    grants.set_policy(engine, "alpha", ADMIN, view={"n_examples": 1000, "input_bounds": [-5, 5]})
    assert resolve(engine, {"name": "alpha"}).declared_size == 1000
    from workers.datasets.loading import load_dataset

    view = {"name": "alpha", "input_bounds": [-5, 5]}
    data = load_dataset(resolve(engine, view, {"mode": "dp"}))
    assert data.n_private <= 120
    assert (data.planning_n_private, data.planning_n_eval, data.planning_n_train) == (
        1000,
        200,
        800,
    )


def test_the_view_survives_re_registration_but_not_the_declared_size(registered: Any) -> None:
    engine, path = registered
    grants.set_policy(engine, "alpha", ADMIN, view={"split_seed": 9, "n_examples": 5000})
    catalog.register_file(engine, path, name="alpha", label_column="label")
    with Session(engine) as s:
        row = s.query(Dataset).filter_by(name="alpha").one()
        view = view_of(row)
    assert view.split_seed == 9 and view.n_examples == 120


@settings(max_examples=60, deadline=None)
@given(
    test_fraction=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    split_seed=st.one_of(st.none(), st.integers(-(2**70), 2**70)),
    n_examples=st.one_of(st.none(), st.integers(-5, 2**60), st.booleans()),
    classes=st.one_of(st.none(), st.lists(st.text(max_size=3), max_size=4)),
)
def test_checked_view_accepts_exactly_what_a_spec_would(
    test_fraction: float | None,
    split_seed: int | None,
    n_examples: Any,
    classes: list[str] | None,
) -> None:
    changes = {
        "test_fraction": test_fraction,
        "split_seed": split_seed,
        "n_examples": n_examples,
        "classes": classes,
    }
    fraction_ok = test_fraction is None or 0 < test_fraction < 1
    size_ok = n_examples is None or (not isinstance(n_examples, bool) and 2 <= n_examples < 2**53)
    classes_ok = classes is None or (
        len(classes) >= 2 and all(classes) and len(set(classes)) == len(classes)
    )
    try:
        view = checked_view(DatasetView(), changes)
    except ConfigError as exc:
        assert exc.field and exc.field.startswith("view")
        assert not (fraction_ok and size_ok and classes_ok)
        return
    assert fraction_ok and size_ok and classes_ok
    assert 0 < view.test_fraction < 1
    assert view.n_examples == n_examples
