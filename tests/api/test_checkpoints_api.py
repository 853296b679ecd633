"""Registered checkpoints through a real server (issue 52, items 1-2).

A tiny BERT-like checkpoint is registered with ``dpsweep checkpoints register`` into the
directory a real ``dpsweep serve`` (no scheduler, SQLite) reads (``DPSWEEP_CHECKPOINTS_DIR``).
Over HTTP: ``GET /api/v1/checkpoints`` lists it without its path; a spec naming it is accepted
and its stored spec carries the digest; a path, an unknown name or a wrong digest is refused
with 422 naming the field, and nothing is stored or reserved; the dry run's plan says how many
parameters each ``trainable`` trains of the total.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.orm import Session

from api.testing.server import DPSWEEP, Server, start_server
from sweeper.privacy.ledger.rows import DatasetBudget, LedgerEntry
from sweeper.store import Sweep, Trial
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.api.tiny_checkpoint import head_size, lora_trained, text_csv, tiny_bert

pytest.importorskip("transformers")
pytest.importorskip("peft")

NAME = "tiny-bert"
TRAINED_ON = "nothing: random weights built from a config"
QV = ["query", "value"]
REGISTER = [DPSWEEP, "checkpoints", "register", "--json"]
DATASETS = [DPSWEEP, "datasets", "register", "--name", "reviews", "--format", "text_csv"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("checkpoints-api")
    source = tiny_bert(work / "source")
    checkpoints = work / "checkpoints"
    env = {"DPSWEEP_CHECKPOINTS_DIR": str(checkpoints)}
    register = [*REGISTER, str(source), "--name", NAME, "--kind", "hf", "--trained-on"]
    run = subprocess.run(
        [*register, TRAINED_ON],
        capture_output=True,
        text=True,
        env={**_environ(), **env},
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    registered = json.loads(run.stdout)
    url = f"sqlite:///{work / 'api.db'}"
    upgrade(url)
    # Ada's dataset: a text CSV tokenized by the registered checkpoint's own tokenizer.
    data = text_csv(work / "text.csv")
    tokenizer = f"tokenizer={checkpoints / NAME}"
    options = ["--option", tokenizer, "--option", "max_length=16", "--label-column", "label"]
    run = subprocess.run(
        [*DATASETS, str(data), *options, "--owner", "ada", "--db", url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    server = start_server(url, work, scheduler=False, env=env)
    try:
        yield {
            "server": server,
            "url": url,
            "digest": registered["digest"],
            "source": source,
            "checkpoints": checkpoints,
        }
    finally:
        server.stop()


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


def _spec(setup: dict[str, Any], **model: Any) -> str:
    """A one-arm spec on the text CSV, tokenized by the checkpoint's own tokenizer."""
    grid = model.pop("grid", {})
    spec = {
        "name": "ckpt",
        "dataset": {"name": "reviews"},
        "model": {"name": "hf", "checkpoint": NAME, **model},
        "training": {"epochs": 1, "batch_size": 32},
        "privacy": {"budgets": [2], "delta": 1e-5, "accounting": "basic"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0], **grid}}],
    }
    return yaml.safe_dump(spec)


def _counts(url: str) -> tuple[int, ...]:
    engine = make_engine(url)
    try:
        with Session(engine) as s:
            return tuple(
                s.scalar(sa.select(sa.func.count()).select_from(t)) or 0
                for t in (Sweep, Trial, LedgerEntry, DatasetBudget)
            )
    finally:
        engine.dispose()


def _client(server: Server) -> Any:
    client = server.client(server.token("ada"))
    client.headers["Content-Type"] = "application/yaml"
    return client


