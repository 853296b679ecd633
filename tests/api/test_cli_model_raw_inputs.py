"""Issue 51: a kept model takes raw inputs, on tabular data, through real ``dpsweep`` commands
(real SQLite, local Ray, registered NPZ files).

* **A public evaluation dataset** (``eval: {mode: public}``): the inputs are scaled per
  feature by (x - median) / (IQR / 1.349) of the public records; the model file carries those
  centres and scales, so the downloaded model, loaded with the SDK's loader (and its ONNX
  export), scores its card's accuracy on the raw records, and ``--check`` feeds them raw.
  Two sweeps on neighbouring private datasets (one record changed) keep models whose
  transforms are byte for byte the same: no private record enters them.
* **The default carve-out** (wine, the issue's case): the medians and IQRs are values of the
  private dataset's records, so the file holds no statistic; the card, ``dpsweep model`` and
  ``load_model`` say the model takes scaled inputs and why, and ``--check`` feeds it the
  scaled records (and matches).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.orm import Session

from api.cli import main
from sweeper.store import ModelArtifact, Sweep
from sweeper.store.engine import make_engine

pytestmark = pytest.mark.slow

SPEC: dict[str, Any] = {
    "model": {"name": "logreg"},
    "training": {"steps": 30, "batch_size": 64, "eval_every": 10},
    "privacy": {"budgets": [8], "delta": 1e-5},
    "arms": [{"strategy": "fixed", "grid": {"lr": [0.5], "clip": [1.0]}}],
}


def _records(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Three classes, five features on very different scales (raw values far outside ±5)."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    scales = np.array([1.0, 50.0, 1000.0, 0.01, 7.0])
    x = (rng.normal(size=(n, 5)) + 1.5 * y[:, None]) * scales + 300.0
    return x, y


@dataclass
class Ran:
    url: str
    root: Path
    #: sweep name -> its one kept model's trial id
    kept: dict[str, str]


def _run(root: Path, url: str, name: str, **over: Any) -> str:
    spec = root / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({"name": name, **SPEC, **over}))
    argv = ["run", str(spec), "--db", url, "--quiet", "--workers", "1"]
    assert main([*argv, "--plots", str(root / "plots" / name)]) == 0
    engine = make_engine(url)
    try:
        with Session(engine) as s:
            sid = s.scalar(sa.select(Sweep.id).where(Sweep.name == name))
            kept = list(
                s.scalars(sa.select(ModelArtifact.trial_id).where(ModelArtifact.sweep_id == sid))
            )
    finally:
        engine.dispose()
    assert len(kept) == 1
    return kept[0]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    root = tmp_path_factory.mktemp("raw-inputs")
    url = f"sqlite:///{root / 'run.db'}"
    x, y = _records(0, 300)
    np.savez(root / "a.npz", x=x, y=y)
    x[7], y[7] = x[7] * 3 + 1e4, (y[7] + 1) % 3  # the neighbour: one record changed
    np.savez(root / "b.npz", x=x, y=y)
    xp, yp = _records(1, 90)
    np.savez(root / "public.npz", x=xp, y=yp)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("DPSWEEP_ARTIFACT_URL", raising=False)
        mp.delenv("DPSWEEP_ARTIFACT_QUOTA_MB", raising=False)
        assert main(["db", "upgrade", "--db", url]) == 0
        for name in ("a", "b"):
            assert (
                main(
                    ["datasets", "register", str(root / f"{name}.npz"), "--name", name, "--db", url]
                )
                == 0
            )
        public = ["datasets", "register", str(root / "public.npz"), "--name", "pub", "--public"]
        assert main([*public, "--db", url]) == 0
        kept = {
            name: _run(
                root,
                url,
                f"public-{name}",
                dataset={"name": name},
                eval={"mode": "public", "dataset": "pub"},
            )
            for name in ("a", "b")
        }
        kept["wine"] = _run(root, url, "carve-out", dataset={"name": "wine"})
        yield Ran(url, root, kept)


def _download(ran: Ran, trial: str, out: Path, *extra: str) -> tuple[dict[str, Any], bytes]:
    assert main(["model", trial, "-o", str(out), "--db", ran.url, *extra]) == 0
    return json.loads((out / "card.json").read_text()), (out / "model.safetensors").read_bytes()


def _raw_split(ran: Ran, card: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    from sweeper.artifacts.recheck import _split_spec, rebuild_split
    from workers.datasets.raw_records import raw_evaluation_inputs

    engine = make_engine(ran.url)
    try:
        split = card["dataset"]["split"]
        return raw_evaluation_inputs(_split_spec(engine, split)), rebuild_split(
            engine, split
        ).y_test
    finally:
        engine.dispose()


def _accuracy(logits: Any, labels: np.ndarray) -> float:
    return float((np.asarray(logits).argmax(axis=-1) == labels).mean())


def test_a_model_scaled_by_public_statistics_scores_its_card_on_raw_records(
    ran: Ran, tmp_path: Path, capsys: Any
) -> None:
    import torch

    from dpsweep.trial import model_loader

    card, data = _download(ran, ran.kept["a"], tmp_path / "a")
    printed = " ".join(capsys.readouterr().out.split())
    transform = card["model"]["input_transform"]
    assert transform["in_model_file"] is True and transform["method"] == "public-robust"
    assert card["dataset"]["input_scaling"]["source"] == "public evaluation dataset"
    assert "inputs: raw records; the model file carries the trainer's input transform" in printed
    raw, labels = _raw_split(ran, card)
    assert float(np.abs(raw).max()) > 100  # raw, far outside the scaled ±5
    module = model_loader("build")(card["model"], data)
    with torch.no_grad():
        accuracy = _accuracy(module(torch.from_numpy(raw)), labels)
    stated = card["metrics"]["values"]["accuracy"]
    assert stated > 0.5  # well above chance (1/3): the model learnt something
    assert accuracy == pytest.approx(stated, abs=1.5 / len(raw))

    assert main(["model", ran.kept["a"], "--check", "--db", ran.url]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "fed the raw evaluation records" in printed and "check: matches its card" in printed


def test_its_onnx_export_scores_its_card_on_raw_records(ran: Ran, tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    from onnx.reference import ReferenceEvaluator

    out = tmp_path / "onnx"
    card, _ = _download(ran, ran.kept["a"], out, "--onnx")
    raw, labels = _raw_split(ran, card)
    (logits,) = ReferenceEvaluator(str(out / "model.onnx")).run(
        None, {"input": raw.astype(np.float32)}
    )
    stated = card["metrics"]["values"]["accuracy"]
    assert _accuracy(logits, labels) == pytest.approx(stated, abs=1.5 / len(raw))


def test_neighbouring_private_datasets_keep_the_same_transform_bytes(
    ran: Ran, tmp_path: Path
) -> None:
    """The two sweeps trained on datasets that differ in one private record; their model
    files' input transforms (centres, scales, clip) are the same bytes."""
    from safetensors.numpy import load, save

    from workers.datasets.input_transform import PREFIX

    found = []
    for name in ("a", "b"):
        card, data = _download(ran, ran.kept[name], tmp_path / name)
        tensors = {k: v for k, v in load(data).items() if k.startswith(PREFIX)}
        assert sorted(tensors) == card["model"]["input_transform"]["tensors"]
        found.append(save(tensors))
    assert found[0] == found[1]
    assert (ran.root / "a.npz").read_bytes() != (ran.root / "b.npz").read_bytes()


def test_a_carve_out_model_holds_no_statistic_and_says_it_takes_scaled_inputs(
    ran: Ran, tmp_path: Path, capsys: Any
) -> None:
    from safetensors.numpy import load

    from dpsweep.trial import warn_scaled_inputs
    from workers.datasets.input_transform import PREFIX

    card, data = _download(ran, ran.kept["wine"], tmp_path / "wine")
    printed = " ".join(capsys.readouterr().out.split())
    assert card["dataset"]["input_scaling"]["method"] == "public-robust"
    transform = card["model"]["input_transform"]
    assert transform["in_model_file"] is False and transform["raw_inputs"] is False
    assert "input_bounds" in transform["reason"]
    assert not any(k.startswith(PREFIX) for k in load(data))
    assert "inputs: scaled as the trainer scaled them, not raw records" in printed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_scaled_inputs(card, ran.kept["wine"])
    assert caught and "takes inputs scaled" in str(caught[0].message)

    assert main(["model", ran.kept["wine"], "--check", "--db", ran.url]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "fed the evaluation records scaled as the trainer scaled them" in printed
    assert "check: matches its card" in printed
