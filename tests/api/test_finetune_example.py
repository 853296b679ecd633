"""The fine-tuning example (docs/finetuning.md): its script writes a local checkpoint and a CSV
without a network, and ``examples/finetune-lora.yaml`` plans on them, lr x LoRA rank under one
per-grid epsilon, naming the checkpoint's digest and the trained parameters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from api.cli import main

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("transformers")
pytest.importorskip("peft")


def test_the_lora_example_plans_on_the_checkpoint_its_script_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = ROOT / "examples" / "finetune" / "make_checkpoint.py"
    made = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "--pretrain-steps", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "tiny-bert" / "config.json").is_file()
    assert (tmp_path / "reviews.csv").read_text().count("\n") == 601
    text = (ROOT / "examples" / "finetune-lora.yaml").read_text()
    spec = tmp_path / "spec.yaml"
    spec.write_text(text.replace("examples/finetune/", f"{tmp_path}/"))
    assert yaml.safe_load(spec.read_text())["model"]["checkpoint"] == f"{tmp_path}/tiny-bert"
    assert main(["plan", str(spec)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "weights start from checkpoint" in out and "sha256:" in out
    assert "trains lora (r 4-8)" in out and "of 576,002 parameters" in out
