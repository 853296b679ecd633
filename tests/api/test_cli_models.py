"""``dpsweep model TRIAL_ID -o DIR``: a real ``dpsweep run`` of a tiny sweep on SQLite (local
Ray), then the kept model, its card and README written to a folder, hashes checked against the
database; the clear errors for an unknown trial and a trial whose model is not kept; ONNX."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.orm import Session

from api.cli import main
from api.cli.models import privacy_lines
from sweeper.store import ModelArtifact, Trial, TrialState
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade

SPEC = {
    "name": "keep",
    # Not the defaults: the card must carry the split the workers actually used.
    "dataset": {"name": "digits", "split_seed": 3, "test_fraction": 0.25},
    "model": {"name": "logreg"},
    "training": {"steps": 10, "batch_size": 64, "eval_every": 5},
    "privacy": {"budgets": [2], "delta": 1e-5},
    # Two configurations of one grid: best_per_grid keeps one model, not the other.
    "arms": [{"strategy": "fixed", "grid": {"lr": [0.05, 0.5], "clip": [1.0]}}],
}


@dataclass
class Ran:
    url: str
    kept: str
    not_kept: str
    root: Path


def _text(out: str) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(out.split())


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    root = tmp_path_factory.mktemp("cli-models")
    url = f"sqlite:///{root / 'run.db'}"
    spec = root / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    with pytest.MonkeyPatch.context() as mp:
        # The default store, beside the SQLite file; no quota.
        mp.delenv("DPSWEEP_ARTIFACT_URL", raising=False)
        mp.delenv("DPSWEEP_ARTIFACT_QUOTA_MB", raising=False)
        argv = ["run", str(spec), "--db", url, "--quiet", "--workers", "1"]
        assert main([*argv, "--plots", str(root / "plots")]) == 0
        engine = make_engine(url)
        with Session(engine) as s:
            done = list(s.scalars(sa.select(Trial.id).where(Trial.state == TrialState.done)))
            kept = list(s.scalars(sa.select(ModelArtifact.trial_id)))
        engine.dispose()
        assert len(done) == 2 and len(kept) == 1
        yield Ran(url, kept[0], next(t for t in done if t != kept[0]), root)


def _row(url: str, trial_id: str) -> ModelArtifact:
    engine = make_engine(url)
    try:
        with Session(engine) as s:
            row = s.get(ModelArtifact, trial_id)
            assert row is not None
            s.expunge(row)
            return row
    finally:
        engine.dispose()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_model_writes_the_model_card_and_readme_whose_hashes_match(
    ran: Ran, tmp_path: Path, capsys: Any
) -> None:
    out = tmp_path / "model"
    assert main(["model", ran.kept, "-o", str(out), "--db", ran.url]) == 0
    printed = _text(capsys.readouterr().out)
    row = _row(ran.url, ran.kept)
    assert _sha(out / "model.safetensors") == row.sha256
    assert (out / "model.safetensors").stat().st_size == row.size_bytes
    assert _sha(out / "card.json") == row.card_sha256
    card = json.loads((out / "card.json").read_text())
    assert card == row.card
    assert (out / "README.md").read_text().startswith("# ")
    for name in ("model.safetensors", "card.json", "README.md"):
        assert f"wrote {out / name}" in printed
    for line in privacy_lines(card):  # the ε of its grid and of the whole sweep
        assert _text(line) in printed
    assert "warning:" not in printed  # secret randomness: no reproducible-mode warning
    assert not list(out.glob(".*tmp*"))  # no temporary file left behind

    # The weights load into the architecture the card describes.
    from safetensors.torch import load

    from workers.checkpoints import build_trained
    from workers.datasets.input_transform import PREFIX

    data = (out / "model.safetensors").read_bytes()
    module = build_trained(card["model"], data, raw_inputs=False)
    names = set(load(data))
    assert set(module.state_dict()) == {n for n in names if not n.startswith(PREFIX)}
    # Beside the weights, the input transform the trainer applied (digits: the pixel format's
    # constant, public), which the card names and the command says the model applies.
    transform = card["model"]["input_transform"]
    assert transform["in_model_file"] is True and transform["method"] == "pixel"
    assert {n for n in names if n.startswith(PREFIX)} == set(transform["tensors"])
    assert "inputs: raw records; the model file carries the trainer's input transform" in printed
    assert "- Inputs: raw records; the model file carries" in (out / "README.md").read_text()


def _onnx_ready() -> bool:
    return (
        importlib.util.find_spec("onnx") is not None
        and importlib.util.find_spec("workers.onnx_export") is not None
    )


def _raw_split(url: str, card: dict[str, Any]) -> tuple[Any, Any]:
    """The card's evaluation records as they are on disk (unscaled), and their labels."""
    from sweeper.artifacts.recheck import _split_spec, rebuild_split
    from workers.datasets.raw_records import raw_evaluation_inputs

    engine = make_engine(url)
    try:
        split = card["dataset"]["split"]
        raw = raw_evaluation_inputs(_split_spec(engine, split))
        return raw, rebuild_split(engine, split).y_test
    finally:
        engine.dispose()


