"""Issue 36's attacks, tried over real HTTP with an analyst's token: each must fail, and a
refused request must spend nothing.

One ``dpsweep serve`` on SQLite. ``olga`` uploads a CSV and an NPZ of images and grants
``ana``; an admin registers an image folder (file names that look like patients') and
grants ``ana`` too. Each test is one class of attack from the issue:

1. reproducible mode (its noise comes from seeds every trial shows);
2. a membership test through an analyst-chosen split (seed, fraction) and a dry run that
   skipped the owner's policy;
3. a fresh ledger through loader options, and a name re-pointed by a sweep;
4. the server's file names in an error.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.testing.server import start_server
from sweeper import datasets as catalog
from sweeper.datasets.identity import ledger_key_of
from sweeper.store import Dataset, Sweep
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.api.test_api import assert_problem

pytestmark = pytest.mark.slow  # one server; no sweep trains

V1 = "/api/v1"


def _csv() -> bytes:
    rng = np.random.default_rng(36)
    x = rng.uniform(-3, 3, size=(300, 4))
    y = (x[:, 0] > 0).astype(int)
    lines = ["a,b,c,d,label"] + [
        ",".join(f"{v:.5f}" for v in row) + f",{t}" for row, t in zip(x, y, strict=True)
    ]
    return ("\n".join(lines) + "\n").encode()


def _npz() -> bytes:
    rng = np.random.default_rng(7)
    # Channels-last images [N, H, W, C]: read as nchw they are other records.
    x = rng.integers(0, 256, size=(120, 4, 6, 3), dtype=np.uint8)
    y = rng.integers(0, 2, size=120)
    buf = io.BytesIO()
    np.savez(buf, x=x, y=y)
    return buf.getvalue()


def _spec(ds: str, *, name: str = "s", budget: float = 1.0, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "dataset": {"name": ds},
        "model": {"name": "logreg"},
        "training": {"steps": 4, "batch_size": 16, "eval_every": 2},
        "privacy": {"budgets": [budget], "delta": 1e-5},
        "eval": {"mode": "dp"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
    }
    for section, values in extra.items():
        spec[section] = {**spec.get(section, {}), **values}
    return spec


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("attacks")
    url = f"sqlite:///{work / 'api.db'}"
    upgrade(url)
    # An image folder on the server, registered by its operator (an admin owns it).
    folder = work / "scans"
    rng = np.random.default_rng(3)
    for i in range(24):
        label = "healthy" if i % 2 else "sick"
        (folder / label).mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(5, 5, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / label / f"patient_{1000 + i}_smith.png")
    engine = make_engine(url)
    catalog.register_file(engine, folder, name="scans", options={"size": [5, 5]})
    s = start_server(url, work)
    c = {n: s.client(s.token(n)) for n in ("olga", "ana")}
    admin = s.client(s.token("root", admin=True))
    ids = {}
    for fmt, content, data in (
        ("csv", _csv(), {"label_column": "label"}),
        ("npz", _npz(), {}),
    ):
        r = c["olga"].post(
            f"{V1}/datasets",
            files={"file": (f"points.{fmt}", content, "application/octet-stream")},
            data={"format": fmt, "epsilon_cap": "20", "declare_counted": "true", **data},
        )
        assert r.status_code == 201, r.text
        ids[fmt] = r.json()["id"]
    r = c["olga"].put(
        f"{V1}/datasets/{ids['csv']}/policy", json={"view": {"input_bounds": [-4.0, 4.0]}}
    )
    assert r.status_code == 200 and r.json()["view"]["input_bounds"] == [-4.0, 4.0], r.text
    # The operator publishes the folder's counts before granting anyone.
    r = admin.put(f"{V1}/datasets/scans/policy", json={"declare_counted": True})
    assert r.status_code == 200 and len(r.json()["view"]["declared"]) == 3, r.text
    grants = [(c["olga"], ids["csv"]), (c["olga"], ids["npz"]), (admin, "scans")]
    for who, ds in grants:
        r = who.post(
            f"{V1}/datasets/{ds}/grants",
            json={"analyst": "ana", "epsilon_allowance": 5.0},
        )
        assert r.status_code == 201, r.text
    yield {"server": s, "c": c, "admin": admin, "ids": ids, "engine": engine, "folder": folder}
    s.stop()
    engine.dispose()


def _books(world: dict[str, Any]) -> dict[str, Any]:
    """Every ledger total and the audit log of the world's datasets, as their owners see
    them."""
    out = {}
    for ds in world["ids"].values():
        b = world["c"]["olga"].get(f"{V1}/datasets/{ds}/budget").json()
        out[ds] = {k: v for k, v in b.items() if k.startswith("epsilon") or k.startswith("delta")}
        out[ds]["audit"] = world["c"]["olga"].get(f"{V1}/datasets/{ds}/audit").json()["items"]
    b = world["admin"].get(f"{V1}/datasets/scans/budget").json()
    out["scans"] = {k: v for k, v in b.items() if k.startswith("epsilon") or k.startswith("delta")}
    out["sweeps"] = sorted(s["id"] for s in world["c"]["ana"].get(f"{V1}/sweeps").json()["items"])
    return out


def _both(ana: Any, spec: dict[str, Any]) -> tuple[Any, Any]:
    """The dry run's and the submission's answers to the same spec."""
    return ana.post(f"{V1}/sweeps:plan", json=spec), ana.post(f"{V1}/sweeps", json=spec)


def _same_refusal(plan: Any, submit: Any, status: int, field: str | None) -> dict[str, Any]:
    a = assert_problem(plan, status, field=field)
    b = assert_problem(submit, status, field=field)
    assert (a["type"], a["detail"], a.get("errors")) == (b["type"], b["detail"], b.get("errors"))
    return a


def test_reproducible_mode_is_refused_to_an_analyst(world: dict[str, Any]) -> None:
    ana, ds = world["c"]["ana"], world["ids"]["csv"]
    before = _books(world)
    spec = _spec(ds, privacy={"reproducible": True})
    body = _same_refusal(*_both(ana, spec), 403, None)
    assert "reproducible" in body["detail"] and "owner" in body["detail"]
    assert _books(world) == before
    # The owner may (their own data; labelled reproducible): the dry run plans it.
    r = world["c"]["olga"].post(f"{V1}/sweeps:plan", json=spec)
    assert r.status_code == 200, r.text


def test_an_analyst_cannot_choose_the_split_and_the_dry_run_applies_the_policy(
    world: dict[str, Any],
) -> None:
    ana, olga, ds = world["c"]["ana"], world["c"]["olga"], world["ids"]["csv"]
    before = _books(world)
    # The attack: a seed searched offline and a tiny fraction, to isolate one record.
    for field, value in (("split_seed", 918273), ("test_fraction", 0.004)):
        spec = _spec(ds, dataset={field: value})
        body = _same_refusal(*_both(ana, spec), 422, f"dataset.{field}")
        assert "owner" in body["detail"]
    # Repeating the owner's values is no change, and leaving them out takes them.
    plan = ana.post(f"{V1}/sweeps:plan", json=_spec(ds, dataset={"split_seed": 0}))
    assert plan.status_code == 200, plan.text
    plan = ana.post(f"{V1}/sweeps:plan", json=_spec(ds)).json()
    assert plan["grids"][0]["input_scaling"]["bounds"] == [-4.0, 4.0]  # the owner's
    # The owner moves the view: every later plan uses it, the analyst's old values are refused.
    r = olga.put(f"{V1}/datasets/{ds}/policy", json={"view": {"split_seed": 11}})
    assert r.status_code == 200 and r.json()["view"]["split_seed"] == 11
    _same_refusal(*_both(ana, _spec(ds, dataset={"split_seed": 0})), 422, "dataset.split_seed")
    assert ana.post(f"{V1}/sweeps:plan", json=_spec(ds)).status_code == 200
    assert_problem(
        olga.put(f"{V1}/datasets/{ds}/policy", json={"view": {"test_fraction": 1.5}}), 422
    )
    assert_problem(ana.put(f"{V1}/datasets/{ds}/policy", json={"view": {"split_seed": 1}}), 403)
    # A dry run applies the owner's policy as a submission does.
    r = olga.put(f"{V1}/datasets/{ds}/policy", json={"analyst_eval_modes": ["public"]})
    assert r.status_code == 200
    try:
        _same_refusal(*_both(ana, _spec(ds)), 422, "eval.mode")
    finally:
        olga.put(f"{V1}/datasets/{ds}/policy", json={"analyst_eval_modes": ["public", "dp"]})
    assert _books(world) == before


def test_loader_options_cannot_buy_a_fresh_ledger_and_no_sweep_repoints_a_name(
    world: dict[str, Any],
) -> None:
    ana, olga, ds = world["c"]["ana"], world["c"]["olga"], world["ids"]["npz"]
    engine = world["engine"]
    key = ledger_key_of(engine, ds)
    before = _books(world)
    for section in (
        {"options": {"layout": "nchw"}},
        {"label_column": "y"},
        {"input_bounds": [0, 1]},
        {"feature_clip": 1.0},
    ):
        field = f"dataset.{next(iter(section))}"
        _same_refusal(*_both(ana, _spec(ds, dataset=section, eval={"mode": "dp"})), 422, field)
    assert _books(world) == before
    # The owner may read her own file another way; the sweep is charged on the name's ledger,
    # and the name still reads the records it was uploaded with.
    r = olga.post(
        f"{V1}/sweeps",
        json=_spec(ds, name="olga-nchw", budget=0.5, dataset={"options": {"layout": "nchw"}}),
    )
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    olga.post(f"{V1}/sweeps/{sid}/cancel")
    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        assert sweep is not None and sweep.ledger_key == key
        bound = s.scalars(select(Dataset.content_sha256).where(Dataset.name == ds)).one()
    assert f"sha256:{bound}/olga" == key == ledger_key_of(engine, ds)
    budget = olga.get(f"{V1}/datasets/{ds}/budget").json()
    assert sid in {s["sweep"] for s in budget["sweeps"]}


def test_errors_on_the_owners_files_name_none_of_them(world: dict[str, Any]) -> None:
    ana, server = world["c"]["ana"], world["server"]
    folder: Path = world["folder"]
    before = _books(world)
    spec = _spec("scans", eval={"mode": "dp"})
    # The probe: a size no image has. Refused as the owner's setting, unread.
    body = _same_refusal(
        *_both(ana, _spec("scans", dataset={"options": {"size": [1, 1]}})), 422, "dataset.options"
    )
    assert "patient" not in str(body)
    # A file of the owner's broken on the server: the analyst learns that the dataset cannot
    # be read, not where or why; the operator's log has the reason.
    victim = folder / "sick" / "patient_1000_smith.png"
    good = victim.read_bytes()
    victim.write_bytes(b"not an image at all")
    try:
        plan, submit = _both(ana, spec)
        body = _same_refusal(plan, submit, 422, "dataset.name")
        for secret in ("patient", "smith", str(folder), "sick", ".png", "5x5", "(5, 5)"):
            assert secret not in plan.text and secret not in submit.text, secret
        assert "owner" in body["detail"]
        # The owner (an admin here) sees what is wrong with their own file.
        mine = world["admin"].post(f"{V1}/sweeps:plan", json=spec)
        assert mine.status_code == 422 and "patient_1000_smith" in mine.text
        assert "patient_1000_smith" in server.logs()
    finally:
        victim.write_bytes(good)
    assert _books(world) == before
    assert ana.post(f"{V1}/sweeps:plan", json=spec).status_code == 200
