"""The registries' listing everywhere, plug-ins included, and local ``module:function``
factories on the command line only.

A real plug-in distribution (``*.dist-info`` with entry points ``dpsweep.models`` and
``dpsweep.datasets``) is written to a temporary folder put on the ``PYTHONPATH`` of the spawned
processes: a real ``dpsweep serve`` (no scheduler) must list what it registers on
``GET /api/v1/registry``, and so must ``dpsweep plugins --json``. ``dpsweep train`` trains a
factory model on a factory dataset; the API refuses any import string and imports nothing.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.testing.server import DPSWEEP, Server, start_server
from sweeper.store.schema import upgrade
from tests.api.plugin_site import (
    FACTORY_MODULE,
    PLUGIN_DATASET,
    PLUGIN_MODEL,
    PluginSite,
    env_with,
    plugin_site,
)

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> PluginSite:
    return plugin_site(tmp_path_factory.mktemp("plugins"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, site: PluginSite) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("registry-api")
    url = f"sqlite:///{work / 'api.db'}"
    upgrade(url)
    s = start_server(url, work, scheduler=False, env=env_with(site))
    try:
        yield s
    finally:
        s.stop()


def _by_name(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in entries}


def check_listing(listing: dict[str, Any]) -> None:
    """The built-ins and the plug-in's model and dataset, described with their options."""
    models, datasets = _by_name(listing["models"]), _by_name(listing["datasets"])
    strategies, accountants = _by_name(listing["strategies"]), _by_name(listing["accountants"])
    assert {"mlp", "cnn", "logreg", PLUGIN_MODEL} <= set(models)
    assert {"digits", "synthetic", "csv", PLUGIN_DATASET} <= set(datasets)
    hidden = _by_name(models["mlp"]["options"])["hidden"]
    assert hidden["kind"] == "int" and hidden["sequence"] and hidden["default"] == 128
    assert hidden["range"] == ">= 1" and hidden["help"]
    assert _by_name(models["mlp"]["options"])["activation"]["choices"][:2] == ["elu", "gelu"]
    assert models["cnn"]["input_kind"] == "image"
    plugin = models[PLUGIN_MODEL]
    assert plugin["input_kind"] == "flat" and "plug-in" in plugin["description"]
    assert _by_name(plugin["options"])["width"]["default"] == 8
    assert _by_name(datasets[PLUGIN_DATASET]["options"])["n"]["range"] == ">= 10"
    assert datasets["csv"]["needs"] == ["path", "label_column"]
    clip = _by_name(strategies["fixed"]["hyperparameters"])["clip"]
    assert clip["default"] == 1.0 and clip["range"] == "> 0"
    assert strategies["nonprivate"]["private"] is False
    assert accountants["pld"]["library"] == "dp_accounting PLD" and accountants["pld"]["tight"]


def test_api_lists_every_registry_with_the_plugin(server: Server) -> None:
    assert server.client().get("/api/v1/registry").status_code == 401
    r = server.client(server.token("reader")).get("/api/v1/registry")
    assert r.status_code == 200, r.text
    check_listing(r.json())
    doc = server.client().get("/openapi.json").json()
    assert "/api/v1/registry" in doc["paths"]


@pytest.mark.parametrize(
    ("section", "name", "field"),
    [
        ("model", "os:system", "model.name"),
        ("model", "dpsweep_test_marker:build", "model.name"),
        ("dataset", f"{FACTORY_MODULE}:data", "dataset"),
    ],
)
def test_api_refuses_import_strings_and_imports_nothing(
    server: Server, site: PluginSite, section: str, name: str, field: str
) -> None:
    me = server.client(server.token("importer"))
    spec = {
        "name": "import-string",
        "dataset": {"name": "digits"},
        "model": {"name": "mlp"},
        "training": {"epochs": 1, "batch_size": 128},
        "privacy": {"budgets": [2], "delta": 1e-5, "accounting": "basic"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.5], "clip": [1.0]}}],
    }
    spec[section] = {"name": name}
    for path in ("/api/v1/sweeps:plan", "/api/v1/sweeps"):
        r = me.post(path, json=spec)
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith(PROBLEM)
        fields = [e["field"] for e in r.json().get("errors", [])]
        assert any(f.startswith(field) for f in fields), r.json()
    assert not site.marker.exists(), "the API imported a module named in a request"
    assert me.get("/api/v1/sweeps").json()["items"] == []


