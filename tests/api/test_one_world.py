"""One world: what the command line makes, a real ``dpsweep serve`` shows to whoever may see it.

Issue 51's new user, step by step, on one real SQLite database and real servers: the quick
start's sweep (``dpsweep run``, the operator's), its token (``dpsweep token create --name me
--admin``) seeing that sweep and digits' spending through ``GET /api/v1/sweeps`` and
``/datasets``; a tenant's token told, in one line, why it does not and how; ``--owner`` making
a sweep and a registered name the tenant's. A registered name is in the server's dataset list
(and the dashboard's Datasets page) with its budget, for whoever owns it and nobody else. The
same records uploaded again say, in the answer, that they share the registered name's ledger
and what it spent; a cap that cannot take effect is refused and stores nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from api.testing.browser import chromium, screenshot
from api.testing.server import Server, start_server
from dpsweep import Client, Conflict, ValidationError

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DPSWEEP = shutil.which("dpsweep", path=str(Path(sys.executable).parent)) or "dpsweep"
TRAIN = ["--model", "logreg", "--epochs", "1", "--batch-size", "32", "--eval-every", "10"]


def dpsweep(*args: str, db: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPSWEEP_", "RAY_"))}
    env.update({"COLUMNS": "200", "DPSWEEP_DATABASE_URL": db})
    return subprocess.run(
        [DPSWEEP, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def ok(p: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert p.returncode == 0, f"{p.args} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return p


def write_csv(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    x = np.round(rng.normal(size=(240, 4)), 3)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int)
    lines = ["a,b,c,d,label"] + [
        ",".join(repr(float(v)) for v in row) + f",{t}" for row, t in zip(x, y, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class World:
    """The database the command line filled, and what it did there."""

    work: Path
    db: str
    mydata: Path
    spent: float
    """ε ``dpsweep train`` charged on mydata's records."""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """The quick start's sweep, then ``mydata`` registered, capped at 30 and trained on."""
    work = tmp_path_factory.mktemp("one-world")
    db = f"sqlite:///{work / 'dpsweep.db'}"
    plots = str(work / "plots")
    ok(dpsweep("run", "examples/quickstart.yaml", "--quiet", "--plots", plots, db=db))
    mydata = write_csv(work / "mydata.csv", seed=0)
    register = ok(
        dpsweep(
            "datasets",
            "register",
            str(mydata),
            "--name",
            "mydata",
            "--label-column",
            "label",
            db=db,
        )
    )
    assert "as the operator" in register.stdout
    ok(dpsweep("datasets", "cap", "mydata", "--epsilon", "30", db=db))
    trained = ok(
        dpsweep("train", "--dataset", "mydata", "--epsilon", "1", "--yes", "--json", *TRAIN, db=db)
    )
    spent = float(json.loads(trained.stdout)["ledger"]["epsilon_charged"])
    assert 0.5 < spent <= 1.0
    return World(work=work, db=db, mydata=mydata, spent=spent)


@pytest.fixture(scope="module")
def server(world: World) -> Iterator[Server]:
    (world.work / "auth").mkdir()
    srv = start_server(world.db, world.work / "auth", scheduler=False)
    try:
        yield srv
    finally:
        srv.stop()


def get(srv: Server, token: str, path: str) -> httpx.Response:
    with srv.client(token) as c:
        return c.get(f"/api/v1{path}")


def items(srv: Server, token: str, path: str) -> list[dict[str, Any]]:
    r = get(srv, token, path)
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


def test_the_quick_starts_token_sees_what_the_command_line_made(
    world: World, server: Server
) -> None:
    # The README's line: an admin token, the operator's.
    made = ok(dpsweep("token", "create", "--name", "me", "--admin", "--json", db=world.db))
    token = json.loads(made.stdout)["token"]
    (sweep,) = items(server, token, "/sweeps")
    assert sweep["name"] == "quickstart" and sweep["owner"] is None and sweep["state"] == "done"
    datasets = {d["id"]: d for d in items(server, token, "/datasets")}
    assert datasets["digits"]["budget"]["epsilon_committed"] > 0
    # The registered name, with its budget: the train run's spending within the cap of 30.
    mine = datasets["mydata"]
    assert mine["kind"] == "registered" and mine["owner"] is None and mine["n_examples"] == 240
    assert mine["budget"]["epsilon_cap"] == 30
    assert mine["budget"]["epsilon_committed"] == pytest.approx(world.spent)
    assert mine["budget"]["epsilon_remaining"] == pytest.approx(30 - world.spent)
    budget = get(server, token, "/datasets/mydata/budget").json()
    assert budget["epsilon_committed"] == pytest.approx(world.spent)
    assert [s["kind"] for s in budget["sweeps"]] == ["train"]


def test_a_tenants_token_is_told_why_it_sees_none_of_it_and_sees_none(
    world: World, server: Server
) -> None:
    made = ok(dpsweep("token", "create", "--name", "ana", "--json", db=world.db))
    assert "sees only its own work" in made.stderr
    assert "1 sweep and 1 registered dataset" in made.stderr
    assert "--admin" in made.stderr and "--owner ana" in made.stderr
    token = json.loads(made.stdout)["token"]
    assert items(server, token, "/sweeps") == []
    # The built-in sets only (each as their own spending on it).
    from sweeper.datasets.names import BUILTIN

    assert {d["id"] for d in items(server, token, "/datasets")} == set(BUILTIN)
    # Nothing of the operator's records: not the name, not its budget.
    for path in ("/datasets/mydata", "/datasets/mydata/budget"):
        r = get(server, token, path)
        assert r.status_code == 404 and "30" not in r.text


def test_owner_makes_the_command_lines_work_a_tenants(world: World, server: Server) -> None:
    ana = server.token("ana")
    bob = server.token("bob")
    admin = server.token("root", admin=True)
    theirs = write_csv(world.work / "theirs.csv", seed=1)
    p = ok(
        dpsweep(
            "datasets",
            "register",
            str(theirs),
            "--name",
            "anas",
            "--label-column",
            "label",
            "--owner",
            "ana",
            db=world.db,
        )
    )
    assert "as 'ana'" in p.stdout
    # A name keeps its owner: registering it again as the operator's is refused (another
    # owner would be another ledger of the records).
    again = dpsweep("datasets", "register", str(theirs), "--name", "anas", "--label-column",
                    "label", db=world.db)  # fmt: skip
    assert again.returncode != 0 and "ana's dataset" in again.stderr
    run = ok(
        dpsweep(
            "run",
            "examples/quickstart.yaml",
            "--quiet",
            "--owner",
            "ana",
            "--plots",
            str(world.work / "plots-ana"),
            db=world.db,
        )
    )
    # Not the operator's finished sweep of the same spec: a sweep of ana's own.
    assert "as 'ana'" in run.stderr
    (sweep,) = items(server, ana, "/sweeps")
    assert sweep["owner"] == "ana" and sweep["state"] == "done"
    anas = {d["id"]: d for d in items(server, ana, "/datasets")}
    assert anas["anas"]["owner"] == "ana" and anas["anas"]["budget"]["epsilon_committed"] == 0
    assert "mydata" not in anas
    assert items(server, bob, "/sweeps") == []
    assert "anas" not in [d["id"] for d in items(server, bob, "/datasets")]
    assert get(server, bob, "/datasets/anas").status_code == 404
    everyone = {d["id"] for d in items(server, admin, "/datasets")}
    assert {"mydata", "anas"} <= everyone
    assert len(items(server, admin, "/sweeps")) == 2


def test_the_datasets_page_shows_a_registered_name_with_its_epsilon_left(
    world: World, server: Server
) -> None:
    token = server.token("root", admin=True)
    with chromium() as browser:
        ctx = browser.new_context(base_url=server.base, viewport={"width": 1280, "height": 900})
        ctx.add_init_script(f"sessionStorage.setItem('dpsweep.token', {token!r})")
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto("/datasets")
        row = page.locator("#datasets-table tr[data-dataset=mydata]")
        row.wait_for()
        cells = row.locator("td")
        assert "registered" in cells.nth(1).inner_text()
        assert "the operator's" in cells.nth(1).inner_text()
        assert cells.nth(4).inner_text() == "30"
        left = float(cells.nth(7).inner_text())
        assert left == pytest.approx(30 - world.spent, abs=0.01)
        screenshot(page, "datasets-registered")
        # The Sweeps page reads the same list: the quick start's sweeps show digits' budget
        # (uncapped), not a blank.
        page.goto("/sweeps")
        page.wait_for_selector("#sweeps-table tr[data-sweep]")
        assert "digits\nuncapped" in page.locator("#sweeps-table tr[data-sweep]").first.inner_text()
        ctx.close()
    assert not errors, errors


@pytest.fixture(scope="module")
def local(world: World) -> Iterator[Server]:
    """``dpsweep serve --no-auth`` on the same database: requests act as the operator."""
    (world.work / "local").mkdir()
    srv = start_server(world.db, world.work / "local", scheduler=False, auth=False)
    try:
        yield srv
    finally:
        srv.stop()


def _uploads(srv: Server) -> list[str]:
    with srv.client() as c:
        return [d["id"] for d in c.get("/api/v1/datasets").json()["items"] if d["kind"] == "upload"]


def _files(world: World) -> list[Path]:
    folder = world.work / "local" / "data" / "uploads"
    return sorted(folder.iterdir()) if folder.exists() else []


def test_uploading_registered_records_again_says_it_shares_their_ledger(
    world: World, local: Server
) -> None:
    with Client(local.base) as client:
        # A cap below what mydata's records already spent: refused, naming why, stores nothing.
        with pytest.raises(ValidationError) as low:
            client.upload_dataset(world.mydata, label="label", epsilon_cap=0.1)
        text = str(low.value)
        assert "below what your dataset 'mydata' (the same records) already committed" in text
        assert "spent" in text and "Nothing was stored" in text
        assert re.search(r"\d{10,}", text) is None  # amounts to ~6 digits, not 16
        # A cap above mydata's 30: an upload never raises it; refused the same way.
        with pytest.raises(Conflict) as high:
            client.upload_dataset(world.mydata, label="label", epsilon_cap=40)
        assert "would raise the lifetime cap 30.0" in str(high.value)
        assert "PUT /api/v1/datasets/ID/budget" in str(high.value)
        assert _uploads(local) == [] and _files(world) == []
        assert client.budget("mydata")["epsilon_cap"] == 30

        # A cap within it: the upload joins mydata's ledger, says so, shows what it spent.
        first = client.upload_dataset(world.mydata, label="label", epsilon_cap=20)
        ledger = first["ledger"]
        assert ledger["shared_with"] == ["mydata"] and not ledger["existing"]
        assert ledger["epsilon_committed"] == pytest.approx(world.spent)
        assert ledger["epsilon_cap"] == 20
        assert "shares their ledger" in ledger["message"] and "'mydata'" in ledger["message"]
        assert client.budget("mydata")["epsilon_cap"] == 20

        # The same file and settings again: the same upload, no duplicate row or file.
        again = client.upload_dataset(world.mydata, label="label")
        assert again["id"] == first["id"] and again["ledger"]["existing"]
        assert _uploads(local) == [first["id"]] and len(_files(world)) == 1
        with local.client() as c:
            r = c.post(
                "/api/v1/datasets",
                files={"file": ("mydata.csv", world.mydata.read_bytes(), "text/csv")},
                data={"label_column": "label"},
            )
        assert r.status_code == 200 and r.json()["id"] == first["id"]

        # Another name for the same records: a new upload, on the same ledger, saying so.
        other = client.upload_dataset(world.mydata, label="label", name="copy")
        assert other["id"] != first["id"]
        assert other["ledger"]["shared_with"] == sorted([first["id"], "mydata"])
        assert other["ledger"]["epsilon_cap"] == 20


def test_an_admins_upload_is_told_of_other_owners_copies_a_tenants_is_not(
    world: World, server: Server
) -> None:
    def upload(token: str) -> dict[str, Any]:
        with server.client(token) as c:
            r = c.post(
                "/api/v1/datasets",
                files={"file": ("mydata.csv", world.mydata.read_bytes(), "text/csv")},
                data={"label_column": "label"},
            )
        assert r.status_code == 201, r.text
        return dict(r.json()["ledger"])

    # An admin sees every owner's datasets: their upload (a ledger of their own) names the
    # operator's registered copy of the records, and says its spending does not count here.
    mine = upload(server.token("root", admin=True))
    assert mine["shared_with"] == [] and mine["epsilon_committed"] == 0
    assert "'mydata' (the operator's)" in mine["held_elsewhere"]
    assert "does not count on this one" in mine["message"]
    # A tenant learns nothing of anyone else's records: not that they exist, not their names.
    theirs = upload(server.token("bob"))
    assert "held_elsewhere" not in theirs and theirs["shared_with"] == []
    assert "mydata'" not in json.dumps(theirs) and theirs["message"].startswith("a ledger of")
