"""One record must not poison a run: bounded input scaling against extreme values.

The attack: a data owner's file holds one record with a feature of 1e37 or 1e300. Before inputs
were bounded, scaling in float32 turned it into inf, the trial diverged, and whether it failed
told whether that record was in the training data; in the evaluation split it squashed every
other record's features to ~0. Now NaN and inf are refused at load (with where they are), and
finite extremes are clipped: the scaled data, its scaling statistics and the trained model are
(nearly) those of the clean file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from dpsweep.errors import DatasetError
from dpsweep.spec import load_spec
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.planning import plan_sweep
from sweeper.sweeps.summary import summarize
from workers.datasets.loading import load_dataset
from workers.datasets.records import Dataset, DatasetSpec
from workers.datasets.scaling import _robust_centre_scale
from workers.datasets.splits import _split
from workers.models import ModelSpec
from workers.training.loop import train_trial
from workers.training.specs import PackSpec, TrialSpec

SPLIT_SEED = 3
TEST_FRACTION = 0.2
# The poisoned feature: column 0 of breast_cancer (mean radius, ~6..28).
COLUMN = 0


@pytest.fixture(scope="module")
def clean() -> tuple[np.ndarray, np.ndarray]:
    d = load_breast_cancer()
    return d.data.astype(np.float64), d.target


@pytest.fixture(scope="module")
def split(clean: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    x, y = clean
    return _split(len(x), y, TEST_FRACTION, SPLIT_SEED)


def write_csv(path: Path, x: np.ndarray, y: np.ndarray, *, poison: str | None = None) -> Path:
    """``x`` as CSV text; ``poison`` ("row:text") writes one raw cell verbatim (e.g. "1e300")."""
    cells = [[repr(float(v)) for v in row] for row in x]
    if poison is not None:
        row, text = poison.split(":", 1)
        cells[int(row)][COLUMN] = text
    header = ",".join(f"f{j}" for j in range(x.shape[1])) + ",label"
    # Labels whose sorted order is the targets' (0 malignant, 1 benign): the same class
    # indices, so the stratified split puts each row where `_split` on the targets says.
    names = {0: "0-malignant", 1: "1-benign"}
    lines = [header] + [",".join(r) + f",{names[int(t)]}" for r, t in zip(cells, y, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


def csv_spec(path: Path) -> DatasetSpec:
    return DatasetSpec(
        "csv",
        path=str(path),
        label_column="label",
        test_fraction=TEST_FRACTION,
        split_seed=SPLIT_SEED,
    )


def npz_spec(path: Path) -> DatasetSpec:
    return DatasetSpec("npz", path=str(path), test_fraction=TEST_FRACTION, split_seed=SPLIT_SEED)


def poisoned_dataset(
    tmp_path: Path, clean: tuple[np.ndarray, np.ndarray], row: int, value: str, fmt: str
) -> Dataset:
    x, y = clean
    if fmt == "csv":
        return load_dataset(csv_spec(write_csv(tmp_path / "p.csv", x, y, poison=f"{row}:{value}")))
    xp = x.copy()
    xp[row, COLUMN] = float(value)
    np.savez(tmp_path / "p.npz", x=xp, y=y)
    return load_dataset(npz_spec(tmp_path / "p.npz"))


def assert_bounded(ds: Dataset) -> None:
    lo, hi = ds.input_scaling["clip"]
    for x in (ds.x_train, ds.x_test):
        assert x.dtype == np.float32 and np.isfinite(x).all()
        assert x.min() >= lo and x.max() <= hi


@pytest.fixture(scope="module")
def clean_ds(tmp_path_factory: pytest.TempPathFactory, clean: Any) -> Dataset:
    x, y = clean
    return load_dataset(csv_spec(write_csv(tmp_path_factory.mktemp("c") / "c.csv", x, y)))


# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
@pytest.mark.parametrize("part", ["train", "eval"])
def test_non_finite_values_are_refused_at_load(
    tmp_path: Path, clean: Any, split: Any, value: str, part: str
) -> None:
    row = int((split[0] if part == "train" else split[1])[5])
    x, y = clean
    # 1e400 is finite text but overflows float64: it is inf, and refused like inf.
    with pytest.raises(DatasetError) as exc:
        load_dataset(csv_spec(write_csv(tmp_path / "p.csv", x, y, poison=f"{row}:{value}")))
    msg = str(exc.value)
    assert "p.csv: 1 non-finite input value(s) (NaN or inf)" in msg
    # The line in the file (header is line 1) and the column, for the owner to fix.
    assert f"line {row + 2}, column 'f{COLUMN}'" in msg
    assert "Replace them with finite numbers or drop those rows" in msg
    if value != "1e400":
        xp = x.copy()
        xp[row, COLUMN] = float(value)
        np.savez(tmp_path / "p.npz", x=xp, y=y)
        with pytest.raises(DatasetError, match=rf"p.npz: 1 non-finite .*row {row}, position 0"):
            load_dataset(npz_spec(tmp_path / "p.npz"))


@pytest.mark.parametrize("fmt", ["csv", "npz"])
@pytest.mark.parametrize("value", ["1e37", "1e300", "-1e300", "1.7e308"])
def test_extreme_training_record_is_clipped_and_changes_nothing_else(
    tmp_path: Path, clean: Any, split: Any, clean_ds: Dataset, value: str, fmt: str
) -> None:
    train_idx, _ = split
    k = 7
    ds = poisoned_dataset(tmp_path, clean, int(train_idx[k]), value, fmt)
    assert_bounded(ds)
    # Statistics come from the public split only: every other value is exactly the clean one.
    np.testing.assert_array_equal(ds.x_test, clean_ds.x_test)
    others = np.ones(len(train_idx), dtype=bool)
    others[k] = False
    np.testing.assert_array_equal(ds.x_train[others], clean_ds.x_train[others])
    # The poisoned feature sits at the clip bound, like any other record's extreme would.
    clip = ds.input_scaling["clip"][1 if float(value) > 0 else 0]
    assert ds.x_train[k, COLUMN] == clip


@pytest.mark.parametrize("fmt", ["csv", "npz"])
@pytest.mark.parametrize("value", ["1e37", "1e300", "-1e300"])
def test_extreme_eval_record_barely_moves_the_public_statistics(
    tmp_path: Path, clean: Any, split: Any, clean_ds: Dataset, value: str, fmt: str
) -> None:
    x, _ = clean
    _, test_idx = split
    k = 4
    ds = poisoned_dataset(tmp_path, clean, int(test_idx[k]), value, fmt)
    assert_bounded(ds)
    # The robust centre and scale move by at most one order statistic (a mean and a std would
    # move to ~1e36 and squash every feature to ~0).
    centre, scale = _robust_centre_scale(x[test_idx])
    xp = x[test_idx].copy()
    xp[k, COLUMN] = float(value)
    centre_p, scale_p = _robust_centre_scale(xp)
    assert np.all(np.abs(centre_p - centre) <= 0.1 * scale)
    np.testing.assert_allclose(scale_p, scale, rtol=0.1)
    # So the scaled training features are nearly the clean ones, and not squashed.
    assert np.abs(ds.x_train - clean_ds.x_train).max() < 0.2
    np.testing.assert_allclose(ds.x_train.std(0), clean_ds.x_train.std(0), rtol=0.1)


def _accuracy(spec: DatasetSpec) -> float:
    result = train_trial(
        PackSpec(
            dataset=spec,
            model=ModelSpec("logreg"),
            strategy="fixed",
            trials=[TrialSpec(lr=1.0, seed=0, noise_multiplier=1.0, params={"clip": 1.0})],
            batch_size=64,
            epochs=3,
            eval_every=5,
        )
    )
    return float(result.metrics["accuracy"])


def test_dp_training_on_poisoned_data_matches_the_clean_run(
    tmp_path: Path, clean: Any, split: Any
) -> None:
    """Real DP-SGD (fixed clipping, sigma 1): a poisoned record neither breaks nor changes it.

    The noise is secret (not seeded), so accuracies are compared with a tolerance.
    """
    x, y = clean
    train_idx, test_idx = split
    base = _accuracy(csv_spec(write_csv(tmp_path / "clean.csv", x, y)))
    assert base > 0.8  # chance is ~0.63
    runs = {}
    for name, row, value in (
        ("train-1e37", train_idx[7], "1e37"),
        ("train-1e300", train_idx[11], "1e300"),
        ("eval-1e37", test_idx[4], "-1e37"),
        ("eval-1e300", test_idx[9], "1e300"),
    ):
        path = write_csv(tmp_path / f"{name}.csv", x, y, poison=f"{row}:{value}")
        runs[name] = _accuracy(csv_spec(path))
    xp = x.copy()
    xp[train_idx[2], COLUMN] = 1e300
    np.savez(tmp_path / "train-npz.npz", x=xp, y=y)
    runs["train-1e300-npz"] = _accuracy(npz_spec(tmp_path / "train-npz.npz"))
    for name, acc in runs.items():
        assert acc > 0.8 and abs(acc - base) < 0.1, (name, acc, base)


# --------------------------------------------------------------------------------------------
# The plan records the scaling; path datasets are refused when planned.


def _spec(dataset: dict[str, Any]) -> Any:
    return load_spec(
        {
            "name": "poison",
            "dataset": dataset,
            "model": {"name": "logreg"},
            "training": {"steps": 10, "batch_size": 32, "eval_every": 5},
            "privacy": {"budgets": [2, 4], "delta": 1e-5},
            "arms": [{"strategy": "fixed", "grid": {"lr": [0.5], "clip": [1.0]}}],
        }
    )


def test_the_plan_records_the_input_scaling(tmp_path: Path, clean: Any) -> None:
    x, y = clean
    path = write_csv(tmp_path / "c.csv", x, y)
    robust = {"method": "public-robust", "clip": [-3.0, 3.0], "source": "public evaluation split"}
    spec = _spec({"name": "csv", "path": str(path), "label_column": "label", "feature_clip": 3})
    plan = plan_sweep(spec)
    assert [g.to_stored()["input_scaling"] for g in plan.grids] == [robust, robust]
    declared = plan_sweep(
        _spec(
            {"name": "csv", "path": str(path), "label_column": "label", "input_bounds": [0, 5000]}
        )
    )
    assert declared.grids[0].to_stored()["input_scaling"]["clip"] == [-1.0, 1.0]
    # Stored with the sweep and shown by `dpsweep show` / the API.
    url = f"sqlite:///{tmp_path / 's.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        sid = create_sweep(engine, spec)
        assert all(g["input_scaling"] == robust for g in summarize(engine, sid)["plan"])
    finally:
        engine.dispose()


def test_planning_a_path_dataset_with_nan_is_refused_clearly(tmp_path: Path, clean: Any) -> None:
    x, y = clean
    path = write_csv(tmp_path / "owner.csv", x, y, poison="30:nan")
    with pytest.raises(DatasetError, match=r"owner.csv: 1 non-finite input .*line 32, column 'f0'"):
        plan_sweep(_spec({"name": "csv", "path": str(path), "label_column": "label"}))


# --------------------------------------------------------------------------------------------
# Uploads through the real API: refused with 422, nothing stored.


@pytest.mark.slow
def test_api_upload_with_nan_or_inf_is_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    from api.testing.server import start_server

    url = f"sqlite:///{tmp_path / 'api.db'}"
    upgrade(url)
    server = start_server(url, tmp_path, scheduler=False)
    try:
        me = server.client(server.token("owner"))
        before = me.get("/api/v1/datasets").json()["items"]
        for bad in ("nan", "inf"):
            rows = ["a,b,label"] + [
                f"{i * 0.1},{i % 3},{'yes' if i % 2 else 'no'}" for i in range(40)
            ]
            rows[13] = f"1.3,{bad},yes"
            r = me.post(
                "/api/v1/datasets",
                files={"file": ("mine.csv", ("\n".join(rows) + "\n").encode(), "text/csv")},
                data={"format": "csv", "label_column": "label"},
            )
            assert r.status_code == 422, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            detail = r.json()["detail"]
            assert "mine.csv: 1 non-finite input value(s) (NaN or inf)" in detail, detail
            assert f"line 14, column 'b': {bad}" in detail
            assert "uploads" not in detail  # the server's storage path stays hidden
        assert me.get("/api/v1/datasets").json()["items"] == before
        assert not any((tmp_path / "data" / "uploads").glob("ds_*"))
    finally:
        server.stop()
