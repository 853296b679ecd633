"""Privacy units in the data layer (issue 54): loaders read the unit column (never a feature),
splits keep every unit on one side, the identity ignores the unit, and bad declarations are
refused with messages that say how to fix them. Real files, written here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsweep.errors import DatasetError
from workers.datasets.loading import dataset_content_sha256, load_dataset
from workers.datasets.records import Dataset, DatasetSpec
from workers.datasets.splits import _keyed_unit_split, _unit_split
from workers.datasets.unit_values import dense_ids, unit_keys

# Unit sizes with a one-row unit and a 50-row unit among others.
SIZES = {"p-single": 1, "p-big": 50, **{f"p{i:02d}": 2 + i % 7 for i in range(30)}}


def _rows(sizes: dict[str, int], seed: int = 0) -> list[tuple[str, float, float, int]]:
    """(unit, f1, f2, label) rows, units interleaved (a unit's rows are not contiguous)."""
    rng = np.random.default_rng(seed)
    units = [u for u, k in sizes.items() for _ in range(k)]
    order = rng.permutation(len(units))
    feats = rng.normal(size=(len(units), 2))
    return [(units[i], *map(float, feats[j]), j % 3) for j, i in enumerate(order)]


def _write_csv(path: Path, rows: list[tuple[str, float, float, int]], *, unit: bool = True) -> Path:
    head = "patient_id,f1,label,f2" if unit else "f1,label,f2"
    lines = [
        (f"{u}," if unit else "") + f"{a!r},{y},{b!r}"  # the unit column first, label between
        for u, a, b, y in rows
    ]
    path.write_text(head + "\n" + "\n".join(lines) + "\n")
    return path


def _csv_spec(path: Path, **kw: object) -> DatasetSpec:
    return DatasetSpec("csv", path=str(path), label_column="label", **kw)  # type: ignore[arg-type]


def _units_of(data: Dataset, side: str) -> np.ndarray:
    units = data.units_train if side == "train" else data.units_test
    assert units is not None
    return units


def test_csv_string_units_leave_the_features_and_become_dense_ids(tmp_path: Path) -> None:
    rows = _rows(SIZES)
    path = _write_csv(tmp_path / "d.csv", rows)
    data = load_dataset(_csv_spec(path, privacy_unit="patient_id"))
    # The unit column is not a feature: two features, f1 and f2, as in the file.
    assert data.input_shape == (2,)
    assert data.has_units and data.privacy_unit == "patient_id"
    for side, n in (("train", data.n_train), ("test", len(data.x_test))):
        u = _units_of(data, side)
        assert u.dtype == np.int64 and u.shape == (n,)
        # Dense on each side: every id 0 .. U-1 is used.
        assert set(u.tolist()) == set(range(int(u.max()) + 1))
    assert data.n_units_train + data.n_units_test == len(SIZES)
    assert data.planning_n_train == data.n_units_train
    assert data.planning_n_eval == data.n_units_test
    assert data.planning_n_private == len(SIZES)
    # The unit's rows stay together: the 50-row unit is wholly on one side.
    loaded = load_dataset(_csv_spec(path, privacy_unit="patient_id"))
    np.testing.assert_array_equal(loaded.units_train, data.units_train)  # deterministic


def test_units_of_one_and_of_fifty_rows_keep_their_rows(tmp_path: Path) -> None:
    rows = _rows(SIZES)
    path = _write_csv(tmp_path / "d.csv", rows)
    raw_units = [r[0] for r in rows]
    keys = unit_keys(np.asarray(raw_units))
    train, test = _unit_split(keys, 0.2, 0)
    data = load_dataset(_csv_spec(path, privacy_unit="patient_id"))
    # The loaded split is the unit split of the file's rows, in file order.
    assert len(train) == data.n_train and len(test) == len(data.x_test)
    for name, size in (("p-single", 1), ("p-big", 50)):
        rows_of = [i for i, u in enumerate(raw_units) if u == name]
        assert len(rows_of) == size
        on_train = rows_of[0] in set(train.tolist())
        side, ids = (train, data.units_train) if on_train else (test, data.units_test)
        assert ids is not None and set(rows_of) <= set(side.tolist())
        position = {int(r): j for j, r in enumerate(side)}
        # One dense id for all its rows, and no other row has it.
        (unit_id,) = {int(ids[position[r]]) for r in rows_of}
        assert int(np.count_nonzero(ids == unit_id)) == size
        np.testing.assert_array_equal(ids, dense_ids([keys[i] for i in side]))


def test_no_unit_is_on_both_sides_of_a_loaded_split(tmp_path: Path) -> None:
    rows = _rows(SIZES, seed=3)
    path = _write_csv(tmp_path / "d.csv", rows)
    raw_units = np.asarray([r[0] for r in rows])
    for mode in ("carve-out", "dp"):
        for seed in range(4):
            spec = _csv_spec(
                path,
                privacy_unit="patient_id",
                evaluation=mode,
                split_seed=seed,
                test_fraction=0.3,
                input_bounds=(-10.0, 10.0),
            )
            keys = unit_keys(raw_units)
            split = _keyed_unit_split if mode == "dp" else _unit_split
            train, test = split(keys, 0.3, seed)
            assert not {keys[i] for i in train} & {keys[i] for i in test}
            data = load_dataset(spec)
            assert (data.n_train, len(data.x_test)) == (len(train), len(test))
            np.testing.assert_array_equal(data.y_train, np.asarray([rows[i][3] for i in train]))


unit_lists = st.lists(
    st.one_of(st.integers(-5, 40), st.text(min_size=1, max_size=4).filter(str.strip)),
    min_size=2,
    max_size=120,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(units=unit_lists, seed=st.integers(0, 2**31), fraction=st.floats(0.05, 0.95))
def test_unit_splits_never_put_a_unit_on_both_sides(
    units: list[object], seed: int, fraction: float
) -> None:
    keys = unit_keys(np.asarray([str(u) for u in units]))
    for split in (_unit_split, _keyed_unit_split):
        try:
            train, test = split(keys, fraction, seed)
        except DatasetError as err:
            assert "test_fraction" in str(err)  # says how to fix it
            continue
        assert sorted([*train.tolist(), *test.tolist()]) == list(range(len(keys)))
        assert not {keys[i] for i in train} & {keys[i] for i in test}
    # Carve-out: exactly round(U * fraction) units evaluate when both sides have one.
    distinct = len(set(keys))
    n_test = round(distinct * fraction)
    if 1 <= n_test < distinct:
        _, test = _unit_split(keys, fraction, seed)
        assert len({keys[i] for i in test}) == n_test


@settings(max_examples=60, deadline=None)
@given(
    units=st.lists(st.integers(0, 60), min_size=4, max_size=150),
    removed=st.integers(0, 60),
    seed=st.integers(0, 2**31),
)
def test_removing_one_unit_moves_no_other_unit_in_the_dp_split(
    units: list[int], removed: int, seed: int
) -> None:
    """Neighbouring datasets (one whole unit removed) differ in that unit on one side only."""

    def sides(keys: list[bytes]) -> dict[bytes, bool] | None:
        try:
            _, test = _keyed_unit_split(keys, 0.4, seed)
        except DatasetError:
            return None
        evaluating = {keys[i] for i in test}
        return {k: k in evaluating for k in keys}

    keys = unit_keys(np.asarray(units))
    without = [k for k, u in zip(keys, units, strict=True) if u != removed]
    full, fewer = sides(keys), sides(without)
    if full is None or fewer is None:
        return
    assert all(full[k] == side for k, side in fewer.items())


def test_the_dp_split_does_not_depend_on_row_order_or_spelling() -> None:
    units = [str(i % 23) for i in range(200)]
    keys = unit_keys(np.asarray(units))
    _, test = _keyed_unit_split(keys, 0.3, 7)
    evaluating = {units[i] for i in test}
    # The same units as integers (an NPZ array), in reverse order: the same units evaluate.
    ints = np.asarray([int(u) for u in reversed(units)])
    keys2 = unit_keys(ints)
    _, test2 = _keyed_unit_split(keys2, 0.3, 7)
    assert {str(int(ints[i])) for i in test2} == evaluating


def test_identity_is_the_records_without_the_unit_column(tmp_path: Path) -> None:
    rows = _rows(SIZES)
    with_unit = _write_csv(tmp_path / "with.csv", rows)
    without = _write_csv(tmp_path / "without.csv", rows, unit=False)
    identity = dataset_content_sha256(_csv_spec(with_unit, privacy_unit="patient_id"))
    assert identity == dataset_content_sha256(_csv_spec(without))
    data = load_dataset(_csv_spec(with_unit, privacy_unit="patient_id"))
    assert data.content_sha256 == identity == load_dataset(_csv_spec(without)).content_sha256
    # Other units for the same records: the same identity (one ledger for the records).
    relabelled = [(f"other{i % 5}", a, b, y) for i, (_, a, b, y) in enumerate(rows)]
    other = _write_csv(tmp_path / "other.csv", relabelled)
    assert dataset_content_sha256(_csv_spec(other, privacy_unit="patient_id")) == identity


def test_npz_unit_array(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(120, 3)), np.arange(120) % 2
    units = np.repeat(np.arange(24), 5)[rng.permutation(120)]
    np.savez(tmp_path / "d.npz", x=x, y=y, person=units)
    np.savez(tmp_path / "plain.npz", x=x, y=y)
    spec = DatasetSpec("npz", path=str(tmp_path / "d.npz"), privacy_unit="person")
    data = load_dataset(spec)
    assert data.privacy_unit == "person" and data.input_shape == (3,)
    assert data.n_units_train + data.n_units_test == 24
    assert (
        data.content_sha256
        == load_dataset(DatasetSpec("npz", path=str(tmp_path / "plain.npz"))).content_sha256
    )
    # Every unit keeps its five rows on one side.
    assert np.bincount(_units_of(data, "train")).tolist() == [5] * data.n_units_train
    # A unit array of another length, or one that names the features, is refused.
    np.savez(tmp_path / "short.npz", x=x, y=y, person=units[:-1])
    with pytest.raises(DatasetError, match=r"one value per row of 'x' \(shape \[120\]\)"):
        load_dataset(DatasetSpec("npz", path=str(tmp_path / "short.npz"), privacy_unit="person"))
    with pytest.raises(DatasetError, match="names the features"):
        load_dataset(DatasetSpec("npz", path=str(tmp_path / "d.npz"), privacy_unit="x"))
    with pytest.raises(
        DatasetError, match=r"no array named 'who'.*arrays are \['person', 'x', 'y'\]"
    ):
        load_dataset(DatasetSpec("npz", path=str(tmp_path / "d.npz"), privacy_unit="who"))


def test_a_missing_unit_column_is_named_with_the_fix(tmp_path: Path) -> None:
    path = _write_csv(tmp_path / "d.csv", _rows(SIZES))
    with pytest.raises(DatasetError) as err:
        load_dataset(_csv_spec(path, privacy_unit="person_id"))
    text = str(err.value)
    assert "'person_id'" in text and "columns are ['patient_id', 'f1', 'label', 'f2']" in text
    assert "dataset.privacy_unit" in text and "leave privacy_unit out" in text
    with pytest.raises(DatasetError, match=r"also dataset\.label_column"):
        load_dataset(_csv_spec(path, privacy_unit="label"))


def test_an_empty_unit_is_refused_by_line(tmp_path: Path) -> None:
    rows = _rows({"a": 3, "b": 4})
    path = _write_csv(tmp_path / "d.csv", rows)
    lines = path.read_text().splitlines()
    lines[4] = "," + lines[4].split(",", 1)[1]  # line 5 of the file: no unit
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match="line 5: missing privacy unit in column 'patient_id'"):
        load_dataset(_csv_spec(path, privacy_unit="patient_id"))
    lines[4] = "NaN" + lines[4]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match="line 5: missing privacy unit"):
        load_dataset(_csv_spec(path, privacy_unit="patient_id"))


