"""``dpsweep model TRIAL --check`` and ``--onnx`` on real sweeps (real SQLite, local Ray):

* a DP-evaluated model: the card's noisy accuracy is compared with the exact one within the
  noise the card states, and the exact one is said to be for the data's owner only;
* a ``module:function`` model on a ``module:function`` dataset (a local module on
  PYTHONPATH, trained by a real ``dpsweep run``): ``--check`` imports both factories and
  matches; ``--onnx`` on a layer ONNX cannot export fails in one line before anything is
  written, and the same architecture without that layer exports.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.cli import main

DPSWEEP = str(Path(sys.executable).with_name("dpsweep"))
MODULE = "dpsweep_check_factories"

FACTORIES = '''
"""A model whose middle layer ONNX cannot export (an SVD), unless DPSWEEP_TEST_PLAIN is set;
its state dict is the same either way (the layer has no parameters)."""

import os

import numpy as np


def build(input_shape, num_classes):
    import torch
    from torch import nn

    class Spectral(nn.Module):
        def forward(self, x):
            s = torch.linalg.svdvals(x.reshape(x.shape[0], 2, -1))
            return x * (1.0 + 0.0 * s.sum(-1, keepdim=True))

    middle = nn.Identity() if os.environ.get("DPSWEEP_TEST_PLAIN") else Spectral()
    return nn.Sequential(
        nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 4), middle, nn.ReLU(),
        nn.Linear(4, num_classes),
    )


def data(spec):
    from workers.datasets.records import RawData

    y = np.arange(300) % 3
    x = np.random.default_rng(0).normal(size=(300, 4)) + 1.5 * y[:, None]
    return RawData(x=x, y=y, kind="tabular")
'''


def _text(out: str) -> str:
    return " ".join(out.split())


def _kept(db: Path) -> str:
    with sqlite3.connect(db) as con:
        (row,) = con.execute("select trial_id from model_artifacts").fetchall()
    return str(row[0])


def _env(site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPSWEEP_ARTIFACT")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(site), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
    return env | extra


def _dpsweep(site: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DPSWEEP, *args], env=_env(site, **env), cwd=cwd, capture_output=True, text=True,
        timeout=400,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# DP evaluation


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    root = tmp_path_factory.mktemp("check-dp")
    url = f"sqlite:///{root / 'dp.db'}"
    spec = {
        "name": "dp-check",
        "dataset": {"name": "digits", "split_seed": 5},
        "model": {"name": "logreg"},
        "training": {"steps": 20, "batch_size": 64, "eval_every": 10},
        "privacy": {"budgets": [3], "delta": 1e-5},
        "eval": {"mode": "dp"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.5], "clip": [1.0]}}],
    }
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("DPSWEEP_ARTIFACT_URL", raising=False)
        mp.delenv("DPSWEEP_ARTIFACT_QUOTA_MB", raising=False)
        argv = ["run", str(root / "spec.yaml"), "--db", url, "--quiet", "--workers", "1"]
        assert main([*argv, "--plots", str(root / "plots")]) == 0
        yield url, _kept(root / "dp.db")


@pytest.mark.slow
def test_check_of_a_dp_evaluated_model_compares_within_the_noise(
    dp_run: tuple[str, str], tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sweeper.artifacts.recheck import dp_tolerance

    url, trial = dp_run
    monkeypatch.delenv("DPSWEEP_ARTIFACT_URL", raising=False)
    out = tmp_path / "m"
    assert main(["model", trial, "--db", url, "-o", str(out), "--check"]) == 0
    printed = _text(capsys.readouterr().out)
    card = json.loads((out / "card.json").read_text())
    split, ev = card["dataset"]["split"], card["evaluation"]
    assert split["eval_mode"] == "dp" and split["split_seed"] == 5
    noisy = card["metrics"]["values"]["accuracy"]
    tol = dp_tolerance(
        noise_multiplier=ev["eval_noise_multiplier"],
        n_eval=card["dataset"]["n_eval"],
        releases=ev["eval_releases"],
    )
    assert f"accuracy: card (noisy) {noisy:.4g}, exact" in printed
    assert f"match (within {tol:.3g})" in printed
    assert "is a DP release" in printed and f"the best of {ev['eval_releases']}" in printed
    assert "shown to you as the data's owner and is not a release" in printed
    assert "loss:" not in printed  # a DP evaluation releases no loss
    assert "check: matches its card" in printed
    # The model with its weights zeroed predicts one class: far outside the noise.
    from safetensors.torch import load, save

    path = out / "model.safetensors"
    path.write_bytes(save({k: v.zero_() for k, v in load(path.read_bytes()).items()}))
    assert main(["model", trial, "--db", url, "--check", str(out)]) == 1
    assert "check: differs from its card" in _text(capsys.readouterr().out)


# ---------------------------------------------------------------------------------------------
# module:function model and dataset


@dataclass
class FactoryRun:
    site: Path
    root: Path
    db: str
    trial: str


@pytest.fixture(scope="module")
def factory_run(tmp_path_factory: pytest.TempPathFactory) -> FactoryRun:
    root = tmp_path_factory.mktemp("check-factory")
    site = root / "site"
    site.mkdir()
    (site / f"{MODULE}.py").write_text(FACTORIES)
    spec = {
        "name": "factory-check",
        "dataset": {"name": f"{MODULE}:data", "split_seed": 2, "test_fraction": 0.3},
        "model": {"name": f"{MODULE}:build"},
        "training": {"epochs": 2, "batch_size": 32, "eval_every": 5},
        "privacy": {"budgets": [4], "delta": 1e-3, "accounting": "basic"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.5], "clip": [1.0]}}],
    }
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    db = f"sqlite:///{root / 'f.db'}"
    run = _dpsweep(
        site,
        *("run", str(root / "spec.yaml"), "--db", db, "--workers", "1", "--quiet"),
        *("--plots", str(root / "plots")),
        cwd=root,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return FactoryRun(site, root, db, _kept(root / "f.db"))


@pytest.mark.slow
def test_onnx_of_a_factory_model_that_cannot_export_writes_nothing(
    factory_run: FactoryRun, tmp_path: Path
) -> None:
    out = tmp_path / "onnx"
    r = _dpsweep(
        factory_run.site,
        *("model", factory_run.trial, "--db", factory_run.db, "-o", str(out), "--onnx"),
        cwd=factory_run.root,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    # One line says why; torch's dump of the graph is not printed.
    assert [ln for ln in r.stderr.splitlines() if ln.strip()] == [r.stderr.strip()]
    assert "graph" not in r.stdout
    err = _text(r.stderr)
    assert f"model '{MODULE}:build' cannot be exported to ONNX" in err
    assert "linalg_svdvals" in err and "nothing was written" in err
    assert not out.exists()  # not even the folder


@pytest.mark.slow
def test_onnx_of_an_exportable_factory_model_writes_every_file(
    factory_run: FactoryRun, tmp_path: Path
) -> None:
    onnx = pytest.importorskip("onnx", reason="ONNX export needs the onnx extra")
    out = tmp_path / "onnx"
    r = _dpsweep(
        factory_run.site,
        *("model", factory_run.trial, "--db", factory_run.db, "-o", str(out), "--onnx"),
        cwd=factory_run.root,
        DPSWEEP_TEST_PLAIN="1",  # the same weights, without the layer ONNX lacks
    )
    assert r.returncode == 0, r.stderr
    names = {p.name for p in out.iterdir()}
    assert names == {"model.safetensors", "card.json", "README.md", "model.onnx"}
    onnx.checker.check_model(onnx.load(str(out / "model.onnx")))


@pytest.mark.slow
def test_check_of_a_factory_model_on_a_factory_dataset_matches(
    factory_run: FactoryRun,
) -> None:
    r = _dpsweep(
        factory_run.site,
        *("model", factory_run.trial, "--db", factory_run.db, "--check"),
        cwd=factory_run.root,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    printed = _text(r.stdout)
    assert "eval mode carve-out, 90 records" in printed  # 0.3 of 300
    assert "accuracy: card" in printed and "loss: card" in printed
    assert "check: matches its card" in printed
