"""The benchmarks run and report every column (figures are not asserted here)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(path: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``ROOT / path`` with this interpreter, as `make bench` / `make report` would."""
    return subprocess.run(
        [sys.executable, str(ROOT / path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_step_overhead_benchmark_smoke() -> None:
    args = [
        "--json",
        "--repeats",
        "2",
        "--models",
        "mlp",
        "--batches",
        "64",
        "--strategies",
        "quantile,online,bam",
    ]
    p = _script("bench/step_overhead.py", *args)
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)["mlp"]["64"]
    assert set(row) == {
        "nonprivate_ms",
        "fixed",
        "opacus_hooks",
        "opacus_ghost",
        "quantile",
        "online",
        "bam",
    }
    assert all(v > 0 for v in row.values())


def test_packing_benchmark_smoke() -> None:
    p = _script("bench/packing.py", "--json", "--quick", "--models", "mlp")
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)["mlp"]
    assert row["trials"] == 25 and row["speedup"] > 0 and row["per_trial_step_vs_nonprivate"] > 0


def test_sweep_throughput_benchmark_smoke() -> None:
    p = _script("bench/sweep_throughput.py", "--quick", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert {
        "trials",
        "workers_1_s",
        "workers_2_s",
        "speedup",
        "overhead_mean_s",
        "overhead_max_s",
        "targets",
        "model",
        "steps",
        "pack_size",
    } <= set(out)
    assert out["targets"] == {"speedup": 1.7, "overhead_s": 0.5}
    assert out["trials"] == 4 and out["pack_size"] == 1
    assert out["speedup"] > 0
    assert isinstance(out["overhead_mean_s"], float) and math.isfinite(out["overhead_mean_s"])


def test_api_load_benchmark_smoke() -> None:
    # 200 trials plan faster than 40 (larger grids get more noise, which the PLD accountant
    # handles faster); a few requests per endpoint, SQLite only.
    args = ["--json", "--trials", "200", "--clients", "4", "--requests", "3", "--warmup", "2"]
    p = _script("bench/api_load.py", *args, "--backends", "sqlite")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["trials"] == 200 and out["clients"] == 4 and out["backends"] == ["sqlite"]
    assert out["target_p99_ms"] == 100.0
    rows = out["sqlite"]
    assert set(rows) == {
        "GET /sweeps/{id}/pareto",
        "GET /sweeps/{id}/trials?limit=100",
        "GET /sweeps/{id}",
    }
    for row in rows.values():
        assert row["n"] == 12 and row["errors"] == 0
        assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("p50_ms", "p99_ms", "rps"))
        assert row["p50_ms"] <= row["p99_ms"] and isinstance(row["meets_target"], bool)
    assert out["sweeps"]["sqlite"]["trials"] == 200


@pytest.mark.slow
def test_dashboard_open_benchmark_smoke() -> None:
    args = ["--json", "--trials", "200", "--repeats", "1"]
    p = _script("bench/dashboard_open.py", *args, timeout=600)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["trials"] == 200
    first = out["first"]
    assert set(first) == {
        "header_ms",
        "eps_front_ms",
        "calibration_ms",
        "trials_first_page_ms",
        "trials_all_ms",
    }
    assert 0 < first["header_ms"] <= first["eps_front_ms"] <= first["calibration_ms"]
    assert any("pareto?x=accuracy&y=ece" in path for path in out["bytes"])


@pytest.mark.slow
def test_make_report_runs_end_to_end_at_tiny_scale(tmp_path: Path) -> None:
    """`make report`'s pipeline, tiny: real sweeps, read back, tables, a figure, markdown."""
    p = _script("report/make_report.py", "--scale", "tiny", "--out", str(tmp_path), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    facts = json.loads(p.stdout)["calibration"]
    assert facts["seconds"] > 0 and len([k for k in facts if k.startswith("ece_")]) == 4
    md = (tmp_path / "results.md").read_text()
    assert "| small-C | 3 |" in md and "| large-C | 3 |" in md  # the plan table
    assert "lr=2, clip=0.1" in md and "lr=0.02, clip=10" in md  # the results table
    assert (tmp_path / "figures" / "calibration-reliability.png").stat().st_size > 10_000
