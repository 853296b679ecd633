"""The analyst guarantee, tested as the attack it defends against: neighbouring datasets.

Two worlds, each a fresh ``dpsweep serve`` on its own SQLite file. In one the owner uploads
D; in the other D′ = D minus one record. Each owner declares the same public description
(the dataset's view: its size, bounds and split; label names) and grants the analyst ``ana``
the same allowance. Then the same analyst session runs in both: every route of the OpenAPI
document with every method, on the analyst's own ids and on ids they may not see, with bad
parameters; dry runs and submissions of valid and refused specs (bad options, sizes, seeds,
modes, budgets); one sweep run to its end and everything read back.

The rule (docs/privacy.md): every byte an analyst can obtain is a function of the public
description the owner declared, the DP outputs, and the analyst's own inputs. So once ids and
clock times are masked, and the DP outputs themselves (noisy metrics, the trained weights,
what was chosen from them), every response must be byte-identical in the two worlds.

The session is driven by the OpenAPI document: a route added later is walked with every
method it declares, without editing this test (``_requests``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from api.testing.server import start_server
from sweeper.store.schema import upgrade
from tests.api.test_api import wait_for

pytestmark = pytest.mark.slow  # two servers, one tiny sweep each: about a minute

V1 = "/api/v1"
N = 300
REMOVED = 17  # the record D′ lacks: the only one of class 2
DECLARED = {
    "n_examples": N,
    "classes": ["0", "1", "2"],
    "input_bounds": [-4.0, 4.0],
    "test_fraction": 0.2,
}
# What the analyst receives as DP outputs: noisy metrics and what was chosen by them, the
# trained weights (and what the card says of them), and how long the steps took.
DP_OUTPUT_KEYS = {
    "metrics",
    "final_metrics",
    "history",
    "trajectories",
    "best_step",
    "diverged_at",
    "step_time_ms_median",
    "results",
    "points",
    "front",
    "objective_value",
    "best",
    "value",
    "accuracy",
    "accuracy_at_selection",
    "weights_sha256",
    "sha256",
    "bytes",
    "size_bytes",
    "eta_seconds",
    "elapsed_seconds",
    "objective",
    "model",
    "train_seconds",
    "worker",
    "pareto",
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
                    if k in DP_OUTPUT_KEYS
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


def _requests(doc: dict[str, Any], own: dict[str, str], ds: str) -> list[tuple[str, str, Any]]:
    """Every (method, url, json body) of the walk, from the OpenAPI document.

    Each operation is asked on the analyst's own ids, on ids they may not see, and with
    malformed query parameters; mutating ones get an empty body and, for the spec routes, every
    probe spec. Deletions come last (they remove what the rest reads).
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
                    if path.endswith("/audits"):
                        # An audit is the owner's: the analyst asks for one on the dataset, on
                        # their own trial, and with values out of range.
                        writes += [
                            (method.upper(), url, {"dataset": ds, "epsilon": 1, "steps": 2}),
                            (method.upper(), url, {"trial": own["trial_id"], "canaries": 100}),
                            (method.upper(), url, {"dataset": ds, "canaries": 1}),
                        ]
    return reads + writes + deletes


def _world(tmp: Path, records: list[str]) -> list[tuple[str, int, Any]]:
    """One world: a server, the owner's upload and declarations, the analyst's session."""
    url = f"sqlite:///{tmp / 'api.db'}"
    upgrade(url)
    # One worker: trials start and finish in grid order, so the order of events and charges
    # is the same in both worlds (with two, it is a race between packs: timing, not data).
    server = start_server(url, tmp, workers=1)
    try:
        olga, ana = (server.client(server.token(n)) for n in ("olga", "ana"))
        r = olga.post(
            f"{V1}/datasets",
            files={"file": ("patients.csv", _csv(records), "text/csv")},
            data={"format": "csv", "label_column": "label", "epsilon_cap": "20"},
        )
        assert r.status_code == 201, r.text
        ds = r.json()["id"]
        r = olga.put(
            f"{V1}/datasets/{ds}/policy",
            json={"view": DECLARED, "public_info": {"label_names": ["low", "high", "rare"]}},
        )
        assert r.status_code == 200, r.text
        r = olga.post(f"{V1}/datasets/{ds}/grants", json={"analyst": "ana", "epsilon_allowance": 3})
        assert r.status_code == 201, r.text
        masker = Masker()
        out: list[tuple[str, int, Any]] = []

        def ask(method: str, path: str, body: Any = None) -> Any:
            with ana.stream(method, path, json=body, timeout=120) as resp:
                raw = resp.read()
            ctype = resp.headers.get("content-type", "")
            shown = masker.text(json.dumps(body, sort_keys=True))
            key = f"{method} {masker.text(path)} {shown[:300]}"
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
            out.append((key, resp.status_code, masked))
            return resp, raw

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
        for method, path, body in _requests(doc, own, ds):
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
    a = _world(tmp_path_factory.mktemp("d"), records)
    b = _world(tmp_path_factory.mktemp("d-minus-one"), records[:REMOVED] + records[REMOVED + 1 :])
    assert [k for k, _, _ in a] == [k for k, _, _ in b]
    # The walk reached the routes' successes and their refusals.
    statuses = {s for _, s, _ in a}
    assert {200, 201, 403, 404, 409, 422} <= statuses, statuses
    differ = [
        (key, sa, sb, body_a, body_b)
        for (key, sa, body_a), (_, sb, body_b) in zip(a, b, strict=True)
        if (sa, body_a) != (sb, body_b)
    ]
    report = "\n".join(
        f"{key[:120]}: {sa} vs {sb}\n    " + "\n    ".join(_paths(x, y)[:6])
        for key, sa, sb, x, y in differ[:25]
    )
    assert not differ, f"{len(differ)} of {len(a)} responses differ:\n{report}"
