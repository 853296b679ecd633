"""The API against its own OpenAPI document, over real HTTP.

Schemathesis reads ``/openapi.json`` from a real ``dpsweep serve`` process (uvicorn on loopback,
no scheduler, a SQLite file) and fuzzes every operation it documents: boundary and negative
cases of every parameter and body (its coverage phase), then random ones (its fuzzing phase).
No request may get a 5xx, and no response may contradict the document: an undocumented status
code or media type, or a body or header that does not match its schema. Every 4xx must also be
an RFC 9457 problem: ``application/problem+json`` with a body matching the ``Problem`` schema.

Half of the generated path ids are real seeded ones, so the query parameters that a route only
reads after finding its sweep, trial or dataset are fuzzed too; the other half miss (404).
``test_real_resources_conform`` and ``test_submit_replay_cancel_conform`` send well-formed
requests about real resources and validate their responses (2xx, 403, 409) the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig

from api.testing.server import SMALL_SPEC, Server, start_server
from sweeper.store.schema import upgrade

PROBLEM = "application/problem+json"
YAML = {"Content-Type": "application/yaml"}
INT64_MAX = 2**63 - 1

# Bounded: at most 10 random examples per operation (5 for the two that plan a spec: a valid
# one takes seconds), no shrinking, no example database. The coverage phase is not bounded by
# max-examples, but its cases come from the schema and are cheap (the whole run sends about
# 1,300 requests, most of them specs refused at once). Hypothesis's health checks judge data
# generation, not the API, and a real server is slower than they expect. The seed makes the
# run reproducible; set DPSWEEP_SCHEMA_SEED to explore other inputs.
CONFIG = """
seed = {seed}
request-timeout = 60
suppress-health-check = ["all"]

[generation]
max-examples = 10
no-shrink = true
database = "none"

[dictionaries.sweeps]
values = ["{sweep}", "{ended}"]
[dictionaries.ended]
values = ["{ended}"]
[dictionaries.trials]
values = ["{trial}"]
[dictionaries.datasets]
values = ["{dataset}", "digits"]

[parameters]
"path.sweep_id" = {{ dictionary = "sweeps", probability = 0.5 }}
"path.trial_id" = {{ dictionary = "trials", probability = 0.5 }}
"path.dataset_id" = {{ dictionary = "datasets", probability = 0.5 }}

[[operations]]
include-path = ["/api/v1/sweeps", "/api/v1/sweeps:plan"]
include-method = "POST"
generation.max-examples = 5

# The event stream of a live sweep ends only with the sweep, and nothing runs sweeps here, so
# real ids are ended sweeps; Schemathesis reads a stream at most until this timeout.
[[operations]]
include-path = "/api/v1/sweeps/{{sweep_id}}/events"
request-timeout = 2
parameters = {{ "path.sweep_id" = {{ dictionary = "ended", probability = 0.5 }} }}

