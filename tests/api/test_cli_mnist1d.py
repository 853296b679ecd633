"""MNIST-1D end to end: listed as a built-in by the API and the CLI, and a tiny real sweep
(one epoch, mlp and cnn1d, evaluated on the public mnist1d-test) on a local Ray."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.cli import main
from sweeper.datasets.viewer import Viewer
from sweeper.datasets.views import list_datasets
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade

pytest.importorskip("mnist1d")


def tiny_spec(model: str) -> dict[str, Any]:
    return {
        "name": f"mnist1d-{model}",
        "dataset": {"name": "mnist1d"},
        "eval": {"mode": "public", "dataset": "mnist1d-test"},
        "model": {"name": model, **({"options": {"channels": [8]}} if model == "cnn1d" else {})},
        "training": {"epochs": 1, "batch_size": 256, "eval_every": 8},
        "privacy": {"budgets": [4], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.5, 2.0], "clip": [1.0]}}],
        "seeds": 1,
        "search": {"method": "grid"},
    }


def test_the_api_and_the_plugin_listing_show_both_parts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'list.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        listed = {d["id"]: d for d in list_datasets(engine, Viewer(None))}
    finally:
        engine.dispose()
    for name in ("mnist1d", "mnist1d-test"):  # built-ins: no file, no owner
        assert listed[name]["format"] is None and listed[name]["owner"] is None
    assert listed["mnist1d"]["n_examples"] == 4000 and listed["mnist1d-test"]["n_examples"] == 1000
    assert listed["mnist1d"]["input_shape"] == [40] and listed["mnist1d"]["num_classes"] == 10
    assert main(["plugins", "--kind", "datasets", "--json"]) == 0
    names = {d["name"] for d in json.loads(capsys.readouterr().out)["datasets"]}
    assert {"mnist1d", "mnist1d-test", "digits"} <= names


@pytest.mark.slow
def test_a_tiny_sweep_on_mnist1d_runs_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'run.db'}"
    for model in ("mlp", "cnn1d"):
        spec = tmp_path / f"{model}.yaml"
        spec.write_text(yaml.safe_dump(tiny_spec(model)))
        argv = ["run", str(spec), "--db", url, "--quiet", "--json", "--workers", "1"]
        code = main([*argv, "--plots", str(tmp_path / model)])
        out = capsys.readouterr()
        assert code == 0, out.err
        shown = json.loads(out.out[out.out.index("{") :])
        assert shown["state"] == "done", shown
        assert shown["trials"]["done"] == 2 and shown["trials"]["failed"] == 0
        (result,) = shown["results"]
        assert 0.0 <= result["objective_mean"] <= 1.0
    assert main(["datasets", "list", "--db", url, "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    # The sweeps were charged to mnist1d's ledger; the public test part was never charged.
    assert rows["mnist1d"]["epsilon_spent"] > 0 and not rows["mnist1d"]["public"]
    assert "mnist1d-test" not in rows or rows["mnist1d-test"]["epsilon_spent"] == 0
