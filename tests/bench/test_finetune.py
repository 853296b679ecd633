"""bench/finetune.py runs on a tiny config and reports every column (figures not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_finetune_benchmark_smoke(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    out = tmp_path / "finetune.json"
    args = ["--quick", "--repeats", "1", "--warmup", "1", "--json", str(out)]
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench/finetune.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr
    assert "dp_lora_vs_nonprivate_lora" in p.stdout  # the table
    res = json.loads(out.read_text())
    assert set(res["methods"]) == {"dp_lora", "nonprivate_lora", "dp_full", "nonprivate_full"}
    for row in res["methods"].values():
        assert row["ms"] > 0 and "step_peak_mb" in row
    assert set(res["ratios"]) == {
        "dp_lora_vs_nonprivate_lora",
        "dp_lora_vs_dp_full",
        "dp_full_vs_nonprivate_full",
    }
    assert set(res["targets_met"]) == {"dp_lora_vs_nonprivate_lora", "dp_lora_vs_dp_full"}
    lora, full = res["lora"], res["full"]
    # LoRA trains a small part of the model, on the generic path, every layer on its rule.
    assert lora["engine_path"] == full["engine_path"] == "generic"
    assert 0 < lora["trained_parameters"] < lora["total_parameters"] // 5
    assert full["trained_parameters"] == full["total_parameters"]
    assert lora["rules"] == ["linear"]