# /ready is 503 (with its documented Ready body) while no scheduler is alive, as here.
[[operations]]
include-path = "/ready"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "503"]
"""


def _problem_validator(schema: Any) -> Any:
    components = schema.raw_schema["components"]
    return jsonschema_rs.Draft202012Validator(
        {"$ref": "#/components/schemas/Problem", "components": components}
    )


def problem_details_conformance(ctx: Any, response: Any, case: Any) -> None:
    """Every 4xx is ``application/problem+json`` with a body that is a ``Problem``."""
    if not 400 <= response.status_code < 500:
        return
    media = response.headers.get("content-type", [""])[0].split(";")[0].strip()
    assert media == PROBLEM, f"a {response.status_code} is {media!r}, not {PROBLEM}"
    body = response.json()
    errors = [e.message for e in _problem_validator(case.operation.schema).iter_errors(body)]
    assert not errors, f"not a Problem: {errors}"
    assert body["status"] == response.status_code, body


CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
    schemathesis.checks.response_headers_conformance,
    problem_details_conformance,
]


def _csv(rows: int = 60) -> bytes:
    lines = ["a,b,label"]
    for i in range(rows):
        a, b = (i % 7) / 7.0, (i % 5) / 5.0
        lines.append(f"{a},{b},{'yes' if a + b > 0.8 else 'no'}")
    return ("\n".join(lines) + "\n").encode()


def _spec(dataset: str) -> dict[str, Any]:
    return {
        "name": "schema-json",
        "dataset": {"name": dataset},
        "model": {"name": "mlp"},
        "training": {"epochs": 1, "batch_size": 16, "eval_every": 10},
        "privacy": {"budgets": [1], "delta": 1e-3, "accounting": "basic"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.5], "clip": [1.0]}}],
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work: Path = tmp_path_factory.mktemp("api-schema")
    url = f"sqlite:///{work / 'api.db'}"
    upgrade(url)
    s = start_server(url, work, scheduler=False)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def token(server: Server) -> str:
    return server.token("fuzz")


def _upload(server: Server, token: str) -> str:
    with server.client(token) as c:
        r = c.post(
            "/api/v1/datasets",
            files={"file": ("points.csv", _csv(), "text/csv")},
            data={"format": "csv", "label_column": "label"},
        )
    # 200 after the first: the same file and settings again answer with the earlier upload.
    assert r.status_code in (200, 201), r.text
    return str(r.json()["id"])


@pytest.fixture(scope="module")
def seeded(server: Server, token: str) -> dict[str, str]:
    """A pending sweep (nothing runs it) and one of its trials, a cancelled sweep, and an
    uploaded dataset."""
    with server.client(token) as c:
        r = c.post("/api/v1/sweeps", content=SMALL_SPEC, headers=YAML)
        assert r.status_code == 201, r.text
        sweep = r.json()["id"]
        r = c.get(f"/api/v1/sweeps/{sweep}/trials")
        assert r.status_code == 200, r.text
        trial = r.json()["items"][0]["id"]
        r = c.post("/api/v1/sweeps", content=SMALL_SPEC, headers=YAML)
        assert r.status_code == 201, r.text
        ended = r.json()["id"]
        r = c.post(f"/api/v1/sweeps/{ended}/cancel")
        assert r.status_code == 200, r.text
    return {"sweep": sweep, "trial": trial, "ended": ended, "dataset": _upload(server, token)}


@pytest.fixture(scope="module")
def api_schema(server: Server, seeded: dict[str, str]) -> Any:
    """The document the server serves, set up to fuzz it against the seeded rows."""
    seed = int(os.environ.get("DPSWEEP_SCHEMA_SEED", "20240601"))
    config = SchemathesisConfig.from_str(CONFIG.format(seed=seed, **seeded))
    return schemathesis.openapi.from_url(f"{server.base}/openapi.json", config=config)


def _call(
    schema: Any,
    server: Server,
    token: str,
    method: str,
    path: str,
    *,
    status: int | None,
    params: dict[str, str] | None = None,
    **case: Any,
) -> Any:
    """Send one request; check it with CHECKS and (unless None) its status."""
    operation = schema[path][method]
    response = operation.Case(path_parameters=params or {}, **case).call_and_validate(
        base_url=server.base,
        headers={"Authorization": f"Bearer {token}"},
        checks=CHECKS,
    )
    if status is not None:
        assert response.status_code == status, response.text
    return response


def _sweep(ids: dict[str, str], **more: Any) -> dict[str, Any]:
    return {"params": {"sweep_id": ids["sweep"]}, **more}


# name -> (method, path, status or None for any documented one, Case arguments from the
# seeded ids; "user" sends the request as another user)
REAL: dict[str, tuple[str, str, int | None, Callable[[dict[str, str]], dict[str, Any]]]] = {
    "health": ("GET", "/health", 200, lambda ids: {}),
    "ready-without-scheduler": ("GET", "/ready", 503, lambda ids: {}),
    "sweeps-page": ("GET", "/api/v1/sweeps", 200, lambda ids: {"query": {"limit": 1}}),
    "sweeps-pending": ("GET", "/api/v1/sweeps", 200, lambda ids: {"query": {"state": "pending"}}),
    "sweep": ("GET", "/api/v1/sweeps/{sweep_id}", 200, _sweep),
    "sweep-of-another-user": (
        "GET",
        "/api/v1/sweeps/{sweep_id}",
        404,
        lambda ids: _sweep(ids, user="other"),
    ),
    "results": ("GET", "/api/v1/sweeps/{sweep_id}/results", 200, _sweep),
    "pareto": (
        "GET",
        "/api/v1/sweeps/{sweep_id}/pareto",
        200,
        lambda ids: _sweep(ids, query={"x": "epsilon", "y": "accuracy"}),
    ),
    "trials-page": (
        "GET",
        "/api/v1/sweeps/{sweep_id}/trials",
        200,
        lambda ids: _sweep(ids, query={"sort": "objective", "limit": 1}),
    ),
    # A live stream: Schemathesis cuts it after the request timeout (2 s).
    "events-live": ("GET", "/api/v1/sweeps/{sweep_id}/events", 200, _sweep),
    # Event ids past a 64-bit integer: refused or answered, never a broken stream.
    "events-after-beyond-int64": (
        "GET",
        "/api/v1/sweeps/{sweep_id}/events",
        None,
        lambda ids: {"params": {"sweep_id": ids["ended"]}, "query": {"after": INT64_MAX + 1}},
    ),
    "events-last-event-id-beyond-int64": (
        "GET",
        "/api/v1/sweeps/{sweep_id}/events",
        None,
        lambda ids: {"params": {"sweep_id": ids["ended"]}, "headers": {"Last-Event-ID": "9" * 32}},
    ),
    "trial": (
        "GET",
        "/api/v1/trials/{trial_id}",
        200,
        lambda ids: {"params": {"trial_id": ids["trial"]}},
    ),
    "metrics": (
        "GET",
        "/api/v1/trials/{trial_id}/metrics",
        200,
        lambda ids: {"params": {"trial_id": ids["trial"]}},
    ),
    "datasets": ("GET", "/api/v1/datasets", 200, lambda ids: {}),
    "dataset": (
        "GET",
        "/api/v1/datasets/{dataset_id}",
        200,
        lambda ids: {"params": {"dataset_id": ids["dataset"]}},
    ),
    "builtin-dataset": (
        "GET",
        "/api/v1/datasets/{dataset_id}",
        200,
        lambda ids: {"params": {"dataset_id": "digits"}},
    ),
    "budget": (
        "GET",
        "/api/v1/datasets/{dataset_id}/budget",
        200,
        lambda ids: {"params": {"dataset_id": ids["dataset"]}},
    ),
    "builtin-budget": (
        "GET",
        "/api/v1/datasets/{dataset_id}/budget",
        200,
        lambda ids: {"params": {"dataset_id": "digits"}},
    ),
    "set-caps": (
        "PUT",
        "/api/v1/datasets/{dataset_id}/budget",
        200,
        lambda ids: {
            "params": {"dataset_id": ids["dataset"]},
            "body": {"epsilon_cap": 100.0, "delta_cap": 0.5},
            "media_type": "application/json",
        },
    ),
    "set-builtin-caps-not-admin": (
        "PUT",
        "/api/v1/datasets/{dataset_id}/budget",
        403,
        lambda ids: {
            "params": {"dataset_id": "digits"},
            "body": {"epsilon_cap": 5.0},
            "media_type": "application/json",
        },
    ),
    # A body that is not UTF-8 (so not JSON): refused with a documented status.
    "set-caps-not-utf8": (
        "PUT",
        "/api/v1/datasets/{dataset_id}/budget",
        None,
        lambda ids: {
            "params": {"dataset_id": ids["dataset"]},
            "body": b"\xff\xfe{",
            "media_type": "application/json",
        },
    ),
    "plan-json": (
        "POST",
        "/api/v1/sweeps:plan",
        200,
        lambda ids: {"body": _spec(ids["dataset"]), "media_type": "application/json"},
    ),
    # Raw bytes: the document gives the YAML body as a string, which Schemathesis would send
    # as a YAML string scalar rather than a YAML mapping.
    "plan-yaml": (
        "POST",
        "/api/v1/sweeps:plan",
        200,
        lambda ids: {"body": SMALL_SPEC.encode(), "media_type": "application/yaml"},
    ),
}


@pytest.mark.parametrize("name", list(REAL))
def test_real_resources_conform(
    name: str, api_schema: Any, server: Server, token: str, seeded: dict[str, str]
) -> None:
    method, path, status, build = REAL[name]
    case = build(seeded)
    user = case.pop("user", None)
    as_user = server.token(user) if user else token
    _call(api_schema, server, as_user, method, path, status=status, **case)


def test_submit_replay_cancel_conform(api_schema: Any, server: Server, token: str) -> None:
    dataset = _upload(server, token)
    submit = {
        "body": _spec(dataset),
        "media_type": "application/json",
        "headers": {"Idempotency-Key": "schema-test-1"},
    }
    first = _call(api_schema, server, token, "POST", "/api/v1/sweeps", status=201, **submit)
    replay = _call(api_schema, server, token, "POST", "/api/v1/sweeps", status=201, **submit)
    assert replay.headers["idempotent-replayed"] == ["true"]
    assert replay.json() == first.json()
    sweep = {"sweep_id": first.json()["id"]}
    cancel = "/api/v1/sweeps/{sweep_id}/cancel"
    _call(api_schema, server, token, "POST", cancel, status=200, params=sweep)
    _call(api_schema, server, token, "POST", cancel, status=409, params=sweep)
    # The stream of an ended sweep ends by itself.
    events = "/api/v1/sweeps/{sweep_id}/events"
    r = _call(api_schema, server, token, "GET", events, status=200, params=sweep)
    assert b"event: sweep" in r.content
    budget = "/api/v1/datasets/{dataset_id}/budget"
    r = _call(api_schema, server, token, "GET", budget, status=200, params={"dataset_id": dataset})
    assert [s["sweep"] for s in r.json()["sweeps"]] == [sweep["sweep_id"]]


@pytest.fixture
def _lazy_schema_on_pytest_9_2(request: pytest.FixtureRequest) -> None:
    # schemathesis 4.32's lazy loader (`from_fixture`) reads `request.node._nodeid`, which
    # pytest 9.2 no longer has (node ids moved to `_id`); give it the id it expects.
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@pytest.mark.usefixtures("_lazy_schema_on_pytest_9_2")
def test_api_conforms_to_its_schema(case: Any, token: str, server: Server) -> None:
    case.call_and_validate(
        base_url=server.base,
        headers={"Authorization": f"Bearer {token}"},
        checks=CHECKS,
    )
