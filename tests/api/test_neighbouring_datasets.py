"""The analyst guarantee, tested as the attack it defends against: neighbouring datasets.

Two worlds, each a fresh ``dpsweep serve`` on its own SQLite file. In one the owner uploads
D; in the other D′ = D minus one record. Each owner declares the same public description
(the dataset's view: its size, classes, feature shape, bounds and split; label names), grants
the analyst ``ana`` the same allowance, and spends on their records with a sweep of their own.
Each owner also uploads the same records a second time with nothing declared, and ``ana``
holds a grant on it from before declarations were required. Then the same analyst session
runs in both worlds:

* ``ana`` uploads guesses of the owner's records as her own files, D and D′ (the membership
  test the issue found: with shared ledgers, the upload that matched the owner's records read
  the owner's spending and could lower the owner's cap), with a tiny cap and a lowering cap,
  and sets her own upload's budget;
* every route of the OpenAPI document with every method, on the analyst's own ids (her sweep,
  her trial, the granted dataset, the undeclared one and her own uploads) and on ids she may
  not see, with bad parameters; dry runs and submissions of valid and refused specs (bad
  options, sizes, seeds, modes, budgets); one sweep run to its end and everything read back.

The rule (docs/privacy.md): every byte an analyst can obtain is a function of the public
description the owner declared, the DP outputs, and the analyst's own inputs. So once ids and
clock times are masked, and the DP outputs themselves (:data:`MASKED`, each with its reason),
every response, status, body and headers (but :data:`EXCLUDED_HEADERS`), must be identical in
the two worlds.

The session is driven by the OpenAPI document: a route added later is walked with every
method it declares, without editing this test (``_requests``).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session

from api.testing.server import start_server
from sweeper.store import DatasetGrant
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.api.test_api import wait_for

pytestmark = pytest.mark.slow  # two servers, three tiny sweeps each: a minute or two

V1 = "/api/v1"
N = 300
REMOVED = 17  # the record D′ lacks: the only one of class 2
DECLARED = {
    "n_examples": N,
    "classes": ["0", "1", "2"],
    "input_shape": [4],
    "input_bounds": [-4.0, 4.0],
    "test_fraction": 0.2,
}
#: What the analyst receives that is masked before the worlds are compared, and why. DP
#: outputs, computed from the records under ε, differ between the worlds as any two draws of
#: the noise do; everything else must be identical. (Besides these keys, the :class:`Masker`
#: replaces ids, which are random, and clock times, which an analyst receives rounded down to
#: 10 s: the machine's pace, see docs/privacy.md. Worker ids, per-step times and
#: ``train_seconds`` are compared as they are: null, null and a multiple of 10 s.)
MASKED: dict[str, str] = {
    # DP outputs: noisy metrics and what was chosen by them.
    "metrics": "noisy metrics (DP evaluation)",
    "final_metrics": "noisy metrics",
    "history": "noisy metrics over the steps",
    "trajectories": "the clipping bound and learning rate over the steps: DP-SGD's state",
    "best_step": "chosen by noisy accuracy",
    "diverged_at": "a property of the noisy training run",
    "results": "noisy metrics per trial",
    "points": "noisy metrics per trial (the plots)",
    "front": "the Pareto front of noisy metrics",
    "pareto": "the Pareto front of noisy metrics",
    "objective_value": "a noisy metric",
    "best": "chosen by noisy metrics",
    "value": "a noisy metric",
    "accuracy": "a noisy metric",
    "accuracy_at_selection": "a noisy metric",
    "objective": "a noisy metric",
    "model": "the trained weights' description on a card (a DP output)",
    # The trained weights: their hash and size vary with the noise.
    "weights_sha256": "hash of the trained weights",
    "sha256": "hash of the trained weights (or of its card)",
    "bytes": "size of the compressed trained weights",
    "size_bytes": "size of the compressed trained weights",
}
#: Response headers left out of the comparison, and why.
EXCLUDED_HEADERS: dict[str, str] = {
    "date": "the clock",
    "content-length": "the length of a body whose DP outputs and ids differ; the body itself is "
    "compared",
    "etag": "a sweep's is an HMAC under a per-server random key (differs between any two "
    "servers); a model's is the hash of its weights (a DP output)",
    "repr-digest": "the hash of the trained weights (a DP output)",
    "digest": "the hash of the trained weights (a DP output)",
}


def _records() -> list[str]:
    rng = np.random.default_rng(36)
    x = rng.uniform(-3, 3, size=(N, 4))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int)
    y[REMOVED] = 2  # a class of one record: counted from the records, D′ would have two
    return [",".join(f"{v:.5f}" for v in row) + f",{t}" for row, t in zip(x, y, strict=True)]


def _csv(records: list[str]) -> bytes:
    return ("a,b,c,d,label\n" + "\n".join(records) + "\n").encode()


def _spec(ds: str, *, name: str = "probe", budget: float = 1.0, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "dataset": {"name": ds},
        "model": {"name": "logreg"},
        "training": {"steps": 4, "batch_size": 16, "eval_every": 2},
        "privacy": {"budgets": [budget], "delta": 1e-5},
        "eval": {"mode": "dp"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1, 0.3], "clip": [1.0]}}],
    }
    for section, values in extra.items():
        spec[section] = {**spec.get(section, {}), **values}
    return spec


def _probes(ds: str) -> list[tuple[str, dict[str, Any]]]:
    """Specs an analyst may try: valid ones and every refusal path the issue names."""
    return [
        ("valid", _spec(ds)),
        ("options", _spec(ds, dataset={"options": {"delimiter": ";"}})),
        ("label column", _spec(ds, dataset={"label_column": "a"})),
        ("split seed", _spec(ds, dataset={"split_seed": 918273})),
        ("tiny fraction", _spec(ds, dataset={"test_fraction": 0.004})),
        ("bounds", _spec(ds, dataset={"input_bounds": [0, 1]})),
        ("path", _spec(ds, dataset={"path": "/etc/passwd"})),
        ("huge batch", _spec(ds, training={"batch_size": 100000})),
        ("batch of N", _spec(ds, training={"batch_size": N - 60})),
        ("batch of N+1", _spec(ds, training={"batch_size": N - 59})),
        ("one record batches", _spec(ds, training={"batch_size": 1, "steps": 1})),
        ("epochs", _spec(ds, training={"epochs": 1, "steps": None})),
        ("reproducible", _spec(ds, privacy={"reproducible": True})),
        ("carve-out", _spec(ds, eval={"mode": "carve-out"})),
        ("over allowance", _spec(ds, budget=50.0)),
        ("unknown model option", _spec(ds, model={"options": {"width": -1}})),
        ("bad delta", _spec(ds, privacy={"delta": 0.5})),
    ]


class Masker:
    """Ids and clock times become placeholders numbered by first appearance, so two worlds'
    transcripts compare position by position."""

    ID = re.compile(r"\b(?:ds_[0-9a-f]{24}|[0-9a-f]{32})\b")
    TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?")

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}

    def text(self, s: str) -> str:
        s = self.TIME.sub("<time>", s)
        return self.ID.sub(lambda m: self.ids.setdefault(m.group(0), f"<id{len(self.ids)}>"), s)

    def value(self, v: Any) -> Any:
        if isinstance(v, dict):
            return {
                self.text(k): (
                    "<dp>"
                    if k in MASKED
                    # A sweep the walk submitted is pending or already running: the
                    # scheduler's pace, not the data.
                    else "<queued>"
                    if k == "state" and x in ("pending", "running")
                    else "<time>"
                    if k == "started_at" and x is None
                    else self.value(x)
                )
                for k, x in v.items()
            }
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, str):
            return self.text(v)
        return v

    def body(self, ctype: str, raw: bytes) -> Any:
        if ctype.startswith(("application/json", "application/problem+json")):
            return self.value(json.loads(raw))
        if ctype.startswith("text/event-stream"):
            events = []
            for block in raw.decode().split("\n\n"):
                fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
                if "data" in fields:
                    fields["data"] = self.value(json.loads(fields["data"]))
                events.append(self.value(fields))
            return events
        if ctype.startswith("application/octet-stream") or ctype.startswith("application/zip"):
            return f"<{len(raw) > 0} bytes: the trained weights, a DP output>"
        return self.text(raw.decode("utf-8", errors="replace"))


def _fill(path: str, params: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: params[m.group(1)], path)


def _requests(
    doc: dict[str, Any], own: dict[str, str], ds: str, more_datasets: list[str]
) -> list[tuple[str, str, Any]]:
    """Every (method, url, json body) of the walk, from the OpenAPI document.

    Each operation is asked on the analyst's own ids, on ids they may not see, and with
    malformed query parameters; mutating ones get an empty body and, for the spec routes, every
    probe spec. Each route about a dataset is asked again on ``more_datasets`` (the undeclared
    one, the analyst's own uploads), and the spec routes get a valid spec on each. Deletions
    come last (they remove what the rest reads), the granted dataset's before the others'.
    """
    unknown = {
        "sweep_id": "0" * 32,
        "trial_id": "f" * 32,
        "dataset_id": "ds_" + "0" * 24,
        "audit_id": "a" * 32,
    }
    unknown["analyst"] = "bea"
    mine = {**own, "analyst": "ana"}
    reads: list[tuple[str, str, Any]] = []
    writes: list[tuple[str, str, Any]] = []
    deletes: list[tuple[str, str, Any]] = []
    for path, ops in doc["paths"].items():
        names = set(re.findall(r"\{(\w+)\}", path))
        for method in sorted(ops):
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            urls = [_fill(path, mine)]
            if names:
                urls.append(_fill(path, {**mine, **unknown}))
            if "dataset_id" in names:
                urls += [_fill(path, {**mine, "dataset_id": d}) for d in more_datasets]
            for url in urls:
                if method == "get":
                    reads.append(("GET", url, None))
                    for query in ("?limit=0", "?cursor=garbage", "?x=nonsense&y=loss"):
                        reads.append(("GET", url + query, None))
                elif method == "delete":
                    deletes.append(("DELETE", url, None))
                else:
                    writes.append((method.upper(), url, {}))
                    if path.endswith(("/sweeps", "/sweeps:plan")):
                        writes += [(method.upper(), url, spec) for _, spec in _probes(ds)]
                        writes += [(method.upper(), url, _spec(d)) for d in more_datasets]
                    if path.endswith("/audits"):
                        # An audit is the owner's: the analyst asks for one on the dataset, on
                        # their own trial, and with values out of range.
                        writes += [
                            (method.upper(), url, {"dataset": ds, "epsilon": 1, "steps": 2}),
                            (method.upper(), url, {"trial": own["trial_id"], "canaries": 100}),
                            (method.upper(), url, {"dataset": ds, "canaries": 1}),
                        ]
    return reads + writes + deletes


def _owner_setup(server: Any, records: list[str]) -> tuple[str, str]:
    """The owner's side of a world: D (or D′) uploaded, declared and granted, spent on by a
    sweep of the owner's own; the same records again with nothing declared, on which the
    analyst holds a grant from before declarations were required. Returns both ids."""
    olga = server.client(server.token("olga"))
    server.token("ana")  # the analyst's tenant exists before anything is granted
    ids = []
    # One to declare, one left undeclared: the same records, in another row order (the same
    # file again would return the first upload rather than store a second).
    for rows in (records, list(reversed(records))):
        r = olga.post(
            f"{V1}/datasets",
            files={"file": ("patients.csv", _csv(rows), "text/csv")},
            data={"format": "csv", "label_column": "label", "epsilon_cap": "20"},
        )
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    ds, undeclared = ids
    r = olga.put(
        f"{V1}/datasets/{ds}/policy",
        json={"view": DECLARED, "public_info": {"label_names": ["low", "high", "rare"]}},
    )
    assert r.status_code == 200, r.text
    # Nothing declared, no grant: the refusal says what to declare and how.
    r = olga.post(
        f"{V1}/datasets/{undeclared}/grants", json={"analyst": "ana", "epsilon_allowance": 3}
    )
    assert r.status_code == 409 and "declare_counted" in r.text, r.text
    r = olga.post(f"{V1}/datasets/{ds}/grants", json={"analyst": "ana", "epsilon_allowance": 3})
    assert r.status_code == 201, r.text
    r = olga.post(f"{V1}/sweeps", json=_spec(ds, name="olga-own", budget=2.0))
    assert r.status_code == 201, r.text
    assert wait_for(olga, r.json()["id"], lambda s: s["state"] == "done")["state"] == "done"
    return ds, undeclared


def _old_grant(url: str, dataset: str) -> None:
    """A grant made before grants needed declared facts (written as that code wrote it)."""
    engine = make_engine(url)
    with Session(engine) as session, session.begin():
        session.add(
            DatasetGrant(
                dataset=dataset,
                analyst="ana",
                epsilon_allowance=Decimal(3),
                granted_by="olga",
                created_at=datetime.now(UTC),
            )
        )
    engine.dispose()


def _world(tmp: Path, records: list[str], guesses: dict[str, list[str]]) -> list[Any]:
    """One world: a server, the owner's uploads, spending and declarations, the analyst's
    session. Returns the transcript: (request, status, masked body, masked headers)."""
    url = f"sqlite:///{tmp / 'api.db'}"
    upgrade(url)
    # One worker: trials start and finish in grid order, so the order of events and charges
    # is the same in both worlds (with two, it is a race between packs: timing, not data).
    server = start_server(url, tmp, workers=1)
    try:
        ds, undeclared = _owner_setup(server, records)
        _old_grant(url, undeclared)
        olga_budget = server.client(server.token("olga")).get(f"{V1}/datasets/{ds}/budget")
        ana = server.client(server.token("ana"))
        masker = Masker()
        out: list[Any] = []

        def ask(method: str, path: str, body: Any = None, **kw: Any) -> Any:
            with ana.stream(method, path, json=body, timeout=120, **kw) as resp:
                raw = resp.read()
            ctype = resp.headers.get("content-type", "")
            shown = masker.text(json.dumps(body, sort_keys=True))
            key = f"{method} {masker.text(path)} {shown[:300]} {sorted(kw.get('data') or {})}"
            masked = masker.body(ctype, raw)
            if resp.status_code == 201 and isinstance(masked, dict):
                # A sweep just submitted may already be running while earlier probe sweeps
                # charge their trials: how the analyst's holding splits between reserved and
                # spent at that moment is the scheduler's pace; their sum is compared.
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

        # The analyst's guesses of the owner's records, as her own files: one of them equals
        # the owner's records in each world. A cap below the owner's spend, then a tiny one on
        # a second upload of the same records (another row order: the same file again would
        # return the first upload), which shares the first's ledger and tightens its cap.
        uploads = []
        for name, guess in guesses.items():
            for cap, rows in (("3.5", guess), ("0.01", list(reversed(guess)))):
                resp, raw = ask(
                    "POST",
                    f"{V1}/datasets",
                    files={"file": (f"{name}.csv", _csv(rows), "text/csv")},
                    data={"format": "csv", "label_column": "label", "epsilon_cap": cap},
                )
                assert resp.status_code == 201, raw
                uploads.append(json.loads(raw)["id"])
        for upload in uploads:
            ask("PUT", f"{V1}/datasets/{upload}/budget", {"epsilon_cap": 0.5})
        # No upload of hers touched the owner's ledger.
        olga = server.client(server.token("olga"))
        assert olga.get(f"{V1}/datasets/{ds}/budget").json() == olga_budget.json()

        # The sweep the walk reads: submitted first, run to its end.
        # Every model kept: which one a grid keeps is a DP output (chosen by noisy accuracy).
        resp, raw = ask("POST", f"{V1}/sweeps", _spec(ds, name="study", artifacts={"keep": "all"}))
        assert resp.status_code == 201, raw
        sid = json.loads(raw)["id"]
        assert wait_for(ana, sid, lambda s: s["state"] == "done")["state"] == "done"
        trials = ana.get(f"{V1}/sweeps/{sid}/trials").json()["items"]
        # Trial ids are numbered in grid order (their public position), whatever order they
        # first appear in.
        for t in sorted(trials, key=lambda t: t["number"]):
            masker.text(t["id"])
        # No audit of the analyst's exists (only the owner may audit private data).
        own = {"sweep_id": sid, "trial_id": trials[0]["id"], "dataset_id": ds, "audit_id": "b" * 32}
        doc = ana.get("/openapi.json").json()
        for method, path, body in _requests(doc, own, ds, [undeclared, *uploads]):
            ask(method, path, body)
        return out
    finally:
        server.stop()


def _paths(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two masked bodies differ, as JSON paths with both values (the failure report)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _paths(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            p
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for p in _paths(x, y, f"{where}[{i}]")
        ]
    return [] if a == b else [f"{where or '.'}: {json.dumps(a)[:150]} vs {json.dumps(b)[:150]}"]


def test_an_analyst_sees_the_same_bytes_on_neighbouring_datasets(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    records = _records()
    neighbour = records[:REMOVED] + records[REMOVED + 1 :]
    # The analyst's guesses are the same files in both worlds: D, and D′ shuffled.
    guesses = {"guess-d": records, "guess-d-minus-one": neighbour[::-1]}
    a = _world(tmp_path_factory.mktemp("d"), records, guesses)
    b = _world(tmp_path_factory.mktemp("d-minus-one"), neighbour, guesses)
    assert [k for k, *_ in a] == [k for k, *_ in b]
    # The walk reached the routes' successes and their refusals.
    statuses = {s for _, s, _, _ in a}
    assert {200, 201, 403, 404, 409, 422} <= statuses, statuses
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
