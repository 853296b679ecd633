"""What an analyst receives of a trial is data-independent or DP, over real HTTP.

A step's time grows with its realised Poisson batch, so per-step times and exact durations
are functions of the secret records that no ε covers, and a worker's host and process id say
nothing an analyst needs (:mod:`sweeper.datasets.analyst_clock`). One ``dpsweep serve`` on
SQLite: ``olga`` uploads a CSV, declares its view and grants ``ana``; each runs a tiny sweep on
it (logreg, 4 steps, every model kept). Then every read of ``ana``'s sweep by ``ana`` (its
detail and list entry, its trials' page and details, their model cards, the live events, the
dataset's audit log) holds no worker id and no step time, every duration is a multiple of 10 s
and every clock time (but her own submission's) falls on a 10 s boundary; the same reads by
``olga``, the dataset's owner, keep every figure, of her own sweep and of ``ana``'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import numpy as np
import pytest

from api.testing.server import start_server
from sweeper.store.schema import upgrade
from tests.api.test_api import read_sse, wait_for

pytestmark = pytest.mark.slow  # one server, two tiny sweeps

V1 = "/api/v1"
N = 300
DECLARED = {
    "n_examples": N,
    "classes": ["0", "1"],
    "input_shape": [4],
    "input_bounds": [-4.0, 4.0],
    "test_fraction": 0.2,
}
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?$")
#: Times an analyst receives exactly: her own submission's, not a function of the records.
OWN_TIMES = {"created_at"}


def _csv() -> bytes:
    rng = np.random.default_rng(48)
    x = rng.uniform(-3, 3, size=(N, 4))
    y = (x[:, 0] - x[:, 2] > 0).astype(int)
    lines = ["a,b,c,d,label"] + [
        ",".join(f"{v:.5f}" for v in row) + f",{t}" for row, t in zip(x, y, strict=True)
    ]
    return ("\n".join(lines) + "\n").encode()


def _spec(ds: str, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "dataset": {"name": ds},
        "model": {"name": "logreg"},
        "training": {"steps": 4, "batch_size": 16, "eval_every": 2},
        "privacy": {"budgets": [1.0], "delta": 1e-5},
        "eval": {"mode": "dp"},
        "artifacts": {"keep": "all"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1, 0.3], "clip": [1.0]}}],
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("analyst-fields")
    url = f"sqlite:///{work / 'api.db'}"
    upgrade(url)
    s = start_server(url, work)
    olga, ana = (s.client(s.token(n)) for n in ("olga", "ana"))
    r = olga.post(
        f"{V1}/datasets",
        files={"file": ("points.csv", _csv(), "text/csv")},
        data={"format": "csv", "label_column": "label", "epsilon_cap": "20"},
    )
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    r = olga.put(f"{V1}/datasets/{ds}/policy", json={"view": DECLARED})
    assert r.status_code == 200, r.text
    r = olga.post(f"{V1}/datasets/{ds}/grants", json={"analyst": "ana", "epsilon_allowance": 5})
    assert r.status_code == 201, r.text
    sweeps = {}
    for who, client in (("olga", olga), ("ana", ana)):
        r = client.post(f"{V1}/sweeps", json=_spec(ds, f"{who}-sweep"))
        assert r.status_code == 201, r.text
        sweeps[who] = r.json()["id"]
    for who, client in (("olga", olga), ("ana", ana)):
        assert wait_for(client, sweeps[who], lambda s: s["state"] == "done")["state"] == "done"
    yield {"olga": olga, "ana": ana, "ds": ds, "sweeps": sweeps}
    s.stop()


def _reads(client: Any, ds: str, sweep: str) -> dict[str, Any]:
    """Every read of ``sweep`` that shows its trials' running: detail, list entry, trials'
    page and details, model cards, live events, the dataset's audit log."""
    out: dict[str, Any] = {"sweep": client.get(f"{V1}/sweeps/{sweep}").json()}
    out["list"] = [s for s in client.get(f"{V1}/sweeps").json()["items"] if s["id"] == sweep]
    out["trials"] = client.get(f"{V1}/sweeps/{sweep}/trials").json()["items"]
    ids = [t["id"] for t in out["trials"]]
    out["details"] = [client.get(f"{V1}/trials/{t}").json() for t in ids]
    cards = [client.get(f"{V1}/trials/{t}/model-card") for t in ids]
    assert all(c.status_code == 200 for c in cards), [c.text for c in cards]
    out["cards"] = [c.json() for c in cards]
    out["events"] = read_sse(client, f"{V1}/sweeps/{sweep}/events")
    out["audit"] = client.get(f"{V1}/datasets/{ds}/audit").json()["items"]
    assert out["list"] and len(ids) == 2 and out["events"], out
    return out


