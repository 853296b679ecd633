"""Data owners and analysts over real HTTP: grants, allowances, the audit log, the analysts'
policy, and a walk of the whole OpenAPI document with an analyst's token that checks no
response carries anything about the records beyond their public description.

One ``dpsweep serve`` (uvicorn, scheduler, local Ray) on a SQLite file; tenants: ``olga``
uploads the data, ``ana`` and ``bea`` are her analysts, ``mallory`` has no part in it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.testing.server import Server, start_server
from dpsweep import Client
from dpsweep.errors import ConfigError, NotFound, PermissionDenied
from sweeper.datasets.analyst_clock import coarse_time
from sweeper.datasets.identity import ledger_key_of
from sweeper.store import Dataset
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.api.test_api import assert_problem, read_sse, wait_for

pytestmark = pytest.mark.slow  # one server and two tiny sweeps: about a minute on two cores

V1 = "/api/v1"


def _records() -> tuple[bytes, list[str]]:
    """A CSV of 400 records with 6-decimal features (distinctive strings to look for in
    responses), and those values as text."""
    rng = np.random.default_rng(24)
    x = rng.uniform(-3, 3, size=(400, 4))
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    values = [f"{abs(v):.6f}" for v in x.ravel()]
    lines = ["a,b,c,d,label"] + [
        ",".join(f"{v:.6f}" for v in row) + f",{t}" for row, t in zip(x, y, strict=True)
    ]
    return ("\n".join(lines) + "\n").encode(), values


def _spec(dataset: str, *, name: str, budget: float, mode: str = "dp", n_lr: int = 1) -> Any:
    return {
        "name": name,
        "dataset": {"name": dataset, "input_bounds": [-5.0, 5.0]},
        "model": {"name": "logreg"},
        "training": {"steps": 6, "batch_size": 32, "eval_every": 3},
        "privacy": {"budgets": [budget], "delta": 1e-5},
        "eval": {"mode": mode},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1, 0.3][:n_lr], "clip": [1.0]}}],
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("grants-api")
    url = f"sqlite:///{work / 'api.db'}"
    upgrade(url)
    s = start_server(url, work)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def world(server: Server) -> dict[str, Any]:
    """Olga's upload granted to ana (ε 3) and bea (ε 2), a policy, and one finished dp sweep
    of each analyst."""
    c = {n: server.client(server.token(n)) for n in ("olga", "ana", "bea", "mallory")}
    content, values = _records()
    r = c["olga"].post(
        f"{V1}/datasets",
        files={"file": ("points.csv", content, "text/csv")},
        data={
            "format": "csv",
            "label_column": "label",
            "epsilon_cap": "20",
            "declare_counted": "true",
        },
    )
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    for analyst, eps in (("ana", 3.0), ("bea", 2.0)):
        r = c["olga"].post(
            f"{V1}/datasets/{ds}/grants",
            json={"analyst": analyst, "epsilon_allowance": eps, "note": "study 24"},
        )
        assert r.status_code == 201, r.text
        assert r.headers["location"] == f"{V1}/datasets/{ds}/grants/{analyst}"
        assert r.json()["active"] and r.json()["epsilon_allowance"] == eps
    r = c["olga"].put(
        f"{V1}/datasets/{ds}/policy",
        json={
            "public_info": {"label_names": ["neg", "pos"], "description": "points"},
            # DP evaluation scales by declared bounds only: the owner declares them.
            "view": {"input_bounds": [-5.0, 5.0]},
        },
    )
    assert r.status_code == 200, r.text
    sweeps = {}
    for who, budget, n_lr in (("ana", 2.0, 2), ("bea", 1.0, 1)):
        r = c[who].post(
            f"{V1}/sweeps", json=_spec(ds, name=f"{who}-sweep", budget=budget, n_lr=n_lr)
        )
        assert r.status_code == 201, r.text
        sweeps[who] = r.json()["id"]
    for who, sid in sweeps.items():
        assert wait_for(c[who], sid, lambda s: s["state"] == "done")["state"] == "done"
    trials = {
        who: [t["id"] for t in c[who].get(f"{V1}/sweeps/{sid}/trials").json()["items"]]
        for who, sid in sweeps.items()
    }
    owner_view = c["olga"].get(f"{V1}/datasets/{ds}").json()
    engine = make_engine(server.db_url)
    try:
        key = ledger_key_of(engine, ds)
        with Session(engine) as s:
            storage = s.scalar(select(Dataset.storage_path).where(Dataset.name == ds))
    finally:
        engine.dispose()
    return {
        "c": c,
        "ds": ds,
        "sweeps": sweeps,
        "trials": trials,
        "sha256": owner_view["sha256"],
        "size_bytes": owner_view["size_bytes"],
        "key": key,
        "storage": str(storage),
        "values": values,
    }


# ---------------------------------------------------------------------------------------------


def test_owners_grant_and_analysts_see_only_the_public_description(world: dict[str, Any]) -> None:
    c, ds = world["c"], world["ds"]
    olga, ana = c["olga"], c["ana"]
    mine = next(d for d in ana.get(f"{V1}/datasets").json()["items"] if d["id"] == ds)
    assert mine["role"] == "analyst"
    assert mine["public_info"] == {"label_names": ["neg", "pos"], "description": "points"}
    assert sorted(mine["analyst_eval_modes"]) == ["dp", "public"]
    assert mine["n_examples"] == 400 and mine["num_classes"] == 2
    for hidden in ("sha256", "size_bytes", "owner", "budget", "grants", "created_at"):
        assert hidden not in mine
    allowance = mine["allowance"]
    assert allowance["active"] and allowance["epsilon_allowance"] == 3.0
    assert 1.9 < allowance["epsilon_used"] <= 2.0
    assert allowance["epsilon_left"] == pytest.approx(3.0 - allowance["epsilon_used"])
    assert ana.get(f"{V1}/datasets/{ds}").json() == mine
    # Their budget is their allowance and their own sweeps.
    b = ana.get(f"{V1}/datasets/{ds}/budget").json()
    assert b["role"] == "analyst" and b["epsilon_used"] == allowance["epsilon_used"]
    assert [s["sweep"] for s in b["sweeps"]] == [world["sweeps"]["ana"]]
    assert "epsilon_committed" not in b and "epsilon_cap" not in b
    # The owner's views: unchanged, plus the role, the grants and the analysts' sweeps.
    own = olga.get(f"{V1}/datasets/{ds}").json()
    assert own["role"] == "owner" and own["sha256"] and own["size_bytes"]
    assert own["grants"] == {"active": 2, "epsilon_allowance": 5.0}
    budget = olga.get(f"{V1}/datasets/{ds}/budget").json()
    assert {s["owner"] for s in budget["sweeps"]} == {"ana", "bea"}
    listed = olga.get(f"{V1}/datasets/{ds}/grants").json()["items"]
    assert {g["analyst"]: g["active"] for g in listed} == {"ana": True, "bea": True}
    used = {g["analyst"]: g["epsilon_used"] for g in listed}
    assert used["ana"] == allowance["epsilon_used"] and 0.9 < used["bea"] <= 1.0
    theirs = ana.get(f"{V1}/datasets/{ds}/grants").json()["items"]
    assert [g["analyst"] for g in theirs] == ["ana"]
    assert ana.get(f"{V1}/datasets/{ds}/policy").json()["public_info"]["label_names"] == [
        "neg",
        "pos",
    ]
    # Olga sees every sweep on her data; she may read an analyst's sweep but not act on it.
    owners = {s["owner"] for s in olga.get(f"{V1}/sweeps").json()["items"]}
    assert owners == {"ana", "bea"}
    assert olga.get(f"{V1}/sweeps/{world['sweeps']['ana']}").status_code == 200
    assert_problem(olga.post(f"{V1}/sweeps/{world['sweeps']['ana']}/cancel"), 403)


def test_roles_are_checked_and_outsiders_see_nothing(world: dict[str, Any]) -> None:
    c, ds = world["c"], world["ds"]
    ana, mallory = c["ana"], c["mallory"]
    # An analyst sees the dataset: managing it is a 403.
    grant = {"analyst": "mallory", "epsilon_allowance": 1.0}
    assert_problem(ana.post(f"{V1}/datasets/{ds}/grants", json=grant), 403)
    assert_problem(ana.delete(f"{V1}/datasets/{ds}/grants/bea"), 403)
    assert_problem(ana.put(f"{V1}/datasets/{ds}/policy", json={"analyst_eval_modes": []}), 403)
    assert_problem(ana.put(f"{V1}/datasets/{ds}/budget", json={"epsilon_cap": 100}), 403)
    # Someone with no part in it: not found, whatever they ask.
    for path in ("", "/grants", "/audit", "/policy", "/budget"):
        assert_problem(mallory.get(f"{V1}/datasets/{ds}{path}"), 404)
    assert_problem(mallory.post(f"{V1}/datasets/{ds}/grants", json=grant), 404)
    assert_problem(mallory.delete(f"{V1}/datasets/{ds}/grants/ana"), 404)
    assert_problem(mallory.put(f"{V1}/datasets/{ds}/policy", json={}), 404)
    assert ds not in {d["id"] for d in mallory.get(f"{V1}/datasets").json()["items"]}
    for who in ("mallory", "bea"):
        assert_problem(c[who].get(f"{V1}/sweeps/{world['sweeps']['ana']}"), 404)
    assert_problem(mallory.post(f"{V1}/sweeps", json=_spec(ds, name="m", budget=1)), 422)
    # The owner's own mistakes: a grant to herself, an unknown mode.
    olga = c["olga"]
    r = olga.post(f"{V1}/datasets/{ds}/grants", json={"analyst": "olga", "epsilon_allowance": 1})
    assert_problem(r, 422, field="analyst")
    r = olga.put(f"{V1}/datasets/{ds}/policy", json={"analyst_eval_modes": ["raw"]})
    assert_problem(r, 422)
    assert_problem(olga.delete(f"{V1}/datasets/{ds}/grants/nobody"), 404)


def test_analysts_are_bound_by_allowance_and_eval_modes(world: dict[str, Any]) -> None:
    ana, ds = world["c"]["ana"], world["ds"]
    r = ana.post(f"{V1}/sweeps", json=_spec(ds, name="carve", budget=0.5, mode="carve-out"))
    assert_problem(r, 422, field="eval.mode")
    # ε 2 held of 3: another 2 does not fit the allowance (refused whole: nothing stored).
    before = len(ana.get(f"{V1}/sweeps").json()["items"])
    body = assert_problem(ana.post(f"{V1}/sweeps", json=_spec(ds, name="more", budget=2)), 409)
    assert body["type"].endswith("/budget-exhausted") and "allowance" in body["detail"]
    assert world["key"] not in body["detail"]
    assert len(ana.get(f"{V1}/sweeps").json()["items"]) == before


def test_the_audit_log_lists_each_release_to_whom_it_went(world: dict[str, Any]) -> None:
    c, ds = world["c"], world["ds"]
    olga, ana, bea = c["olga"], c["ana"], c["bea"]
    log = olga.get(f"{V1}/datasets/{ds}/audit").json()
    assert log["next_cursor"] is None
    entries = log["items"]
    assert [e["id"] for e in entries] == sorted(e["id"] for e in entries)
    ana_entries = [e for e in entries if e["sweep_id"] == world["sweeps"]["ana"]]
    assert {e["principal"] for e in ana_entries} == {"ana"}
    trial_entries = [e for e in ana_entries if e["kind"] == "trial"]
    assert {e["trial_id"] for e in trial_entries} == set(world["trials"]["ana"])
    # Each trial is logged before its kept model; their ε adds up to the sweep's charges.
    position = {(e["kind"], e["trial_id"]): i for i, e in enumerate(ana_entries)}
    models = [e for e in ana_entries if e["kind"] == "model"]
    assert len(trial_entries) == 2 and models
    assert all(
        position[("model", m["trial_id"])] > position[("trial", m["trial_id"])] for m in models
    )
    # A kept model of the analyst's: theirs and the dataset owner's (who sees every sweep on
    # her records) to download, nobody else's (404, as for the trial).
    # (A model logged earlier may since have been replaced by a better one of its grid.)
    kept = next(
        m["trial_id"]
        for m in reversed(models)
        if ana.get(f"{V1}/trials/{m['trial_id']}/model").status_code == 200
    )
    for who, status in ((olga, 200), (bea, 404)):
        assert who.get(f"{V1}/trials/{kept}/model").status_code == status
    charged = ana.get(f"{V1}/sweeps/{world['sweeps']['ana']}").json()["budget"]
    assert sum(e["epsilon"] for e in trial_entries) == pytest.approx(charged["epsilon_charged"])
    assert {e["principal"] for e in entries} == {"ana", "bea"}
    # Each analyst reads their own entries only, numbered in their own log, with their times
    # rounded down to 10 s; the owner may filter by analyst (keeping the numbers of hers).
    assert _unnumbered(ana.get(f"{V1}/datasets/{ds}/audit").json()["items"]) == _as_analyst(
        ana_entries
    )
    bea_entries = bea.get(f"{V1}/datasets/{ds}/audit").json()["items"]
    assert bea_entries and {e["principal"] for e in bea_entries} == {"bea"}
    assert ana.get(f"{V1}/datasets/{ds}/audit?analyst=bea").json()["items"] == []
    filtered = olga.get(f"{V1}/datasets/{ds}/audit", params={"analyst": "bea"}).json()
    assert _as_analyst(filtered["items"]) == _unnumbered(bea_entries)
    assert [e["id"] for e in filtered["items"]] == [
        e["id"] for e in entries if e["principal"] == "bea"
    ]
    # Pages: by cursor, and after an entry id.
    seen, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = olga.get(f"{V1}/datasets/{ds}/audit", params=params).json()
        seen += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == entries
    after = olga.get(f"{V1}/datasets/{ds}/audit", params={"after": entries[0]["id"]}).json()
    assert after["items"] == entries[1:]
    assert_problem(olga.get(f"{V1}/datasets/{ds}/audit?cursor=garbage"), 422, field="cursor")
    # Nobody edits it.
    for method in ("PUT", "PATCH", "DELETE", "POST"):
        assert_problem(olga.request(method, f"{V1}/datasets/{ds}/audit", json={}), 405)
    assert olga.get(f"{V1}/datasets/{ds}/audit").json()["items"] == entries


def _unnumbered(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Audit entries without their ids (each reader numbers their own log)."""
    return [{k: v for k, v in e.items() if k != "id"} for e in entries]


