"""Fine-tuning from a local checkpoint on the command line: ``dpsweep run`` sweeps lr x LoRA
rank on a tiny BERT (built from a config, saved to a temporary directory: no network) and keeps
each grid's best adapter with a card naming the checkpoint; ``dpsweep train --checkpoint DIR
--trainable lora --lora-r 4`` trains one; a changed or code-bearing checkpoint is refused
before anything is charged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.cli import main
from tests.workers.models.tiny_checkpoints import text_csv, tiny_bert

pytest.importorskip("transformers")
pytest.importorskip("peft")


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("ckpt") / "tiny-bert")


def _spec(bert: Path, data: Path) -> dict[str, Any]:
    return {
        "name": "lora-ranks",
        "dataset": {
            "name": "text_csv",
            "path": str(data),
            "label_column": "label",
            "options": {"tokenizer": str(bert), "max_length": 16},
        },
        "model": {"name": "hf", "checkpoint": str(bert), "trainable": "lora", "lora": {"r": 4}},
        "training": {"steps": 4, "batch_size": 16, "eval_every": 2},
        "privacy": {"budgets": [8], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.5], "clip": [1.0], "lora_r": [2, 4]}}],
        "seeds": 1,
        "search": {"method": "grid"},
        "artifacts": {"keep": "all"},
    }


def test_run_sweeps_lora_ranks_and_keeps_adapters_that_name_the_checkpoint(
    bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'run.db'}"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(bert, text_csv(tmp_path / "reviews.csv", rows=80))))
    code = main(["run", str(spec), "--db", url, "--quiet", "--json", "--workers", "1"])
    out = capsys.readouterr()
    assert code == 0, out.err
    shown = json.loads(out.out[out.out.index("{") :])
    assert shown["state"] == "done", shown
    assert shown["trials"]["done"] == 2 and shown["trials"]["failed"] == 0
    cards = []
    for model in shown.get("models", []) or []:
        trial = model["trial"] if isinstance(model, dict) else model
        dest = tmp_path / f"m-{trial}"
        assert main(["model", str(trial), "-o", str(dest), "--db", url]) == 0
        cards.append(json.loads((dest / "card.json").read_text()))
    capsys.readouterr()
    assert len(cards) == 2, shown.get("models")
    ranks = sorted(c["model"]["lora"]["r"] for c in cards)
    assert ranks == [2, 4]  # each trial built its own rank
    for card in cards:
        facts = card["model"]["checkpoint"]
        assert facts["kind"] == "hf" and facts["digest"].startswith("sha256:")
        assert card["model"]["trainable"] == "lora"
        trained = card["model"]["trained_parameters"]
        assert trained == 4 * card["model"]["lora"]["r"] * (32 + 32) + 2 * 32 + 2


def test_train_with_a_checkpoint_and_lora(
    bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = text_csv(tmp_path / "reviews.csv", rows=80)
    url = f"sqlite:///{tmp_path / 't.db'}"
    argv = ["train", "--dataset", "text_csv", "--data-path", str(data), "--label-column",
            "label", "--dataset-option", "max_length=16", "--checkpoint", str(bert),
            "--trainable", "lora", "--lora-r", "4", "--epsilon", "8", "--steps", "4",
            "--batch-size", "16", "--eval-every", "2", "--json", "-y", "--db", url]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"] == "hf" and summary["engine_path"] == "generic"
    assert summary["ledger"]["epsilon_charged"] > 0


def test_a_changed_or_code_bearing_checkpoint_costs_nothing(
    bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = text_csv(tmp_path / "reviews.csv", rows=40)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    code = shutil.copytree(bert, tmp_path / "code")
    (code / "modeling_evil.py").write_text("import os\n")
    base = ["train", "--dataset", "text_csv", "--data-path", str(data), "--label-column",
            "label", "--dataset-option", f"tokenizer={bert}", "--model", "hf",
            "--epsilon", "8", "--steps", "2", "--json", "-y", "--db", url]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        main([*base, "--checkpoint", str(code)])
    assert exc.value.code == 2
    assert "holds code" in capsys.readouterr().err
    spec = _spec(bert, data)
    spec["model"]["checkpoint_digest"] = "sha256:" + "0" * 64
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SystemExit) as exc:
        main(["run", str(path), "--db", url, "--quiet", "--json", "--workers", "1"])
    assert exc.value.code == 2
    assert "its files changed" in capsys.readouterr().err
    assert main(["datasets", "list", "--db", url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(r["epsilon_spent"] == 0 for r in rows)  # nothing was charged or reserved
