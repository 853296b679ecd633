"""The analyst guarantee at the unit level (issue 54): neighbouring datasets differ by a whole
person.

Two worlds, each a fresh ``dpsweep serve`` on its own SQLite file, as in
:mod:`tests.api.test_neighbouring_datasets` (whose masking, walk and report this test reuses).
In one the owner uploads a CSV of patients (a ``patient_id`` unit column; patients of 1 to 12
rows, and one of 50); in the other the same minus that 50-row patient, every row of theirs.
Both owners declare the same view (the rows' number, classes, feature shape, the number of
units, bounds, split) and grant the analyst ``ana`` the same allowance. The same analyst
session then runs in both: dry runs and submissions of valid and refused specs, a sweep run
to its end with DP evaluation, and every route of the OpenAPI document read back.

Every response, status, body and headers, must be identical once ids, clock times and the DP
outputs are masked: removing one person (not one row) is the neighbouring relation the
per-unit ε protects (docs/privacy.md, "What is protected: rows or people").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from api.testing.server import start_server
from sweeper.store.schema import upgrade
from tests.api.test_api import wait_for
from tests.api.test_neighbouring_datasets import (
    EXCLUDED_HEADERS,
    V1,
    Masker,
    _paths,
    _requests,
    _spec,
)

pytestmark = pytest.mark.slow  # two servers, a few tiny sweeps each

N_PATIENTS = 40
BIG = 11  # the patient of 50 rows, whom the neighbour lacks


def _patients() -> list[tuple[int, str]]:
    """(patient, CSV line) per row: 40 patients of 1-12 rows, patient BIG of 50."""
    rng = np.random.default_rng(54)
    sizes = rng.integers(1, 13, size=N_PATIENTS)
    sizes[BIG] = 50
    ids = rng.permutation(np.repeat(np.arange(N_PATIENTS), sizes))
    x = rng.uniform(-3, 3, size=(len(ids), 4))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int)
    return [
        (int(p), ",".join(f"{v:.5f}" for v in row) + f",p{p:03d},{t}")
        for p, row, t in zip(ids, x, y, strict=True)
    ]


ROWS = _patients()
DECLARED = {
    "n_examples": len(ROWS),  # declared: the same in both worlds, whatever their count
    "classes": ["0", "1"],
    "input_shape": [4],
    "n_units": N_PATIENTS,
    "input_bounds": [-4.0, 4.0],
    "test_fraction": 0.2,
}


def _csv(lines: list[str]) -> bytes:
    return ("a,b,c,d,patient_id,label\n" + "\n".join(lines) + "\n").encode()


def _owner_setup(server: Any, lines: list[str]) -> str:
    """The owner's side: the patients uploaded with their unit, the view declared, the
    analyst granted, and a sweep of the owner's own spent on the records."""
    olga = server.client(server.token("olga"))
    server.token("ana")  # the analyst's tenant exists before anything is granted
    r = olga.post(
        f"{V1}/datasets",
        files={"file": ("patients.csv", _csv(lines), "text/csv")},
        data={
            "format": "csv",
            "label_column": "label",
            "privacy_unit": "patient_id",
            "epsilon_cap": "20",
        },
    )
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    r = olga.put(f"{V1}/datasets/{ds}/policy", json={"view": DECLARED})
    assert r.status_code == 200, r.text
    r = olga.post(f"{V1}/datasets/{ds}/grants", json={"analyst": "ana", "epsilon_allowance": 3})
    assert r.status_code == 201, r.text
    r = olga.post(f"{V1}/sweeps", json=_spec(ds, name="olga-own", budget=2.0))
    assert r.status_code == 201, r.text
    assert wait_for(olga, r.json()["id"], lambda s: s["state"] == "done")["state"] == "done"
    return str(ds)


def _world(tmp: Path, lines: list[str]) -> list[Any]:
    """One world's transcript: (request, status, masked body, masked headers)."""
    url = f"sqlite:///{tmp / 'api.db'}"
    upgrade(url)
    # One worker: trials run in grid order, the same in both worlds.
    server = start_server(url, tmp, workers=1)
    try:
        ds = _owner_setup(server, lines)
        ana = server.client(server.token("ana"))
        masker = Masker()
        out: list[Any] = []

        def ask(method: str, path: str, body: Any = None) -> tuple[Any, bytes]:
            with ana.stream(method, path, json=body, timeout=120) as resp:
                raw = resp.read()
            ctype = resp.headers.get("content-type", "")
            key = f"{method} {masker.text(path)} {masker.text(json.dumps(body, sort_keys=True))}"
            masked = masker.body(ctype, raw)
            if resp.status_code == 201 and isinstance(masked, dict):
                # Reserved versus spent at this moment is the scheduler's pace: their sum.
                held = masked.get("privacy", {}).get("dataset_lifetime", {})
                for q in ("epsilon", "delta"):
                    if f"{q}_spent" in held and f"{q}_reserved" in held:
                        total = held.pop(f"{q}_spent") + held.pop(f"{q}_reserved")
                        held[f"{q}_held"] = round(total, 9)
            headers = {
                k: masker.text(v)
                for k, v in sorted(resp.headers.items())
                if k not in EXCLUDED_HEADERS
            }
            out.append((key, resp.status_code, masked, headers))
            return resp, raw

        # Dry runs first (the plan is in units: q = b / n_units, from the declaration).
        for spec in (_spec(ds), _spec(ds, training={"batch_size": 8, "rows_per_unit": 4})):
            ask("POST", f"{V1}/sweeps:plan", spec)
        resp, raw = ask("POST", f"{V1}/sweeps", _spec(ds, name="study", artifacts={"keep": "all"}))
        assert resp.status_code == 201, raw
        sid = json.loads(raw)["id"]
        assert wait_for(ana, sid, lambda s: s["state"] == "done")["state"] == "done"
        trials = ana.get(f"{V1}/sweeps/{sid}/trials").json()["items"]
        for t in sorted(trials, key=lambda t: t["number"]):
            masker.text(t["id"])  # trial ids numbered in grid order
        own = {"sweep_id": sid, "trial_id": trials[0]["id"], "dataset_id": ds, "audit_id": "b" * 32}
        doc = ana.get("/openapi.json").json()
        for method, path, body in _requests(doc, own, ds, []):
            ask(method, path, body)
        return out
    finally:
        server.stop()


def test_an_analyst_sees_the_same_bytes_without_one_whole_patient(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    lines = [line for _, line in ROWS]
    neighbour = [line for p, line in ROWS if p != BIG]
    assert len(lines) - len(neighbour) == 50
    a = _world(tmp_path_factory.mktemp("d"), lines)
    b = _world(tmp_path_factory.mktemp("d-minus-a-patient"), neighbour)
    assert [k for k, *_ in a] == [k for k, *_ in b]
    statuses = {s for _, s, _, _ in a}
    assert {200, 201, 403, 404, 422} <= statuses, statuses
    differ = [
        (key, sa, sb, body_a, body_b, ha, hb)
        for (key, sa, body_a, ha), (_, sb, body_b, hb) in zip(a, b, strict=True)
        if (sa, body_a, ha) != (sb, body_b, hb)
    ]
    report = "\n".join(
        f"{key[:120]}: {sa} vs {sb}\n    "
        + "\n    ".join((_paths(x, y) + _paths(ha, hb, "headers"))[:6])
        for key, sa, sb, x, y, ha, hb in differ[:25]
    )
    assert not differ, f"{len(differ)} of {len(a)} responses differ:\n{report}"