@pytest.mark.slow
def test_the_downloaded_model_scores_its_cards_accuracy_on_raw_records(
    ran: Ran, tmp_path: Path
) -> None:
    """Issue 51: a kept model takes raw inputs. The file written by ``dpsweep model``, loaded
    with the SDK's loader (the ``build`` entry point), is fed the raw pixel values (0..16)
    and scores exactly the card's accuracy; the bare network on the same raw values does not
    (it expects them scaled to [0, 1])."""
    import torch

    from dpsweep.trial import model_loader

    out = tmp_path / "raw"
    assert main(["model", ran.kept, "-o", str(out), "--db", ran.url]) == 0
    card = json.loads((out / "card.json").read_text())
    data = (out / "model.safetensors").read_bytes()
    raw, labels = _raw_split(ran.url, card)
    assert float(raw.max()) > 1.0  # raw: digits' pixels are 0..16
    module = model_loader("build")(card["model"], data)
    with torch.no_grad():
        logits = module(torch.from_numpy(raw))
        bare = model_loader("build")(card["model"], data, raw_inputs=False)
        bare_logits = bare(torch.from_numpy(raw).float())
    accuracy = float((logits.argmax(dim=-1).numpy() == labels).mean())
    assert accuracy == pytest.approx(card["metrics"]["values"]["accuracy"], abs=1.5 / len(raw))
    # The bare network reads the raw values as if scaled: other outputs. (Not another
    # accuracy: a network nearly linear in its input can rank the classes alike at any scale,
    # and one trained run did, at the same accuracy to the record.)
    assert not torch.allclose(bare_logits, logits, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
@pytest.mark.skipif(not _onnx_ready(), reason="the onnx package is not installed")
def test_the_onnx_file_scores_its_cards_accuracy_on_raw_records(ran: Ran, tmp_path: Path) -> None:
    """The ONNX export carries the same transform: raw float32 pixels in, the card's accuracy
    out (onnx's reference runtime)."""
    import numpy as np
    from onnx.reference import ReferenceEvaluator

    out = tmp_path / "onnx-raw"
    assert main(["model", ran.kept, "-o", str(out), "--db", ran.url, "--onnx"]) == 0
    card = json.loads((out / "card.json").read_text())
    raw, labels = _raw_split(ran.url, card)
    (logits,) = ReferenceEvaluator(str(out / "model.onnx")).run(
        None, {"input": raw.astype(np.float32)}
    )
    accuracy = float((np.asarray(logits).argmax(axis=-1) == labels).mean())
    assert accuracy == pytest.approx(card["metrics"]["values"]["accuracy"], abs=1.5 / len(raw))


@pytest.mark.slow
def test_a_trial_whose_model_is_not_kept_says_why(ran: Ran, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "none"
    assert main(["model", ran.not_kept, "-o", str(out), "--db", ran.url]) == 1
    err = _text(capsys.readouterr().err)
    assert f"no model is kept for trial {ran.not_kept}" in err
    assert "best_per_grid" in err and "not its grid's best" in err
    assert not out.exists()


def test_an_unknown_trial_is_a_clear_error(tmp_path: Path, capsys: Any) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    upgrade(url)
    assert main(["model", "nope", "-o", str(tmp_path / "m"), "--db", url]) == 1
    err = _text(capsys.readouterr().err)
    assert "no trial 'nope'" in err and "dpsweep export SWEEP_ID" in err
    assert not (tmp_path / "m").exists()


def test_privacy_lines_state_the_grid_and_the_sweep_epsilon() -> None:
    card = {
        "trial": {"arm": "fixed"},
        "privacy": {
            "private": True,
            "epsilon": 1.99,
            "delta": 1e-5,
            "covers": "releasing every trial of this grid",
            "grid": {"grid": "fixed@2", "covers": "releasing every trial of this grid"},
            "sweep": {"epsilon": 2.2, "delta": 2e-5, "covers": "everything this sweep releases"},
        },
    }
    assert privacy_lines(card) == [
        "ε 1.99 (δ 1e-05) for this model's grid fixed@2: releasing every trial of this grid",
        "ε 2.2 (δ 2e-05) for the whole sweep: everything this sweep releases",
    ]
    assert privacy_lines({"privacy": {"private": False}}) == []


@pytest.mark.slow
@pytest.mark.skipif(not _onnx_ready(), reason="the onnx package is not installed")
def test_onnx_export_writes_model_onnx(ran: Ran, tmp_path: Path) -> None:
    import onnx

    out = tmp_path / "onnx"
    assert main(["model", ran.kept, "-o", str(out), "--db", ran.url, "--onnx"]) == 0
    onnx.checker.check_model(onnx.load(str(out / "model.onnx")))


@pytest.mark.slow
@pytest.mark.skipif(_onnx_ready(), reason="the onnx package is installed")
def test_onnx_without_the_package_says_what_to_install(
    ran: Ran, tmp_path: Path, capsys: Any
) -> None:
    out = tmp_path / "no-onnx"
    assert main(["model", ran.kept, "-o", str(out), "--db", ran.url, "--onnx"]) == 1
    err = _text(capsys.readouterr().err)
    assert "onnx" in err and "pip install" in err and "nothing was written" in err
    assert not out.exists()  # said before anything is written


@pytest.mark.slow
def test_onnx_export_missing_its_package_writes_nothing(
    ran: Ran, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python's own mark of a module that cannot be imported: the exporter's dependency is
    # missing whatever is installed here.
    monkeypatch.setitem(sys.modules, "onnx", None)
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    out = tmp_path / "missing"
    assert main(["model", ran.kept, "-o", str(out), "--db", ran.url, "--onnx"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1  # one line
    assert "pip install 'dpsweep[onnx]'" in _text(err) and "nothing was written" in err
    assert not out.exists()


@pytest.mark.slow
def test_the_card_carries_the_split_the_workers_used(ran: Ran) -> None:
    """The card's split settings are the sweep's (not the defaults), and rebuilding the split
    from them gives exactly the evaluation records the plan counted."""
    from sweeper.artifacts.recheck import rebuild_split

    split = _row(ran.url, ran.kept).card["dataset"]["split"]
    assert split["loader"] == "digits" and split["eval_mode"] == "carve-out"
    assert split["split_seed"] == 3 and split["test_fraction"] == 0.25
    assert split["classes"] is None and split["input_bounds"] is None
    assert split["feature_clip"] == 5.0 and split["options"] == {}
    card = _row(ran.url, ran.kept).card
    engine = make_engine(ran.url)
    try:
        data = rebuild_split(engine, split)
        other = rebuild_split(engine, split | {"split_seed": 0})
    finally:
        engine.dispose()
    assert data.x_test.shape[0] == card["dataset"]["n_eval"] == round(1797 * 0.25)
    # The seed matters: another one holds out other records.
    assert not (data.x_test == other.x_test).all()


@pytest.mark.slow
def test_check_re_evaluates_the_kept_model_and_matches_its_card(
    ran: Ran, tmp_path: Path, capsys: Any
) -> None:
    assert main(["model", ran.kept, "--check", "--db", ran.url]) == 0
    printed = _text(capsys.readouterr().out)
    card = _row(ran.url, ran.kept).card
    acc = card["metrics"]["values"]["accuracy"]
    assert f"accuracy: card {acc:.4g}, re-computed {acc:.4g}: match" in printed
    assert "loss: card" in printed and "check: matches its card" in printed
    assert f"eval mode carve-out, {card['dataset']['n_eval']} records" in printed
    assert "wrote" not in printed  # no -o: nothing written
    # The model carries its input transform: the check feeds it raw records.
    assert "fed the raw evaluation records" in printed

    # A downloaded copy checks the same; with -o the files are written, then checked.
    out = tmp_path / "m"
    assert main(["model", ran.kept, "-o", str(out), "--db", ran.url, "--check"]) == 0
    assert "check: matches its card" in _text(capsys.readouterr().out)
    assert main(["model", ran.kept, "--db", ran.url, "--check", str(out)]) == 0
    assert "check: matches its card" in _text(capsys.readouterr().out)


@pytest.mark.slow
def test_check_reports_a_tampered_model_as_differing(ran: Ran, tmp_path: Path, capsys: Any) -> None:
    from safetensors.torch import load, save

    out = tmp_path / "m"
    assert main(["model", ran.kept, "-o", str(out), "--db", ran.url]) == 0
    capsys.readouterr()
    path = out / "model.safetensors"
    path.write_bytes(save({k: v.zero_() for k, v in load(path.read_bytes()).items()}))
    assert main(["model", ran.kept, "--db", ran.url, "--check", str(path)]) == 1
    printed = _text(capsys.readouterr().out)
    assert "accuracy: card" in printed and "DIFFERS by" in printed
    assert "not those the card describes" in printed  # its sha256 is not the card's
    assert "check: differs from its card" in printed


def test_check_or_output_is_required(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["model", "t1"])
    assert exc.value.code == 2
    assert "give -o DIR" in capsys.readouterr().err


def test_a_reproducible_model_always_carries_a_warning() -> None:
    from api.cli.models import REPRODUCIBLE_MODEL, warning_lines

    assert warning_lines({}, reproducible=True) == [REPRODUCIBLE_MODEL]
    said = {"warnings": ["reproducible mode: noise and sampling come from the public seed"]}
    assert warning_lines(said, reproducible=True) == said["warnings"]  # not said twice
    assert warning_lines({}, reproducible=False) == []