def _dpsweep(site: PluginSite, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DPSWEEP, *args], env=env_with(site), cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_cli_plugins_lists_the_plugin(site: PluginSite, tmp_path: Path) -> None:
    out = _dpsweep(site, "plugins", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    check_listing(json.loads(out.stdout))
    one = _dpsweep(site, "plugins", "--json", "--kind", "models", cwd=tmp_path)
    assert list(json.loads(one.stdout)) == ["models"]
    table = _dpsweep(site, "plugins", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert PLUGIN_MODEL in table.stdout and "width: int >= 1, default 8" in table.stdout


@pytest.mark.slow  # about 20 s on two busy cores (torch's import, three epochs)
def test_cli_train_trains_a_local_factory_model_on_a_factory_dataset(
    site: PluginSite, tmp_path: Path
) -> None:
    model, dataset = f"{FACTORY_MODULE}:build", f"{FACTORY_MODULE}:data"
    out = _dpsweep(
        site,
        *("train", "--model", model, "--dataset", dataset, "--epsilon", "4", "--delta", "1e-3"),
        *("--epochs", "3", "--batch-size", "32", "--lr", "1.0", "--json", "--yes"),
        *("--db", f"sqlite:///{tmp_path / 'train.db'}"),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["model"] == model and summary["dataset"] == dataset
    assert summary["private"] and math.isfinite(summary["loss"])
    assert summary["epsilon"] <= 4.0 + 1e-6 and summary["ledger"]["epsilon_charged"] > 0
    assert summary["accuracy"] > 0.6  # two well-separated classes


FACTORY_SPEC = f"""\
name: factory-run
dataset: {{name: "{FACTORY_MODULE}:data"}}
model: {{name: "{FACTORY_MODULE}:build"}}
training: {{epochs: 1, batch_size: 32, eval_every: 10}}
privacy: {{budgets: [4], delta: 1.0e-3, accounting: basic}}
arms:
  - strategy: fixed
    grid: {{lr: [0.5, 1.0], clip: [1.0]}}
"""


@pytest.mark.slow  # starts a local Ray (about 35 s on two busy cores)
def test_cli_run_trains_a_spec_naming_local_factories(site: PluginSite, tmp_path: Path) -> None:
    """`dpsweep plan` and `dpsweep run` read factories from the spec file; the Ray workers the
    run starts register them too (they inherit the exported list)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(FACTORY_SPEC)
    plan = _dpsweep(site, "plan", str(spec), "--json", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)[0]["trials"] == 2
    db = f"sqlite:///{tmp_path / 'run.db'}"
    run = _dpsweep(
        site,
        "run",
        str(spec),
        "--db",
        db,
        "--workers",
        "1",
        "--quiet",
        "--json",
        "--plots",
        str(tmp_path / "plots"),
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    (result,) = json.loads(run.stdout)["results"]
    assert result["trials_done"] == 2 and result["trials_failed"] == 0
    assert result["objective_mean"] > 0.6


@pytest.mark.parametrize(
    ("flag", "name", "says"),
    [
        ("--model", "dpsweep_no_such_module:build", "No module named 'dpsweep_no_such_module'"),
        ("--dataset", f"{FACTORY_MODULE}:value", "is not callable"),
    ],
)
def test_cli_train_refuses_a_bad_factory_naming_it(
    site: PluginSite, tmp_path: Path, flag: str, name: str, says: str
) -> None:
    out = _dpsweep(
        site,
        "train",
        flag,
        name,
        "--epsilon",
        "4",
        "--db",
        f"sqlite:///{tmp_path / 'x.db'}",
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr
    assert repr(name) in out.stderr and says in out.stderr


def test_the_api_lists_the_registries_without_torch(tmp_path: Path) -> None:
    """The in-process app answers GET /api/v1/registry, and torch is never imported."""
    url = f"sqlite:///{tmp_path / 'api.db'}"
    upgrade(url)
    code = (
        "import sys\n"
        "from fastapi.testclient import TestClient\n"
        "from api.app import create_app\n"
        "from api.settings import ApiSettings\n"
        f"app = create_app(ApiSettings(auth=False, planner_processes=1), database_url={url!r})\n"
        "with TestClient(app) as c:\n"
        "    r = c.get('/api/v1/registry')\n"
        "    assert r.status_code == 200, r.text\n"
        "    assert 'mlp' in [m['name'] for m in r.json()['models']]\n"
        "print([m for m in ('torch', 'ray') if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
