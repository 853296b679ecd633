"""Dataset identity: the ledger is keyed by the records, not by a name (real SQLite files).

The same records under two names, in another row order or another file format share one
lifetime cap and one ledger; a cap survives re-registration and deleting a name; an edited
file is other records; ledgers kept under a name before this change are carried over; and
``dpsweep datasets ...`` end to end.
"""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from api.cli import main
from dpsweep.errors import ConfigError, DatasetNotFound, IllegalState, PermissionDenied
from sweeper import datasets as catalog
from sweeper.datasets.access import Viewer
from sweeper.privacy.charges import exact_sum
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.errors import BudgetExhausted
from sweeper.privacy.ledger.keys import identity_key
from sweeper.privacy.ledger.rows import EntryKind
from sweeper.store import Dataset, Sweep, SweepState
from sweeper.store.engine import make_engine
from sweeper.store.schema import current_revision, downgrade, head_revision, upgrade
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.lifecycle import cancel_sweep
from workers.datasets.identity import content_sha256
from workers.datasets.loading import dataset_content_sha256, load_dataset
from workers.datasets.records import DatasetSpec, RawData
from workers.datasets.registry import DATASETS

N = 120


@pytest.fixture
def url(tmp_path: Path) -> str:
    u = f"sqlite:///{tmp_path / 'identity.db'}"
    upgrade(u)
    return u


@pytest.fixture
def engine(url: str) -> Any:
    eng = make_engine(url)
    yield eng
    eng.dispose()