def _walk(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair of a JSON body, at any depth."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k, v
            yield from _walk(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, key)


def _on_ten_seconds(text: str) -> bool:
    t = datetime.fromisoformat(text)
    return t.microsecond == 0 and t.second % 10 == 0


def _span(item: dict[str, Any]) -> float:
    start, end = (datetime.fromisoformat(item[k]) for k in ("started_at", "finished_at"))
    return (end - start).total_seconds()


def test_an_analyst_receives_no_worker_no_step_time_and_ten_second_times(
    world: dict[str, Any],
) -> None:
    ana, olga, ds = world["ana"], world["olga"], world["ds"]
    seen = _reads(ana, ds, world["sweeps"]["ana"])
    exact = _reads(olga, ds, world["sweeps"]["ana"])
    workers = {t["worker"] for t in exact["details"]}
    assert all(isinstance(w, str) and w for w in workers), workers
    text = json.dumps(seen)
    assert not any(w in text for w in workers), "a worker id reached the analyst"
    for where, body in seen.items():
        pairs = list(_walk(body))
        assert not [v for k, v in pairs if k in ("worker", "step_time_ms_median") and v], where
        assert not [k for k, _ in pairs if "seconds" in k and k != "train_seconds"], where
        durations = [v for k, v in pairs if k == "train_seconds"]
        assert all(v is None or v % 10 == 0 for v in durations), (where, durations)
        times = [
            (k, v) for k, v in pairs if isinstance(v, str) and TIME.match(v) and k not in OWN_TIMES
        ]
        assert all(_on_ten_seconds(v) for _, v in times), (where, times)
    # The card's own time is when it was written (a trial's end): coarse too.
    assert all(_on_ten_seconds(c["created_at"]) for c in seen["cards"])
    # Started and finished together tell no finer duration than the rounded one.
    for item in [seen["sweep"], *seen["list"], *seen["trials"], *seen["details"]]:
        assert _span(item) % 10 == 0, item
    for card in seen["cards"]:
        assert _span(card["trial"]) % 10 == 0, card["trial"]
    # What the analyst receives has the owner's shape: a withheld figure is null, never absent.
    assert [set(t) for t in seen["details"]] == [set(t) for t in exact["details"]]
    assert [set(t) for t in seen["trials"]] == [set(t) for t in exact["trials"]]
    assert set(seen["sweep"]) == set(exact["sweep"])
    assert seen["details"][0]["privacy"]["charges"], seen["details"][0]


def test_the_owner_keeps_every_figure(world: dict[str, Any]) -> None:
    olga, ds = world["olga"], world["ds"]
    for sweep in (world["sweeps"]["olga"], world["sweeps"]["ana"]):
        reads = _reads(olga, ds, sweep)
        for t in reads["details"]:
            assert isinstance(t["worker"], str) and t["worker"], t
            assert isinstance(t["step_time_ms_median"], float), t
            assert isinstance(t["train_seconds"], float) and t["train_seconds"] > 0, t
        assert all(isinstance(t["train_seconds"], float) for t in reads["trials"])
        # Exact clock times: two trials' starts, ends and charges do not all fall on 10 s.
        times = [t[k] for t in reads["details"] for k in ("started_at", "finished_at")]
        times += [c["at"] for t in reads["details"] for c in t["privacy"]["charges"]]
        assert not all(_on_ten_seconds(v) for v in times), times
    # The owner's own sweep's cards keep their figures (an analyst's are written coarse).
    own = _reads(olga, ds, world["sweeps"]["olga"])
    assert not all(_on_ten_seconds(c["trial"]["started_at"]) for c in own["cards"])
