"""A spec's checkpoint pinned before anything is reserved, on the local command line (issue 52).

The local CLI may name a checkpoint by path (stored absolute, with its digest); every other
caller refuses paths (fail closed). A digest that differs, or one without a checkpoint, is
refused naming ``model.checkpoint_digest``. ``dpsweep plan`` says where the weights start and
how many parameters are trained of the total; a model card's ``finetuning`` section names the
checkpoint, its declaration, ``trainable``, the trial's LoRA rank and its counts.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.testing.server import DPSWEEP
from dpsweep.errors import ConfigError
from dpsweep.plan import GridPlan
from dpsweep.spec import load_spec
from sweeper.artifacts.card_finetuning import finetuning_markdown, trial_finetuning
from sweeper.sweeps.checkpoints import pin_checkpoint
from tests.api.tiny_checkpoint import head_size, lora_trained, text_csv, tiny_bert

pytest.importorskip("transformers")
pytest.importorskip("peft")


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("bert") / "tiny-bert")


def _spec(bert: Path, data: Path, **model: Any) -> dict[str, Any]:
    grid = model.pop("grid", {})
    return {
        "name": "local-ckpt",
        "dataset": {
            "name": "text_csv",
            "path": str(data),
            "label_column": "label",
            "options": {"tokenizer": str(bert), "max_length": 16},
        },
        "model": {"name": "hf", "checkpoint": str(bert), **model},
        "training": {"epochs": 1, "batch_size": 32},
        "privacy": {"budgets": [2], "delta": 1e-5, "accounting": "basic"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0], **grid}}],
    }


def test_paths_only_where_allowed_and_the_digest_pinned(bert: Path, tmp_path: Path) -> None:
    spec = load_spec(yaml.safe_dump(_spec(bert, tmp_path / "x.csv")))
    with pytest.raises(ConfigError) as refused:
        pin_checkpoint(spec, checkpoints_dir=str(tmp_path))  # a server's default: no paths
    assert refused.value.field == "model.checkpoint"
    pinned = pin_checkpoint(spec, checkpoints_dir=str(tmp_path), allow_paths=True)
    assert pinned.model.checkpoint == str(bert.resolve())
    digest = pinned.model.checkpoint_digest
    assert digest is not None and digest.startswith("sha256:")
    # Pinned again: the same spec (a resumed sweep hashes the same).
    again = pin_checkpoint(pinned, checkpoints_dir=str(tmp_path), allow_paths=True)
    assert again.model == pinned.model

    wrong = spec.model.model_copy(update={"checkpoint_digest": "sha256:" + "1" * 64})
    with pytest.raises(ConfigError) as mismatch:
        pin_checkpoint(spec.model_copy(update={"model": wrong}), allow_paths=True)
    assert mismatch.value.field == "model.checkpoint_digest"

    bare = spec.model.model_copy(update={"checkpoint": None, "checkpoint_digest": digest})
    with pytest.raises(ConfigError) as orphan:
        pin_checkpoint(spec.model_copy(update={"model": bare}))
    assert orphan.value.field == "model.checkpoint_digest"


def test_dpsweep_plan_says_what_is_trained(bert: Path, tmp_path: Path) -> None:
    data = text_csv(tmp_path / "text.csv")
    lora = {"trainable": "lora", "lora": {"r": 4, "target_modules": ["query", "value"]}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_spec(bert, data, **lora)))
    table = subprocess.run(
        [DPSWEEP, "plan", str(path)], capture_output=True, text=True, timeout=300
    )
    assert table.returncode == 0, table.stderr
    text = " ".join(table.stdout.split())
    assert f"weights start from checkpoint {bert.resolve()} (hf, sha256:" in text
    assert f"trains lora (r 4): {lora_trained(4):,} of " in text
    assert "frozen parameters are neither clipped nor noised" in text

    as_json = subprocess.run(
        [DPSWEEP, "plan", str(path), "--json"], capture_output=True, text=True, timeout=300
    )
    assert as_json.returncode == 0, as_json.stderr
    (grid,) = json.loads(as_json.stdout)
    assert grid["trainable"] == "lora (r 4)"
    assert grid["trained_parameters"] == grid["trained_parameters_max"] == lora_trained(4)
    assert grid["checkpoint"]["path"] == str(bert.resolve())
    assert grid["checkpoint"]["name"] is None  # a local path: not registered, no declaration


def _grid(**fields: Any) -> GridPlan:
    base = {
        "arm": "fixed",
        "strategy": "fixed",
        "epsilon_budget": 2.0,
        "delta": 1e-5,
        "trials": 3,
        "steps_per_trial": 10,
        "sample_rate": 0.1,
        "noise_multiplier": 1.0,
        "epsilon_per_trial": 1.0,
        "delta_per_trial": 1e-5,
        "epsilon_total": 2.0,
        "epsilon_verified": 2.0,
        "accounting": "basic",
        "accountant": "pld",
        "verified_by": "prv",
        "release": "all",
    }
    return GridPlan(**(base | fields))


def test_the_card_names_the_checkpoint_and_the_trials_counts() -> None:
    facts = {
        "name": "tiny-bert",
        "kind": "hf",
        "digest": "sha256:" + "a" * 64,
        "trained_on": "public reviews",
        "private_records_seen": False,
    }
    total_at_8 = 30_000
    grid = _grid(
        checkpoint=facts,
        trainable="lora (r 2-8)",
        trained_parameters=lora_trained(2),
        trained_parameters_max=lora_trained(8),
        total_parameters=total_at_8,
    )
    spec = {
        "model": {"name": "hf", "checkpoint": "tiny-bert", "trainable": "lora"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "lora_r": [2, 4, 8]}}],
    }
    section = trial_finetuning(spec, grid, "fixed", {"lr": 0.1, "lora_r": 4})
    assert section["lora_r"] == 4 and section["trainable"] == "lora (r 4)"
    assert section["trained_parameters"] == lora_trained(4)  # exact: linear in the rank
    assert section["total_parameters"] == total_at_8 - (lora_trained(8) - lora_trained(4))
    ckpt = section["checkpoint"]
    assert ckpt["digest"] == facts["digest"] and ckpt["trained_on"] == "public reviews"
    assert "seen none of the private records" in ckpt["statement"]
    readme = "\n".join(finetuning_markdown(section))
    assert "Checkpoint `tiny-bert` (hf)" in readme and facts["digest"] in readme
    assert f"LoRA rank 4: {lora_trained(4):,} of" in readme

    plain = trial_finetuning({"model": {"name": "mlp"}, "arms": []}, _grid(), "fixed", {})
    assert plain["checkpoint"] is None and plain["trainable"] == "all"
    assert head_size() == 66  # the tiny checkpoint's head: 32 x 2 + 2