def test_listing_names_kind_digest_and_declaration_without_paths(setup: dict[str, Any]) -> None:
    server: Server = setup["server"]
    with server.client() as anonymous:
        assert anonymous.get("/api/v1/checkpoints").status_code == 401
    with server.client(server.token("ada")) as client:  # any signed-in user
        r = client.get("/api/v1/checkpoints")
    assert r.status_code == 200, r.text
    (row,) = r.json()["checkpoints"]
    assert row["name"] == NAME and row["kind"] == "hf"
    assert row["digest"] == setup["digest"] and row["digest"].startswith("sha256:")
    assert row["trained_on"] == TRAINED_ON and row["private_records_seen"] is False
    assert str(setup["checkpoints"]) not in r.text  # no path leaves the server

    listed = subprocess.run(
        [DPSWEEP, "checkpoints", "list", "--json", "--dir", str(setup["checkpoints"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == r.json()["checkpoints"]


def test_a_registered_name_is_accepted_and_its_digest_stored(setup: dict[str, Any]) -> None:
    with _client(setup["server"]) as client:
        r = client.post("/api/v1/sweeps", content=_spec(setup, trainable="head"))
    assert r.status_code == 201, r.text
    engine = make_engine(setup["url"])
    try:
        with Session(engine) as s:
            sweep = s.get(Sweep, r.json()["id"])
            assert sweep is not None
            model = sweep.spec["model"]
            plan = sweep.plan
    finally:
        engine.dispose()
    assert model["checkpoint"] == NAME
    assert model["checkpoint_digest"] == setup["digest"]
    assert plan[0]["checkpoint"]["digest"] == setup["digest"]
    assert plan[0]["checkpoint"]["trained_on"] == TRAINED_ON
    assert plan[0]["trainable"] == "head" and plan[0]["trained_parameters"] == head_size()


@pytest.mark.parametrize(
    ("model", "field", "says"),
    [
        ({"checkpoint": "PATH"}, "model.checkpoint", "dpsweep checkpoints register"),
        ({"checkpoint": "no-such-checkpoint"}, "model.checkpoint", "dpsweep checkpoints register"),
        ({"checkpoint_digest": "sha256:" + "0" * 64}, "model.checkpoint_digest", "digest"),
        ({"name": "tests.api.tiny_checkpoint:tiny_bert"}, "model.name", "tiny_bert"),
    ],
    ids=["path", "unknown-name", "wrong-digest", "module-function"],
)
def test_refused_before_anything_is_reserved(
    setup: dict[str, Any], model: dict[str, Any], field: str, says: str
) -> None:
    if model.get("checkpoint") == "PATH":
        model = {"checkpoint": str(setup["source"])}
    before = _counts(setup["url"])
    with _client(setup["server"]) as client:
        for route in ("/api/v1/sweeps", "/api/v1/sweeps:plan"):
            r = client.post(route, content=_spec(setup, **model))
            assert r.status_code == 422, r.text
            body = r.json()
            assert field in [e["field"] for e in body["errors"]], body
            assert says in body["detail"]
    assert _counts(setup["url"]) == before  # nothing stored, nothing reserved


def test_the_plan_says_what_is_trained(setup: dict[str, Any]) -> None:
    grids = {}
    with _client(setup["server"]) as client:
        for trainable, extra in (
            ("all", {}),
            ("head", {}),
            ("lora", {"lora": {"r": 4, "target_modules": QV}}),
            (
                "lora-grid",
                {"lora": {"target_modules": ["query", "value"]}, "grid": {"lora_r": [2, 8]}},
            ),
        ):
            model = {"trainable": trainable.split("-")[0], **extra}
            r = client.post("/api/v1/sweeps:plan", content=_spec(setup, **model))
            assert r.status_code == 200, r.text
            (grids[trainable],) = r.json()["grids"]
    total = grids["all"]["total_parameters"]
    assert grids["all"]["trained_parameters"] == total > 20_000
    assert grids["all"]["checkpoint"]["digest"] == setup["digest"]
    assert grids["head"]["trained_parameters"] == head_size()
    assert grids["head"]["total_parameters"] == total
    assert grids["lora"]["trainable"] == "lora (r 4)"
    assert grids["lora"]["trained_parameters"] == lora_trained(4)
    assert grids["lora"]["total_parameters"] == total + lora_trained(4) - head_size()
    ranged = grids["lora-grid"]
    assert ranged["trainable"] == "lora (r 2-8)"
    assert ranged["trained_parameters"] == lora_trained(2)
    assert ranged["trained_parameters_max"] == lora_trained(8)