@pytest.mark.parametrize("name", ["digits", "mnist1d", "wine"])
def test_a_format_without_a_unit_column_refuses_a_unit(name: str) -> None:
    with pytest.raises(DatasetError, match=f"format '{name}' has no unit column"):
        load_dataset(DatasetSpec(name, privacy_unit="patient_id"))
    with pytest.raises(DatasetError, match="has no unit column"):
        dataset_content_sha256(DatasetSpec(name, privacy_unit="patient_id"))


def test_idx_files_have_no_unit_column(tmp_path: Path) -> None:
    images = np.arange(40 * 16, dtype=np.uint8).reshape(40, 4, 4)
    labels = (np.arange(40) % 2).astype(np.uint8)
    for name, a in (("i.idx", images), ("l.idx", labels)):
        head = bytes([0, 0, 0x08, a.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in a.shape)
        (tmp_path / name).write_bytes(head + a.tobytes())
    spec = DatasetSpec(
        "idx", path=str(tmp_path / "i.idx"), labels_path=str(tmp_path / "l.idx"), privacy_unit="u"
    )
    with pytest.raises(DatasetError, match="format 'idx' has no unit column"):
        load_dataset(spec)


def test_text_csv_reads_a_unit_column(tmp_path: Path) -> None:
    words = ["good", "bad", "film", "plot"]
    lines = [f"u{i % 9},{words[i % 4]} {words[(i * 3) % 4]},{i % 2}" for i in range(60)]
    (tmp_path / "t.csv").write_text("who,text,label\n" + "\n".join(lines) + "\n")
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    spec = DatasetSpec(
        "text_csv",
        path=str(tmp_path / "t.csv"),
        label_column="label",
        options={"vocab": str(tmp_path / "vocab.txt"), "max_length": 4},
        privacy_unit="who",
    )
    data = load_dataset(spec)
    assert data.privacy_unit == "who" and data.n_units_train + data.n_units_test == 9
    with pytest.raises(DatasetError, match=r"also dataset\.options\.text_column"):
        load_dataset(DatasetSpec(**{**spec.__dict__, "privacy_unit": "text"}))
    with pytest.raises(DatasetError, match=r"no column named 'whom'.*columns are"):
        load_dataset(DatasetSpec(**{**spec.__dict__, "privacy_unit": "whom"}))


def test_a_split_that_leaves_a_side_without_units_says_how_to_fix(tmp_path: Path) -> None:
    path = _write_csv(tmp_path / "d.csv", _rows({"a": 5, "b": 6}))
    with pytest.raises(DatasetError, match=r"no unit would be left for evaluation.*test_fraction"):
        load_dataset(_csv_spec(path, privacy_unit="patient_id", test_fraction=0.1))
    with pytest.raises(DatasetError, match="no unit would be left for training"):
        load_dataset(_csv_spec(path, privacy_unit="patient_id", test_fraction=0.9))


def test_public_evaluation_trains_on_every_unit(tmp_path: Path) -> None:
    rows = _rows(SIZES)
    path = _write_csv(tmp_path / "d.csv", rows)
    public = _write_csv(tmp_path / "public.csv", _rows({"x": 10, "y": 10}, seed=9), unit=False)
    data = load_dataset(
        _csv_spec(
            path, privacy_unit="patient_id", evaluation="public", eval_dataset=_csv_spec(public)
        )
    )
    assert data.n_train == len(rows) and data.units_test is None
    assert data.n_units_train == len(SIZES) and data.planning_n_private == len(SIZES)


def test_declared_units_plan_the_split(tmp_path: Path) -> None:
    path = _write_csv(tmp_path / "d.csv", _rows(SIZES))
    data = load_dataset(_csv_spec(path, privacy_unit="patient_id", declared_units=100))
    assert data.declared_units == 100
    assert (data.planning_n_train, data.planning_n_eval, data.planning_n_private) == (80, 20, 100)
    # Without a unit, a declared number of units means nothing.
    plain = _write_csv(tmp_path / "plain.csv", _rows(SIZES), unit=False)
    assert load_dataset(_csv_spec(plain, declared_units=100)).declared_units is None