def records(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.round(rng.normal(size=(N, 3)), 3)
    y = np.arange(N) % 2
    return x, y


def write_csv(path: Path, x: np.ndarray, y: np.ndarray, *, label: str = "label") -> Path:
    lines = [f"a,b,c,{label}"]
    lines += [
        ",".join(repr(float(v)) for v in row) + f",{int(t)}" for row, t in zip(x, y, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """The same records as a CSV, a shuffled CSV with float labels, and a shuffled NPZ."""
    x, y = records()
    perm = np.random.default_rng(1).permutation(N)
    shuffled = tmp_path / "shuffled.csv"
    lines = ["a,b,c,label"] + [
        ",".join(repr(float(v)) for v in x[i]) + f",{float(y[i])}" for i in perm
    ]
    shuffled.write_text("\n".join(lines) + "\n")
    npz = tmp_path / "data.npz"
    np.savez(npz, x=x[perm[::-1]], y=y[perm[::-1]])
    return {"csv": write_csv(tmp_path / "data.csv", x, y), "shuffled": shuffled, "npz": npz}


def spec(dataset: dict[str, Any], name: str = "s") -> dict[str, Any]:
    return {
        "name": name,
        "dataset": dataset,
        "model": {"name": "logreg"},
        "training": {"steps": 5, "batch_size": 16, "eval_every": 5},
        "privacy": {"budgets": [1.0], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
    }


def reserved_of(engine: Any, sweep_id: str) -> Decimal:
    with Session(engine) as s:
        sweep = s.get(Sweep, sweep_id)
        assert sweep is not None and sweep.ledger_key is not None
        key = sweep.ledger_key
    return BudgetLedger(engine).sweep_balance(key, sweep_id=sweep_id).epsilon_reserved


# ---------------------------------------------------------------------------------------------
# The identity itself


def test_identity_ignores_name_path_format_and_order(files: dict[str, Path]) -> None:
    a = load_dataset(DatasetSpec("csv", path=str(files["csv"]), label_column="label"))
    b = load_dataset(DatasetSpec("csv", path=str(files["shuffled"]), label_column="label"))
    c = load_dataset(DatasetSpec("npz", path=str(files["npz"])))
    assert a.content_sha256 == b.content_sha256 == c.content_sha256
    assert len(a.content_sha256) == 64 and int(a.content_sha256, 16) >= 0
    # Before the split and the scaling: other split settings, same records.
    d = load_dataset(
        DatasetSpec(
            "csv", path=str(files["csv"]), label_column="label", test_fraction=0.5, split_seed=7
        )
    )
    assert d.content_sha256 == a.content_sha256
    assert dataset_content_sha256(DatasetSpec("npz", path=str(files["npz"]))) == a.content_sha256


def test_identity_canonical_forms() -> None:
    x = np.array([[0.0, 1.0], [2.0, -0.0]])
    base = content_sha256(RawData(x=x, y=np.array([1, 0]), kind="tabular"))
    for y in (np.array([1.0, 0.0]), np.array(["1", "0"]), np.array([" 1.0", "0"])):
        assert content_sha256(RawData(x=x, y=y, kind="tabular")) == base
    assert content_sha256(RawData(x=-x, y=np.array([1, 0]), kind="tabular")) != base  # 1 -> -1
    assert (
        content_sha256(RawData(x=x.astype(np.float32), y=np.array([1, 0]), kind="tabular")) == base
    )
    # A record is its inputs *and* its label; duplicates count.
    assert content_sha256(RawData(x=x, y=np.array([0, 1]), kind="tabular")) != base
    dup = content_sha256(RawData(x=x[[0, 0, 1]], y=np.array([1, 1, 0]), kind="tabular"))
    assert dup != base
    # Images: [N, H, W] is trained as [N, 1, H, W]; uint8 pixels are their values.
    img = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4)
    flat = content_sha256(RawData(x=img, y=np.array([0, 1]), kind="image"))
    chan = content_sha256(RawData(x=img[:, None].astype(float), y=np.array([0, 1]), kind="image"))
    assert flat == chan
    assert content_sha256(RawData(x=img.reshape(2, 16), y=np.array([0, 1]), kind="tabular")) != flat
    # The caller's array is not touched (-0.0 stays -0.0 there).
    assert np.signbit(x[1, 1])


def test_identity_is_fast_on_the_largest_builtin() -> None:
    raw = max(
        (DATASETS[n](DatasetSpec(n)) for n in ("digits", "synthetic")), key=lambda r: r.x.size
    )
    t0 = time.perf_counter()
    for _ in range(10):
        content_sha256(raw)
    per_call = (time.perf_counter() - t0) / 10
    print(f"content_sha256 on {raw.x.shape}: {per_call * 1000:.2f} ms")
    assert per_call < 0.5


def test_an_edited_file_is_other_records(tmp_path: Path, files: dict[str, Path]) -> None:
    x, y = records()
    x[17, 2] += 0.001
    edited = write_csv(tmp_path / "edited.csv", x, y)
    a = dataset_content_sha256(DatasetSpec("csv", path=str(files["csv"]), label_column="label"))
    b = dataset_content_sha256(DatasetSpec("csv", path=str(edited), label_column="label"))
    assert a != b


# ---------------------------------------------------------------------------------------------
# One ledger per identity


def test_same_records_under_two_names_share_one_cap(engine: Any, files: dict[str, Path]) -> None:
    alpha, _ = catalog.register_file(engine, files["csv"], name="alpha", label_column="label")
    beta, _ = catalog.register_file(engine, files["npz"], name="beta")
    assert alpha.ledger_key == beta.ledger_key and beta.shared_with == ("alpha",)
    first = create_sweep(engine, spec({"name": "alpha"}, "first"))
    cost = reserved_of(engine, first)
    assert cost > 0
    # One cap for both names, set through either.
    out = catalog.set_caps(
        engine, "beta", Viewer(None), epsilon_cap=float(cost * Decimal("1.5")), delta_cap=None
    )
    assert out["dataset"] == "beta" and out["epsilon_reserved"] == float(cost)
    assert catalog.budget(engine, "alpha", Viewer(None))["epsilon_cap"] == out["epsilon_cap"]
    with pytest.raises(BudgetExhausted) as refused:
        create_sweep(engine, spec({"name": "beta"}, "second"))
    # The message names the dataset as the user did, never by its identity.
    assert "'beta'" in str(refused.value) and alpha.content_sha256 not in str(refused.value)
    # The same records given by path (shuffled, float labels) find the same ledger too.
    by_path = {"name": "csv", "path": str(files["shuffled"]), "label_column": "label"}
    with pytest.raises(BudgetExhausted):
        create_sweep(engine, spec(by_path, "third"))
    with Session(engine) as s:
        sweeps = list(s.scalars(sa.select(Sweep)))
        assert [(w.dataset, w.ledger_key) for w in sweeps] == [("alpha", alpha.ledger_key)]
        # Every stored grid says which records it was planned for.
        assert {g["dataset_sha256"] for g in sweeps[0].plan or []} == {alpha.content_sha256}
    # Cancelling gives the reservation back to the records, under any name.
    cancel_sweep(engine, first)
    assert BudgetLedger(engine).summary(alpha.ledger_key).epsilon_reserved == 0
    create_sweep(engine, spec(by_path, "fourth"))


def test_cap_survives_reregistration_and_deleting_a_name(
    engine: Any, files: dict[str, Path]
) -> None:
    b, _ = catalog.register_file(engine, files["csv"], name="alpha", label_column="label")
    BudgetLedger(engine).set_cap(b.ledger_key, epsilon_cap=3.0)
    sid = create_sweep(engine, spec({"name": "alpha"}))
    cancel_sweep(engine, sid)  # leaves its release entry in the ledger
    again, _ = catalog.register_file(engine, files["csv"], name="alpha", label_column="label")
    assert again.ledger_key == b.ledger_key and again.previous_sha256 is None
    assert catalog.delete_name(engine, "alpha") == []
    with Session(engine) as s:
        assert s.scalars(sa.select(Dataset).where(Dataset.name == "alpha")).first() is None
    # The ledger is untouched by the deletion, and found again under a new name and format.
    c, _ = catalog.register_file(engine, files["npz"], name="gamma")
    assert c.ledger_key == b.ledger_key
    summary = BudgetLedger(engine).summary(c.ledger_key)
    assert summary.epsilon_cap == 3
    kinds = [e.kind for e in BudgetLedger(engine).entries(c.ledger_key)]
    assert kinds == [EntryKind.RESERVE, EntryKind.RELEASE]


def test_delete_is_refused_while_a_sweep_holds_a_reservation(
    engine: Any, files: dict[str, Path]
) -> None:
    catalog.register_file(engine, files["csv"], name="alpha", label_column="label")
    catalog.register_file(engine, files["npz"], name="beta")
    sid = create_sweep(engine, spec({"name": "beta"}))
    # A sweep under another name of the same records holds them.
    with pytest.raises(IllegalState, match=f"not deleted: sweep\\(s\\) {sid} hold"):
        catalog.delete_name(engine, "alpha")
    cancel_sweep(engine, sid)
    assert catalog.delete_name(engine, "alpha") == ["beta"]


def test_an_edited_file_gets_its_own_ledger_with_the_old_caps(engine: Any, tmp_path: Path) -> None:
    x, y = records()
    path = write_csv(tmp_path / "data.csv", x, y)
    old, _ = catalog.register_file(engine, path, name="alpha", label_column="label")
    BudgetLedger(engine).set_cap(old.ledger_key, epsilon_cap=4.0)
    sid = create_sweep(engine, spec({"name": "alpha"}))
    x[3, 0] += 1.0
    write_csv(path, x, y)
    new, _ = catalog.register_file(engine, path, name="alpha", label_column="label")
    assert new.ledger_key != old.ledger_key and new.previous_sha256 == old.content_sha256
    assert new.inherited_caps
    ledger = BudgetLedger(engine)
    # Other records: nothing spent on the old ones moves, but the cap is not lifted.
    assert ledger.summary(new.ledger_key).epsilon_cap == 4
    assert ledger.summary(new.ledger_key).epsilon_reserved == 0
    assert ledger.summary(old.ledger_key).epsilon_reserved == reserved_of(engine, sid)
    # The sweep planned on the old records stays on their ledger (and its trials will find
    # that the data changed).
    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        assert sweep is not None and sweep.ledger_key == old.ledger_key


def test_reuploading_the_same_records_keeps_the_cap(engine: Any, tmp_path: Path) -> None:
    x, y = records()
    content = write_csv(tmp_path / "up.csv", x, y).read_bytes()
    first = catalog.store_upload(
        engine,
        owner="alice",
        content=content,
        fmt="csv",
        data_dir=tmp_path,
        label_column="label",
        epsilon_cap=1.0,
    )
    # The same records again, as an NPZ in another order, with a looser cap: one ledger, and
    # the cap can only tighten: a looser one is refused, saying whose cap it is, and nothing
    # is stored.
    npz = tmp_path / "again.npz"
    np.savez(npz, x=x[::-1], y=y[::-1])
    with pytest.raises(IllegalState, match=f"cap 1.0 of your dataset '{first['id']}'"):
        catalog.store_upload(
            engine,
            owner="alice",
            content=npz.read_bytes(),
            fmt="npz",
            data_dir=tmp_path,
            epsilon_cap=100.0,
        )
    viewer = Viewer("alice")
    listed = catalog.list_datasets(engine, viewer)
    assert [d["id"] for d in listed if d.get("owner")] == [first["id"]]
    second = catalog.store_upload(
        engine, owner="alice", content=npz.read_bytes(), fmt="npz", data_dir=tmp_path
    )
    assert second["ledger"]["shared_with"] == [first["id"]] and not second["ledger"]["existing"]
    assert catalog.budget(engine, second["id"], viewer)["epsilon_cap"] == 1.0
    catalog.store_upload(
        engine,
        owner="alice",
        content=npz.read_bytes(),
        fmt="npz",
        data_dir=tmp_path,
        epsilon_cap=0.5,
    )
    assert catalog.budget(engine, first["id"], viewer)["epsilon_cap"] == 0.5
    # The API shows names, never the identity.
    shown = json.dumps(
        [catalog.budget(engine, first["id"], viewer), catalog.describe(engine, first["id"], viewer)]
    )
    key = catalog.ledger_key_of(engine, first["id"])
    assert key.removeprefix("sha256:").split("/")[0] not in shown
    # Another tenant's upload of the same records is a ledger of their own: it neither reads
    # nor caps alice's, and alice still sets her own caps.
    bobs = catalog.store_upload(
        engine,
        owner="bob",
        content=content,
        fmt="csv",
        data_dir=tmp_path,
        label_column="label",
        epsilon_cap=0.01,
    )
    assert catalog.ledger_key_of(engine, bobs["id"]) != key
    bob_budget = catalog.budget(engine, bobs["id"], Viewer("bob"))
    assert bob_budget["epsilon_cap"] == 0.01 and bob_budget["epsilon_committed"] == 0
    assert catalog.budget(engine, first["id"], viewer)["epsilon_cap"] == 0.5
    catalog.set_caps(engine, first["id"], viewer, epsilon_cap=0.4, delta_cap=None)
    assert float(BudgetLedger(engine).summary(key).epsilon_cap or 0) == 0.4
    # Nobody but the owner (or an admin) sets a dataset's caps.
    with pytest.raises((PermissionDenied, DatasetNotFound)):
        catalog.set_caps(engine, first["id"], Viewer("bob"), epsilon_cap=50.0, delta_cap=None)
    catalog.set_caps(
        engine, first["id"], Viewer("root", admin=True), epsilon_cap=2.0, delta_cap=None
    )
    assert BudgetLedger(engine).summary(key).epsilon_cap == 2


def test_registered_names_are_checked(engine: Any, files: dict[str, Path]) -> None:
    for bad in ("digits", "csv", "ds_abc", "a:b", "1x", ""):
        with pytest.raises(ConfigError):
            catalog.register_file(engine, files["csv"], name=bad, label_column="label")
    with pytest.raises(ConfigError, match="label-column"):
        catalog.register_file(engine, files["csv"], name="alpha")
    with pytest.raises(ConfigError, match="unknown dataset 'nosuch'"):
        create_sweep(engine, spec({"name": "nosuch"}))
    catalog.register_file(engine, files["csv"], name="alpha", label_column="label")
    with pytest.raises(ConfigError, match="leave out path"):
        create_sweep(engine, spec({"name": "alpha", "path": str(files["csv"])}))


# ---------------------------------------------------------------------------------------------
# Ledgers kept under a name before identities: carried over, nothing lost


def _legacy_sweep(engine: Any, sweep_id: str, name: str) -> None:
    with Session(engine) as s, s.begin():
        s.add(Sweep(id=sweep_id, name="old", dataset=name, spec={}, state=SweepState.running))


def test_a_name_ledger_is_carried_over_on_first_use(engine: Any) -> None:
    ledger = BudgetLedger(engine)
    # What an older version left: a capped ledger under the name, a running sweep holding a
    # reservation there, one charge already made.
    ledger.set_cap("digits", epsilon_cap=50.0)
    _legacy_sweep(engine, "old1", "digits")
    ledger.reserve("digits", sweep_id="old1", epsilon=10.0, delta=1e-6)
    ledger.charge("digits", sweep_id="old1", trial_id="t1", epsilon=4.0, delta=0.0)
    # The records' own ledger already has a looser cap (set through another name, say).
    digits = identity_key(dataset_content_sha256(DatasetSpec("digits")))
    ledger.set_cap(digits, epsilon_cap=80.0)
    sid = create_sweep(engine, spec({"name": "digits"}))
    s = ledger.summary(digits)
    new = reserved_of(engine, sid)
    assert s.epsilon_cap == 50  # the stricter cap
    assert s.epsilon_spent == 4 and s.epsilon_reserved == exact_sum((Decimal(6), new))
    assert ledger.summary("digits").epsilon_spent == 0  # the name's row is gone ...
    assert "digits" not in ledger.datasets()
    entries = ledger.entries(digits, "old1")  # ... its entries moved, saying so
    assert [e.kind for e in entries] == [EntryKind.RESERVE, EntryKind.CHARGE]
    assert all("carried over from the ledger of name 'digits'" in e.note for e in entries)
    with Session(engine) as session:
        old = session.get(Sweep, "old1")
        assert old is not None and old.ledger_key == digits and old.dataset == "digits"
    # The old sweep now finishes on the identity: its outstanding 6 go back.
    r = cancel_sweep(engine, "old1")
    assert r["released_epsilon"] == 6.0
    assert ledger.summary(digits).epsilon_reserved == new
    # A built-in never used is bound (and loaded) when its budget is first asked for.
    assert catalog.ledger_key_of(engine, "wine").startswith("sha256:")
    assert "wine" in catalog.names_of(engine, catalog.content_identity(engine, "wine"))


def test_a_carry_over_past_the_stricter_cap_exhausts_it(engine: Any) -> None:
    ledger = BudgetLedger(engine)
    digits = identity_key(dataset_content_sha256(DatasetSpec("digits")))
    ledger.set_cap("digits", epsilon_cap=5.0)
    _legacy_sweep(engine, "old", "digits")
    ledger.reserve("digits", sweep_id="old", epsilon=4.0, delta=0.0)
    ledger.set_cap(digits, epsilon_cap=3.0)
    ledger.reserve(digits, sweep_id="other", epsilon=2.0, delta=0.0)
    binding = catalog.bind_name(engine, "digits", digits.removeprefix("sha256:"))
    assert binding.carried is not None and binding.carried.cap_clamped
    s = ledger.summary(digits)
    # 4 + 2 committed over a stricter cap of 3: nothing is lost, and nothing is left.
    assert s.epsilon_reserved == 6 and s.epsilon_cap == 6 and s.remaining.epsilon == 0
    with pytest.raises(BudgetExhausted):
        create_sweep(engine, spec({"name": "digits"}))


def test_binding_and_carry_over_on_postgresql(
    postgres_url: str, tmp_path: Path, files: dict[str, Path]
) -> None:
    from tests.conftest import fresh_postgres_database

    pg = fresh_postgres_database(postgres_url, str(tmp_path))
    upgrade(pg)
    engine = make_engine(pg)
    ledger = BudgetLedger(engine)
    ledger.set_cap("alpha", epsilon_cap=2.0)
    _legacy_sweep(engine, "old", "alpha")
    ledger.reserve("alpha", sweep_id="old", epsilon=0.5, delta=0.0)
    a, _ = catalog.register_file(engine, files["csv"], name="alpha", label_column="label")
    b, _ = catalog.register_file(engine, files["npz"], name="beta")
    assert a.carried is not None and a.carried.entries == 1 and b.carried is None
    assert b.shared_with == ("alpha",)
    s = ledger.summary(b.ledger_key)
    assert s.epsilon_cap == 2 and s.epsilon_reserved == Decimal("0.5")
    assert ledger.datasets() == [b.ledger_key]
    with pytest.raises(IllegalState, match="old"):
        catalog.delete_name(engine, "beta")
    assert cancel_sweep(engine, "old")["released_epsilon"] == 0.5
    assert catalog.delete_name(engine, "beta") == ["alpha"]
    engine.dispose()


def test_migration_0004_adds_and_drops_the_columns(url: str) -> None:
    eng = sa.create_engine(url)
    cols = {c["name"] for c in sa.inspect(eng).get_columns("sweeps")}
    assert "ledger_key" in cols
    assert "content_sha256" in {c["name"] for c in sa.inspect(eng).get_columns("datasets")}
    downgrade(url, "0003")
    assert "ledger_key" not in {c["name"] for c in sa.inspect(eng).get_columns("sweeps")}
    assert "content_sha256" not in {c["name"] for c in sa.inspect(eng).get_columns("datasets")}
    upgrade(url)
    assert current_revision(url) == head_revision()
    eng.dispose()


# ---------------------------------------------------------------------------------------------
# The CLI


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["datasets", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_datasets_end_to_end(
    url: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(
        capsys, "register", str(files["csv"]), "--name", "alpha", "--label-column", "label",
        "--db", url,
    )  # fmt: skip
    assert code == 0
    ident = next(w for w in out.split() if w.startswith("sha256:"))
    assert "no other name reads these records" in out and f"{N} examples" in out
    code, out, _ = cli(capsys, "register", str(files["npz"]), "--name", "beta", "--db", url)
    assert code == 0 and ident in out and "shares one ledger and cap with: alpha" in out
    code, out, _ = cli(capsys, "cap", "alpha", "--epsilon", "2", "--delta", "1e-4", "--db", url)
    assert code == 0 and "lifetime ε cap 2" in out

    engine = make_engine(url)
    sid = create_sweep(engine, spec({"name": "beta"}))
    reserved = float(reserved_of(engine, sid))

    code, out, _ = cli(capsys, "list", "--json", "--db", url)
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["alpha"]["identity"] == rows["beta"]["identity"] == ident
    assert rows["alpha"]["epsilon_cap"] == 2 and rows["beta"]["epsilon_reserved"] == reserved
    assert rows["alpha"]["n_examples"] == N
    code, out, _ = cli(capsys, "list", "--db", url)
    assert code == 0 and ident[:19] in out and "alpha" in out and "beta" in out

    code, out, _ = cli(capsys, "show", "alpha", "--json", "--db", url)
    view = json.loads(out)
    assert view["identity"] == ident and view["names"] == ["alpha", "beta"]
    assert view["epsilon_cap"] == 2 and view["delta_cap"] == 1e-4
    assert view["epsilon_left"] == pytest.approx(2 - reserved)
    assert [(e["kind"], e["sweep"]) for e in view["entries"]] == [("reserve", sid)]
    code, out, _ = cli(capsys, "show", "beta", "--db", url)
    assert code == 0 and "ledger entries" in out and sid in out

    # Below what is reserved: refused, nothing changes; δ stays when only ε is given.
    code, _, err = cli(capsys, "cap", "beta", "--epsilon", str(reserved / 2), "--db", url)
    assert code == 1 and "was not changed" in err and "already committed" in err
    code, out, _ = cli(capsys, "cap", "beta", "--epsilon", "3", "--db", url)
    assert code == 0 and "δ cap 0.0001" in out

    code, _, err = cli(capsys, "delete", "alpha", "--db", url)
    assert code == 1 and "not deleted" in err and sid in err
    cancel_sweep(engine, sid)
    code, out, _ = cli(capsys, "delete", "alpha", "--db", url)
    assert code == 0 and "ledger and cap stay" in out and "beta" in out
    code, out, _ = cli(capsys, "show", "beta", "--json", "--db", url)
    view = json.loads(out)
    assert view["names"] == ["beta"] and view["epsilon_cap"] == 3
    assert [e["kind"] for e in view["entries"]] == ["reserve", "release"]

    code, _, err = cli(capsys, "show", "alpha", "--db", url)
    assert code == 1 and "no dataset 'alpha'" in err
    with pytest.raises(SystemExit) as usage:
        cli(capsys, "register", str(files["csv"]), "--name", "digits", "--db", url)
    assert usage.value.code == 2 and "loader of dpsweep" in capsys.readouterr().err
    engine.dispose()
