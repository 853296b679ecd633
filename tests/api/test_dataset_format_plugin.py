"""A plug-in dataset format registers, uploads and plans like a built-in one (issue 39).

A real plug-in distribution (``*.dist-info`` with an entry point of ``dpsweep.datasets``) in
a temporary folder, put on the ``PYTHONPATH`` of the spawned processes, registers the format
``tsv`` (tab-separated values, suffix ``.tsv``, registerable and uploadable) and its loader.
Then ``dpsweep datasets register FILE.tsv`` (real SQLite) and an upload of a ``.tsv`` file to a
real ``dpsweep serve`` both succeed, a plan on each works (``dpsweep plan``, ``:plan``), and
the refusals of an unknown format list the registry's formats, the plug-in's included.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.testing.server import DPSWEEP, Server, start_server
from sweeper.store import Dataset
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.api.plugin_site import PluginSite, env_with
from tests.workers.test_plugins import write_distribution

PLUGIN_CODE = '''
"""A dpsweep plug-in: the dataset format tsv (a header row, numeric features, a label)."""


def register():
    import numpy as np

    from workers.datasets import (
        DatasetDescriptor, RawData, register_dataset, register_dataset_descriptor,
    )

    register_dataset_descriptor(
        DatasetDescriptor(
            name="tsv",
            input_kind="flat",
            description="tab-separated values from a plug-in",
            needs=("path", "label_column"),
            registerable=True,
            uploadable=True,
            suffixes=(".tsv",),
        )
    )

    @register_dataset("tsv")
    def load(spec):
        lines = open(spec.path).read().splitlines()
        header = lines[0].split("\\t")
        rows = [line.split("\\t") for line in lines[1:] if line]
        at = header.index(spec.label_column)
        x = np.array([[float(v) for i, v in enumerate(r) if i != at] for r in rows])
        y = np.array([r[at] for r in rows])
        return RawData(x=x, y=y, kind="tabular")
'''

PROBLEM = "application/problem+json"


def _tsv(n: int = 120) -> bytes:
    rng = np.random.default_rng(0)
    y = np.arange(n) % 2
    x = rng.normal(size=(n, 3)) + 2.0 * y[:, None]
    rows = ["a\tb\tc\tlabel"]
    labels = ["yes" if c else "no" for c in y]
    rows += ["\t".join([*(f"{v:.6f}" for v in r), c]) for r, c in zip(x, labels, strict=True)]
    return ("\n".join(rows) + "\n").encode()


def _spec(dataset: str) -> dict[str, object]:
    return {
        "name": "tsv-plan",
        "dataset": {"name": dataset, "test_fraction": 0.2},
        "model": {"name": "logreg"},
        "training": {"epochs": 1, "batch_size": 16, "eval_every": 5},
        "privacy": {"budgets": [4], "delta": 1e-3, "accounting": "basic"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.5], "clip": [1.0]}}],
    }


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> PluginSite:
    root = tmp_path_factory.mktemp("tsv-plugin")
    write_distribution(
        root / "site",
        "dpsweep_tsv_format",
        """
        [dpsweep.datasets]
        tsv = dpsweep_tsv_format:register
        """,
        {"__init__.py": PLUGIN_CODE},
    )
    return PluginSite(root / "site", root / "marker.txt")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, site: PluginSite) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("tsv-api")
    url = f"sqlite:///{work / 'api.db'}"
    upgrade(url)
    s = start_server(url, work, scheduler=False, env=env_with(site))
    try:
        yield s
    finally:
        s.stop()


def _dpsweep(site: PluginSite, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DPSWEEP, *args], env=env_with(site), cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_the_cli_registers_a_plugin_format_and_plans_on_it(
    site: PluginSite, tmp_path: Path
) -> None:
    data = tmp_path / "records.tsv"
    data.write_bytes(_tsv())
    db = ("--db", f"sqlite:///{tmp_path / 'cli.db'}")
    out = _dpsweep(
        site,
        "datasets",
        "register",
        str(data),
        "--name",
        "x",
        "--label-column",
        "label",
        *db,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    engine = make_engine(db[1])
    try:
        with Session(engine) as session:
            row = session.scalars(select(Dataset).where(Dataset.name == "x")).one()
            assert row.format == "tsv" and row.n_examples == 120
    finally:
        engine.dispose()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_spec("x")))
    plan = _dpsweep(site, "plan", str(spec), "--json", *db, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    (grid,) = json.loads(plan.stdout)
    assert grid["trials"] == 1 and grid["noise_multiplier"] > 0
    # A file whose name does not tell its format may name the plug-in's (--format choices).
    other = tmp_path / "records.dat"
    other.write_bytes(_tsv())
    named = _dpsweep(
        site,
        "datasets",
        "register",
        str(other),
        "--name",
        "y",
        "--format",
        "tsv",
        "--label-column",
        "label",
        *db,
        cwd=tmp_path,
    )
    assert named.returncode == 0, named.stderr
    # Refusals keep their message and list the registry's formats, the plug-in's included.
    unknown = _dpsweep(site, "datasets", "register", str(other), "--name", "z", *db, cwd=tmp_path)
    assert unknown.returncode != 0
    assert "cannot tell the format of 'records.dat' from its name" in unknown.stderr
    assert "csv, npz, idx, image_folder, text_csv, cifar10, cifar100, tsv" in unknown.stderr
    needs = _dpsweep(site, "datasets", "register", str(data), "--name", "w", *db, cwd=tmp_path)
    assert needs.returncode != 0 and "a TSV file needs --label-column" in needs.stderr
    bad = _dpsweep(
        site,
        "datasets",
        "register",
        str(data),
        "--name",
        "v",
        "--format",
        "xls",
        *db,
        cwd=tmp_path,
    )
    assert bad.returncode != 0 and "'tsv'" in bad.stderr and "invalid choice" in bad.stderr


def test_the_api_uploads_a_plugin_format_and_plans_on_it(server: Server) -> None:
    me = server.client(server.token("tsv-owner"))
    up = me.post(
        "/api/v1/datasets",
        files={"file": ("records.tsv", _tsv(), "text/tab-separated-values")},
        data={"label_column": "label"},
    )
    assert up.status_code == 201, up.text
    ds = up.json()
    assert ds["format"] == "tsv" and ds["n_examples"] == 120
    plan = me.post("/api/v1/sweeps:plan", json=_spec(ds["id"]))
    assert plan.status_code == 200, plan.text
    # Refusals name the registry's upload formats, the plug-in's included.
    bad = me.post("/api/v1/datasets", files={"file": ("records.txt", _tsv(), "text/plain")})
    assert bad.status_code == 422 and bad.headers["content-type"].startswith(PROBLEM)
    assert "unknown upload format 'txt'; choose one of csv, npz, tsv" in bad.json()["detail"]
    unlabelled = me.post("/api/v1/datasets", files={"file": ("r.tsv", _tsv(), "text/plain")})
    assert unlabelled.status_code == 422
    assert "a TSV upload needs label_column" in unlabelled.json()["detail"]
