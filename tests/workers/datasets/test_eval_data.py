"""Evaluation records by mode (carve-out, public, dp): real files, real SQLite.

* ``dp``: the split is keyed by each record's content and the public split_seed, so adding or
  removing one record moves no other across the split; no statistic may scale the inputs.
* ``carve-out``: exactly the seeded, stratified split and scaling of before.
* ``public``: every private record trains; a dataset its owner declared public evaluates.
* the catalog: ``register --public``, ``is_public`` and what ``resolve`` refuses.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from api.cli import main
from dpsweep.errors import ConfigError, DatasetError
from sweeper import datasets as catalog
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from workers.datasets import DatasetSpec, load_dataset, scaling

# Declared bounds whose scale is a power of two: id / 4096 is exact in float32, so a scaled
# record's id column gives its id back.
BOUNDS = (-4096.0, 4096.0)


def write_csv(path: Path, ids: np.ndarray, feats: np.ndarray, labels: list[Any]) -> Path:
    lines = ["id,f1,f2,label"]
    for i, (a, b), t in zip(ids, feats, labels, strict=True):
        lines.append(f"{int(i)},{float(a)!r},{float(b)!r},{t}")
    path.write_text("\n".join(lines) + "\n")
    return path


def records(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    feats = np.round(rng.normal(size=(n, 2)), 3)
    return np.arange(n), feats, [int(i % 3) for i in range(n)]


def csv_spec(path: Path, **kw: Any) -> DatasetSpec:
    return DatasetSpec("csv", path=str(path), label_column="label", **kw)


def ids_of(x: np.ndarray) -> set[int]:
    return {int(v) for v in np.rint(x[:, 0].astype(np.float64) * BOUNDS[1])}


def dp_sides(path: Path, seed: int = 0, fraction: float = 0.2) -> tuple[set[int], set[int]]:
    d = load_dataset(
        csv_spec(
            path, evaluation="dp", input_bounds=BOUNDS, split_seed=seed, test_fraction=fraction
        )
    )
    assert d.evaluation == "dp"
    return ids_of(d.x_train), ids_of(d.x_test)


# --------------------------------------------------------------------------------------------
# dp: the keyed split


def test_keyed_split_is_stable_under_adding_and_removing_a_record(tmp_path: Path) -> None:
    n = 2000
    ids, feats, labels = records(n + 1)
    base = write_csv(tmp_path / "base.csv", ids[:n], feats[:n], labels[:n])
    train, test = dp_sides(base)
    assert train | test == set(range(n)) and not train & test

    # One record more (the neighbour): every other record stays on its side.
    added = write_csv(tmp_path / "added.csv", ids, feats, labels)
    train2, test2 = dp_sides(added)
    assert train2 - {n} == train and test2 - {n} == test
    assert (n in train2) != (n in test2)

    # One record fewer, from each side: likewise.
    for gone in (min(test), min(train)):
        keep = np.arange(n) != gone
        removed = write_csv(
            tmp_path / f"removed{gone}.csv",
            ids[:n][keep],
            feats[:n][keep],
            [t for t, k in zip(labels[:n], keep, strict=True) if k],
        )
        train3, test3 = dp_sides(removed)
        assert train3 == train - {gone} and test3 == test - {gone}

    # Row order does not matter either: a record's side is a function of the record.
    perm = np.random.default_rng(5).permutation(n)
    shuffled = write_csv(
        tmp_path / "shuffled.csv", ids[:n][perm], feats[:n][perm], [labels[i] for i in perm]
    )
    assert dp_sides(shuffled) == (train, test)

    # The share is near test_fraction (binomial: sd ~ 18 of 2000; 0.04 is > 4 sd).
    assert abs(len(test) / n - 0.2) < 0.04
    assert abs(len(dp_sides(base, fraction=0.5)[1]) / n - 0.5) < 0.05

    # Another split_seed: another split.
    _, other_test = dp_sides(base, seed=1)
    assert other_test != test and abs(len(other_test) / n - 0.2) < 0.04
    assert dp_sides(base, seed=0) == (train, test)  # and deterministic


def test_keyed_split_depends_on_the_label_too(tmp_path: Path) -> None:
    # Equal inputs, different labels: two different records, hashed with their label.
    n = 400
    ids, feats, labels = records(n)
    a = write_csv(tmp_path / "a.csv", ids, feats, labels)
    b = write_csv(tmp_path / "b.csv", ids, feats, [(t + 1) % 3 for t in labels])
    assert dp_sides(a)[1] != dp_sides(b)[1]


def test_keyed_split_refuses_an_empty_side(tmp_path: Path) -> None:
    ids, feats, labels = records(3)
    path = write_csv(tmp_path / "tiny.csv", ids, feats, labels)
    for fraction, side in ((0.01, "evaluation"), (0.99, "training")):
        with pytest.raises(DatasetError, match=f"leave no {side} record") as err:
            dp_sides(path, fraction=fraction)
        assert "test_fraction" in str(err.value)


def test_dp_refuses_scaling_by_statistics_of_the_records(tmp_path: Path) -> None:
    ids, feats, labels = records(200)
    path = write_csv(tmp_path / "d.csv", ids, feats, labels)
    with pytest.raises(ConfigError) as err:
        load_dataset(csv_spec(path, evaluation="dp"))
    assert err.value.field == "dataset.input_bounds"
    assert "eval mode dp" in str(err.value) and "dataset.input_bounds" in str(err.value)

    # Float images of unknown range: the same refusal.
    images = tmp_path / "float_images.npz"
    rng = np.random.default_rng(0)
    np.savez(images, x=rng.normal(size=(60, 4, 4)), y=np.arange(60) % 2)
    with pytest.raises(ConfigError) as err:
        load_dataset(DatasetSpec("npz", path=str(images), evaluation="dp"))
    assert err.value.field == "dataset.input_bounds"

    # Declared bounds: fine, data independent.
    d = load_dataset(csv_spec(path, evaluation="dp", input_bounds=BOUNDS))
    assert d.input_scaling == {
        "method": "declared",
        "clip": [-1.0, 1.0],
        "source": "data owner",
        "bounds": list(BOUNDS),
    }
    assert d.n_private == 200 == d.n_train + len(d.x_test)


def test_dp_on_digits_uses_the_pixel_format() -> None:
    d = load_dataset(DatasetSpec("digits", evaluation="dp"))
    assert d.input_scaling["method"] == "pixel"
    assert "public evaluation" not in d.input_scaling["source"]
    assert d.n_train + len(d.x_test) == 1797
    assert abs(len(d.x_test) / 1797 - 0.2) < 0.04
    # The carve-out is another split (stratified shuffle), same identity.
    c = load_dataset(DatasetSpec("digits"))
    assert c.content_sha256 == d.content_sha256
    assert not (c.x_test.shape == d.x_test.shape and np.array_equal(c.x_test, d.x_test))


# --------------------------------------------------------------------------------------------
# carve-out: unchanged


def old_split(n: int, y: np.ndarray, test_fraction: float, seed: int) -> tuple[Any, Any]:
    """A copy of the split from before eval modes existed."""
    from sklearn.model_selection import train_test_split

    n_test = round(n * test_fraction)
    idx = np.arange(n)
    counts = np.bincount(y)
    stratify = y if counts.min() >= 2 and n_test >= len(counts) else None
    tr, te = train_test_split(
        idx, test_size=n_test, random_state=seed, shuffle=True, stratify=stratify
    )
    return np.sort(tr), np.sort(te)


@pytest.mark.parametrize("seed", [0, 3])
def test_carve_out_is_the_split_and_scaling_of_before(tmp_path: Path, seed: int) -> None:
    # Digits: the pixel constant.
    from sklearn.datasets import load_digits

    raw = load_digits()
    d = load_dataset(DatasetSpec("digits", split_seed=seed))
    tr, te = old_split(len(raw.target), raw.target, 0.2, seed)
    x = raw.images[:, None, :, :]
    assert d.evaluation == "carve-out"
    np.testing.assert_array_equal(d.x_train, np.clip(x[tr] / 16.0, 0, 1).astype(np.float32))
    np.testing.assert_array_equal(d.x_test, np.clip(x[te] / 16.0, 0, 1).astype(np.float32))
    np.testing.assert_array_equal(d.y_train, raw.target[tr])
    np.testing.assert_array_equal(d.y_test, raw.target[te])
    # The identity of before (computed with the code before eval modes).
    assert d.content_sha256 == "8438c349a3d451416323d17a0122af988817423c3c0ec8ef14a3610f063e3664"

    # A CSV: robust statistics of the carved-out (public) split, as before.
    ids, feats, labels = records(300, seed=seed)
    path = write_csv(tmp_path / "c.csv", ids, feats, labels)
    c = load_dataset(csv_spec(path, split_seed=seed))
    xs = np.column_stack([ids, feats]).astype(np.float64)
    ys = np.asarray(labels)
    tr, te = old_split(len(xs), ys, 0.2, seed)
    centre, scale = scaling._robust_centre_scale(xs[te])
    for got, part in ((c.x_train, xs[tr]), (c.x_test, xs[te])):
        want = np.clip((part - centre) / scale, -5.0, 5.0).astype(np.float32)
        np.testing.assert_array_equal(got, want)
    assert c.input_scaling == {
        "method": "public-robust",
        "clip": [-5.0, 5.0],
        "source": "public evaluation split",
    }
    assert c.n_private == 300


# --------------------------------------------------------------------------------------------
# public: a separate dataset declared public


@pytest.fixture
def private_and_public(tmp_path: Path) -> tuple[Path, Path]:
    ids, feats, labels = records(120, seed=0)
    private = write_csv(tmp_path / "private.csv", ids, feats, labels)
    pid, pfeats, _ = records(50, seed=9)
    # Float labels: "1.0" is the training class "1" (as for the identity).
    public = write_csv(
        tmp_path / "public.csv", pid + 10_000, pfeats * 3, [f"{i % 3}.0" for i in pid]
    )
    return private, public


def test_public_mode_trains_on_every_record(private_and_public: tuple[Path, Path]) -> None:
    private, public = private_and_public
    spec = csv_spec(private, evaluation="public", eval_dataset=csv_spec(public))
    d = load_dataset(spec)
    assert d.evaluation == "public"
    assert d.n_train == 120 == d.n_private and len(d.x_test) == 50
    assert sorted(d.y_train.tolist()) == sorted(i % 3 for i in range(120))
    np.testing.assert_array_equal(d.y_test, np.arange(50) % 3)
    assert d.classes == ["0", "1", "2"] and d.num_classes == 3
    # Scaling statistics come from the public records.
    assert d.input_scaling == {
        "method": "public-robust",
        "clip": [-5.0, 5.0],
        "source": "public evaluation dataset",
    }
    pub = np.column_stack([np.arange(50) + 10_000, records(50, seed=9)[1] * 3])
    centre, scale = scaling._robust_centre_scale(pub)
    np.testing.assert_array_equal(
        d.x_test, np.clip((pub - centre) / scale, -5, 5).astype(np.float32)
    )
    # The identity is the private records' only.
    assert d.content_sha256 == load_dataset(csv_spec(private)).content_sha256
    # The nested spec survives pickling (sent to workers) and the pack key.
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert load_dataset(pickle.loads(pickle.dumps(spec))).n_train == 120


def test_pack_key_takes_a_nested_spec(private_and_public: tuple[Path, Path]) -> None:
    from workers.models import ModelSpec
    from workers.packing import pack_key
    from workers.training.specs import PackSpec, TrialSpec

    private, public = private_and_public

    def key(data: DatasetSpec) -> str:
        trial = TrialSpec(lr=0.1, seed=0, noise_multiplier=1.0, params={"clip": 1.0})
        return pack_key(
            PackSpec(dataset=data, model=ModelSpec("mlp"), strategy="fixed", trials=[trial])
        )

    a = key(csv_spec(private, evaluation="public", eval_dataset=csv_spec(public)))
    b = key(csv_spec(private, evaluation="public", eval_dataset=csv_spec(private)))
    assert a != b and str(public) in a
    assert key(csv_spec(private)) != key(csv_spec(private, evaluation="dp"))


def test_public_mode_refusals(private_and_public: tuple[Path, Path], tmp_path: Path) -> None:
    private, _ = private_and_public

    def load(eval_spec: DatasetSpec | None, **kw: Any) -> Any:
        return load_dataset(csv_spec(private, evaluation="public", eval_dataset=eval_spec, **kw))

    # Another input shape: named (shapes are public), field eval.dataset.
    narrow = tmp_path / "narrow.csv"
    narrow.write_text("f1,label\n" + "".join(f"{i}.5,{i % 3}\n" for i in range(20)))
    with pytest.raises(ConfigError) as err:
        load(csv_spec(narrow))
    assert (
        err.value.field == "eval.dataset" and "(1,)" in str(err.value) and "(3,)" in str(err.value)
    )

    # Another kind.
    with pytest.raises(ConfigError) as err:
        load(DatasetSpec("digits"))
    assert err.value.field == "eval.dataset" and "image" in str(err.value)

    # No evaluation dataset.
    with pytest.raises(ConfigError) as err:
        load(None)
    assert err.value.field == "eval.dataset"


def test_public_labels_outside_the_training_classes_are_refused_unnamed(tmp_path: Path) -> None:
    ids, feats, _ = records(60)
    private = write_csv(
        tmp_path / "private.csv", ids, feats, ["heart_attack" if i % 2 else "healthy" for i in ids]
    )
    public = write_csv(
        tmp_path / "public.csv",
        ids,
        feats,
        ["rare_disease" if i % 7 == 0 else "healthy" for i in ids],
    )
    with pytest.raises(DatasetError) as err:
        load_dataset(csv_spec(private, evaluation="public", eval_dataset=csv_spec(public)))
    msg = str(err.value)
    assert "not one of the training dataset's 2 classes" in msg
    for label in ("rare_disease", "heart_attack", "healthy"):
        assert label not in msg


def test_public_images_need_the_same_pixel_format(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    train = tmp_path / "train.npz"
    np.savez(train, x=rng.integers(0, 256, size=(40, 5, 5), dtype=np.uint8), y=np.arange(40) % 2)
    same = tmp_path / "same.npz"
    np.savez(same, x=rng.integers(0, 256, size=(30, 5, 5), dtype=np.uint8), y=np.arange(30) % 2)
    floats = tmp_path / "floats.npz"
    np.savez(floats, x=rng.random(size=(30, 5, 5)), y=np.arange(30) % 2)

    def spec(eval_path: Path, **kw: Any) -> DatasetSpec:
        return DatasetSpec(
            "npz",
            path=str(train),
            evaluation="public",
            eval_dataset=DatasetSpec("npz", path=str(eval_path)),
            **kw,
        )

    d = load_dataset(spec(same))
    assert d.input_scaling["method"] == "pixel" and d.x_test.shape == (30, 1, 5, 5)
    with pytest.raises(ConfigError) as err:
        load_dataset(spec(floats))
    assert err.value.field == "eval.dataset" and "pixel" in str(err.value)
    assert load_dataset(spec(floats, input_bounds=(0.0, 255.0))).n_train == 40


# --------------------------------------------------------------------------------------------
# The catalog


@pytest.fixture
def url(tmp_path: Path) -> str:
    u = f"sqlite:///{tmp_path / 'eval.db'}"
    upgrade(u)
    return u


@pytest.fixture
def engine(url: str) -> Any:
    eng = make_engine(url)
    yield eng
    eng.dispose()


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["datasets", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_register_public_and_resolve(
    url: str,
    engine: Any,
    private_and_public: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    private, public = private_and_public
    lc = ("--label-column", "label", "--db", url)
    code, out, _ = cli(capsys, "register", str(private), "--name", "patients", *lc)
    assert code == 0 and "private: not usable as a public evaluation dataset" in out
    code, out, _ = cli(capsys, "register", str(public), "--name", "reference", "--public", *lc)
    assert code == 0 and "declared public" in out
    code, out, _ = cli(capsys, "register", str(public), "--name", "unpublished", *lc, "--json")
    assert code == 0 and json.loads(out)["public"] is False

    assert catalog.is_public(engine, "reference")
    assert not catalog.is_public(engine, "patients")
    assert not catalog.is_public(engine, "digits") and not catalog.is_public(engine, "nope")

    code, out, _ = cli(capsys, "list", "--json", "--db", url)
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["reference"]["public"] is True and rows["patients"]["public"] is False
    code, out, _ = cli(capsys, "list", "--db", url)
    assert code == 0 and "public" in out
    code, out, _ = cli(capsys, "show", "reference", "--json", "--db", url)
    assert json.loads(out)["public"] is True
    code, out, _ = cli(capsys, "show", "patients", "--db", url)
    assert code == 0 and "not declared public" in out

    # Resolving: the public evaluation dataset's own worker spec rides along.
    spec = catalog.resolve(engine, {"name": "patients"}, {"mode": "public", "dataset": "reference"})
    assert spec.evaluation == "public" and spec.path == str(private.resolve())
    assert spec.eval_dataset is not None and spec.eval_dataset.path == str(public.resolve())
    d = load_dataset(spec)
    assert d.n_train == 120 and len(d.x_test) == 50

    from dpsweep.spec import EvalConfig

    assert catalog.resolve(engine, {"name": "patients"}, EvalConfig(dataset="reference")) == spec
    assert catalog.resolve(engine, {"name": "digits"}, EvalConfig(dataset="reference")).eval_dataset
    dp = catalog.resolve(engine, {"name": "patients"}, EvalConfig(mode="dp"))
    assert dp.evaluation == "dp" and dp.eval_dataset is None
    # Existing callers: two arguments, carve-out, as before.
    plain = catalog.resolve(engine, {"name": "patients"})
    assert plain.evaluation == "carve-out" and plain == catalog.resolve(
        engine, {"name": "patients"}, EvalConfig()
    )
    assert catalog.resolve(None, {"name": "digits"}).evaluation == "carve-out"

    def refused(name: str, training: str = "patients", eng: Any = engine) -> str:
        with pytest.raises(ConfigError) as err:
            catalog.resolve(eng, {"name": training}, {"mode": "public", "dataset": name})
        assert err.value.field == "eval.dataset"
        return str(err.value)

    assert "not declared public by its owner" in refused("unpublished")
    assert "--public" in refused("unpublished")
    assert "no registered dataset 'nope'" in refused("nope")
    assert "dpsweep datasets register" in refused("nope")
    assert "is the training dataset" in refused("patients")
    assert "loader of dpsweep" in refused("digits")
    assert "upload" in refused("ds_0123456789abcdef01234567")
    assert "database" in refused("reference", training="digits", eng=None)

    # The same records under a public name: still the training records.
    cli(capsys, "register", str(private), "--name", "patients-copy", "--public", *lc)
    assert "same records" in refused("patients-copy")

    # Registering again without --public withdraws the declaration.
    code, _, _ = cli(capsys, "register", str(public), "--name", "reference", *lc)
    assert code == 0 and not catalog.is_public(engine, "reference")
    assert "not declared public" in refused("reference")