def _as_analyst(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The owner's audit entries as their analyst reads them (:func:`_unnumbered`): each
    release's time rounded down to 10 s (a release's time is its trial's end)."""
    return [e | {"at": coarse_time(e["at"])} for e in _unnumbered(entries)]


def _forbidden(world: dict[str, Any]) -> list[tuple[str, re.Pattern[str]]]:
    """What no analyst's response may contain, each with the pattern that finds it."""
    hexkey = world["key"].removeprefix("sha256:")
    out = [
        ("the file's sha256", re.compile(re.escape(world["sha256"]))),
        ("the records' identity", re.compile(re.escape(hexkey))),
        ("the storage path", re.compile(re.escape(world["storage"]))),
        ("the stored file's name", re.compile(re.escape(Path(world["storage"]).name))),
        ("the data folder", re.compile(re.escape(str(Path(world["storage"]).parent)))),
        ("the file's size", re.compile(rf"(?<![\d.]){world['size_bytes']}(?![\d])")),
        ("bea's sweep", re.compile(re.escape(world["sweeps"]["bea"]))),
    ]
    out += [("bea's trial", re.compile(re.escape(t))) for t in world["trials"]["bea"]]
    # Any of the 1,600 feature values, as written in the file (not inside a longer number).
    values = "|".join(sorted({re.escape(v) for v in world["values"]}))
    out.append(("a record's value", re.compile(rf"(?<![\d.])(?:{values})(?![\d])")))
    return out


def _fill(path: str, params: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: params[m.group(1)], path)


def test_walking_the_openapi_document_as_an_analyst_reveals_nothing_of_the_records(
    server: Server, world: dict[str, Any]
) -> None:
    ana = world["c"]["ana"]
    doc = ana.get("/openapi.json").json()
    forbidden = _forbidden(world)
    ds, mine, theirs = world["ds"], world["sweeps"]["ana"], world["sweeps"]["bea"]
    # Every id the analyst can know (and, to check isolation, the other analyst's).
    # Audits are the owner's (an analyst holds none): an audit id reads as unknown.
    no_audit = {"audit_id": "b" * 32}
    own = [
        {"sweep_id": mine, "trial_id": t, "dataset_id": ds, **no_audit}
        for t in world["trials"]["ana"]
    ]
    builtin = {
        "sweep_id": mine,
        "trial_id": world["trials"]["ana"][0],
        "dataset_id": "digits",
        **no_audit,
    }
    others = {"sweep_id": theirs, "trial_id": world["trials"]["bea"][0], "dataset_id": ds}
    checked = 0
    for path, ops in doc["paths"].items():
        if "get" not in ops:
            continue
        names = set(re.findall(r"\{(\w+)\}", path))
        assert names <= {"sweep_id", "trial_id", "dataset_id", "audit_id"}, path
        cases = [(p, "own") for p in own] if names else [({}, "own")]
        if "dataset_id" in names:
            cases.append((builtin, "builtin"))  # everyone's: its grants and log are no one's
        if names & {"sweep_id", "trial_id"}:
            cases.append((others, "others"))
        for params, whose in cases:
            url = _fill(path, params)
            with ana.stream("GET", url, timeout=60) as r:
                ctype = r.headers.get("content-type", "")
                streaming = ctype.startswith("text/event-stream")
                body = b"" if streaming else r.read()
            assert r.status_code in (200, 403, 404), (url, r.status_code, body[:300])
            if whose == "others" or "audit_id" in names:
                assert r.status_code == 404, (url, body[:300])
            elif whose == "builtin" or path.endswith(("/model", "/model-card")):
                # A trial's model may not be kept; a built-in has no grants or log.
                assert r.status_code in (200, 404), url
            else:
                assert r.status_code == 200, (url, body[:300])
            text = body.decode("utf-8", errors="replace")
            for what, pattern in forbidden:
                if whose == "others" and what.startswith("bea's"):
                    continue  # a 404 names the id it was asked for
                assert not pattern.search(text), f"{url} shows {what}"
            checked += 1
    assert checked >= 20
    # The patterns do find what they look for: the owner's view and the file itself trip them.
    tripped = {
        what
        for what, p in forbidden
        if p.search(world["c"]["olga"].get(f"{V1}/datasets/{ds}").text)
    }
    assert {"the file's sha256", "the file's size"} <= tripped
    assert dict(forbidden)["a record's value"].search(_records()[0].decode())


def test_the_sdk_grants_revokes_reads_the_log_and_sets_the_policy(
    server: Server, world: dict[str, Any]
) -> None:
    ds = world["ds"]
    olga = Client(server.base, token=server.token("olga"), retries=0)
    ana = Client(server.base, token=server.token("ana"), retries=0)
    mallory = Client(server.base, token=server.token("mallory"), retries=0)
    try:
        assert {g["analyst"] for g in olga.grants(ds)} == {"ana", "bea"}
        # carl has no token yet: his name is granted only once confirmed.
        with pytest.raises(ConfigError) as refused:
            olga.grant(ds, "carl", 1.5, note="pilot")
        assert refused.value.field == "analyst" and "confirm" in str(refused.value)
        g = olga.grant(ds, "carl", 1.5, note="pilot", confirm=True)
        assert g["active"] and g["epsilon_allowance"] == 1.5 and g["note"] == "pilot"
        assert olga.revoke(ds, "carl")["active"] is False
        with pytest.raises(NotFound):
            olga.revoke(ds, "carl")
        # The policy: what is not given stays.
        p = olga.set_dataset_policy(ds, description="2-d points, four features")
        assert p["public_info"] == {
            "label_names": ["neg", "pos"],
            "description": "2-d points, four features",
        }
        p = olga.set_dataset_policy(ds, analyst_eval_modes=["dp", "public"])
        assert ana.dataset_policy(ds) == p and sorted(p["analyst_eval_modes"]) == ["dp", "public"]
        # Every page of the log, as the REST list gives it in one.
        log = list(olga.audit_log(ds, page_size=1))
        assert log == world["c"]["olga"].get(f"{V1}/datasets/{ds}/audit").json()["items"]
        assert _as_analyst(list(olga.audit_log(ds, analyst="ana"))) == _unnumbered(
            list(ana.audit_log(ds))
        )
        assert ana.budget(ds)["role"] == "analyst"
        with pytest.raises(PermissionDenied):
            ana.grant(ds, "mallory", 1.0)
        with pytest.raises(PermissionDenied):
            ana.set_dataset_policy(ds, analyst_eval_modes=["carve-out"])
        for call in (mallory.grants, mallory.dataset_policy, lambda d: list(mallory.audit_log(d))):
            with pytest.raises(NotFound):
                call(ds)
    finally:
        for c in (olga, ana, mallory):
            c.close()


# ---------------------------------------------------------------------------------------------
# Issue 36: what the numbers a tenant is shown say about the other tenants


def _digits_spec(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "dataset": {"name": "digits"},
        "model": {"name": "logreg"},
        "training": {"steps": 4, "batch_size": 32, "eval_every": 2},
        "privacy": {"budgets": [0.5], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
    }


def _mallorys_digits_sweep(world: dict[str, Any]) -> dict[str, Any]:
    """Another tenant's activity on the shared built-in: mallory's sweep on digits (events,
    ledger entries), run to its end once per module; its summary."""
    if "mallory_digits" not in world:
        mallory = world["c"]["mallory"]
        r = mallory.post(f"{V1}/sweeps", json=_digits_spec("mallory's"))
        assert r.status_code == 201, r.text
        ended = ("done", "failed", "cancelled")
        world["mallory_digits"] = wait_for(mallory, r.json()["id"], lambda s: s["state"] in ended)
    return dict(world["mallory_digits"])


def test_etags_say_nothing_of_what_other_tenants_did(world: dict[str, Any]) -> None:
    c = world["c"]
    ana, olga = c["ana"], c["olga"]
    path = f"{V1}/sweeps/{world['sweeps']['ana']}"
    first = ana.get(path)
    tag = first.headers["etag"]
    # A keyed hash: no sweep id, no event or ledger counter to read or subtract.
    assert re.fullmatch(r'W/"[0-9a-f]{32}"', tag), tag
    assert world["sweeps"]["ana"] not in tag
    # Another tenant's activity (a sweep on the shared built-in: events, ledger entries)...
    _mallorys_digits_sweep(world)
    # ... leaves the analyst's ETag as it was, and If-None-Match still answers 304.
    for sub in ("", "/results", "/pareto"):
        again = ana.get(f"{path}{sub}")
        assert again.status_code == 200 and re.fullmatch(r'W/"[0-9a-f]{32}"', again.headers["etag"])
        r = ana.get(f"{path}{sub}", headers={"If-None-Match": again.headers["etag"]})
        assert r.status_code == 304 and r.content == b""
    assert ana.get(path).headers["etag"] == tag
    # Each viewer has their own: the owner's tag of the same version is not the analyst's.
    theirs = olga.get(path).headers["etag"]
    assert theirs != tag and olga.get(path, headers={"If-None-Match": tag}).status_code == 200


def test_audit_and_event_ids_count_only_what_the_reader_sees(world: dict[str, Any]) -> None:
    c, ds = world["c"], world["ds"]
    everyone = c["olga"].get(f"{V1}/datasets/{ds}/audit").json()["items"]
    for who in ("ana", "bea"):
        own = c[who].get(f"{V1}/datasets/{ds}/audit").json()["items"]
        # 1, 2, ...: the other analyst's releases (before, between) leave no gap.
        assert [e["id"] for e in own] == list(range(1, len(own) + 1)), who
        assert len(own) < len(everyone)
        after = c[who].get(f"{V1}/datasets/{ds}/audit", params={"after": own[0]["id"]}).json()
        assert after["items"] == own[1:]
        # A sweep's events are numbered in the sweep, whatever other sweeps emitted.
        events = read_sse(c[who], f"{V1}/sweeps/{world['sweeps'][who]}/events")
        assert [e["id"] for e in events] == list(range(1, len(events) + 1)), who
        middle = events[len(events) // 2]["id"]
        rest = read_sse(
            c[who],
            f"{V1}/sweeps/{world['sweeps'][who]}/events",
            headers={"Last-Event-ID": str(middle)},
        )
        assert rest == events[middle:]


def test_a_builtin_shows_a_tenant_only_their_own_spending(
    server: Server, world: dict[str, Any]
) -> None:
    c = world["c"]
    done = _mallorys_digits_sweep(world)
    mine = done["id"]
    admin = server.client(server.token("root", admin=True))
    try:
        total = admin.get(f"{V1}/datasets/digits/budget").json()
    finally:
        admin.close()
    # Only mallory spent on digits here: the records' totals are hers.
    assert total["epsilon_committed"] > 0
    for who in ("ana", "olga", "mallory"):
        b = c[who].get(f"{V1}/datasets/digits/budget").json()
        if who == "mallory":
            assert [s["sweep"] for s in b["sweeps"]] == [mine]
            for k in ("epsilon_committed", "epsilon_reserved", "delta_committed"):
                assert b[k] == pytest.approx(total[k]), k
        else:
            # Nothing of mallory's spending reaches another tenant.
            assert b["sweeps"] == []
            for k in ("epsilon_committed", "epsilon_reserved", "delta_committed"):
                assert b[k] == 0, (who, k)
        assert b["scope"] == "yours", who
        listed = next(
            d["budget"] for d in c[who].get(f"{V1}/datasets").json()["items"] if d["id"] == "digits"
        )
        assert listed["scope"] == "yours"
        assert listed["epsilon_committed"] == b["epsilon_committed"]
        assert listed["epsilon_reserved"] == b["epsilon_reserved"]
    assert total["scope"] == "records"
    # Her sweep's dataset-lifetime figure is her own spending too.
    life = done["privacy"]["dataset_lifetime"]
    assert life["scope"] == "tenant"
    assert life["epsilon_spent"] == pytest.approx(total["epsilon_committed"])


def test_a_grant_to_a_name_no_token_has_is_refused_unless_confirmed(
    server: Server, world: dict[str, Any]
) -> None:
    c, ds = world["c"], world["ds"]
    olga = c["olga"]
    url = f"{V1}/datasets/{ds}/grants"
    body = assert_problem(
        olga.post(url, json={"analyst": "carl", "epsilon_allowance": 1}), 422, field="analyst"
    )
    assert "token create --name carl" in body["detail"] and "confirm" in body["detail"]
    assert "carl" not in {g["analyst"] for g in olga.get(url).json()["items"] if g["active"]}
    # A non-owner learns nothing of which names exist: the dataset is not theirs.
    assert_problem(c["mallory"].post(url, json={"analyst": "carl", "epsilon_allowance": 1}), 404)
    r = olga.post(url, json={"analyst": "carl", "epsilon_allowance": 1, "confirm": True})
    assert r.status_code == 201 and r.json()["analyst"] == "carl", r.text
    assert olga.delete(f"{url}/carl").status_code == 200
    # A token's name needs no confirming.
    server.token("dora")
    r = olga.post(url, json={"analyst": "dora", "epsilon_allowance": 0.5})
    assert r.status_code == 201 and r.json()["active"], r.text
    assert olga.delete(f"{url}/dora").status_code == 200


def test_revoking_stops_new_submissions_and_keeps_the_history(world: dict[str, Any]) -> None:
    c, ds = world["c"], world["ds"]
    olga, ana = c["olga"], c["ana"]
    r = olga.delete(f"{V1}/datasets/{ds}/grants/ana")
    assert r.status_code == 200 and r.json()["active"] is False and r.json()["revoked_at"]
    assert_problem(olga.delete(f"{V1}/datasets/{ds}/grants/ana"), 404)
    assert_problem(ana.post(f"{V1}/sweeps", json=_spec(ds, name="late", budget=0.5)), 422)
    assert ds not in {d["id"] for d in ana.get(f"{V1}/datasets").json()["items"]}
    # What was released to them stays theirs to read; their allowance shows revoked.
    view = ana.get(f"{V1}/datasets/{ds}").json()
    assert view["allowance"]["active"] is False and view["allowance"]["epsilon_left"] == 0
    assert ana.get(f"{V1}/datasets/{ds}/audit").json()["items"]
    assert ana.get(f"{V1}/sweeps/{world['sweeps']['ana']}").status_code == 200
    grants = olga.get(f"{V1}/datasets/{ds}/grants").json()["items"]
    assert {g["analyst"]: g["active"] for g in grants if g["analyst"] not in ("carl", "dora")} == {
        "ana": False,
        "bea": True,
    }
    assert olga.get(f"{V1}/datasets/{ds}").json()["grants"]["active"] == 1
