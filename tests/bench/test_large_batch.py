"""bench/large_batch.py runs on tiny settings and reports every figure (not asserted: the
targets are measured at full scale by hand, see the module's docstring)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_large_batch_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "large_batch.json"
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench/large_batch.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr
    assert "ratio" in p.stdout  # the table
    res = json.loads(out.read_text())
    assert set(res["memory"]) == {"packed", "generic"}  # both engine paths
    for row in res["memory"].values():
        assert len(row["by_logical"]) == 2 and "ratio" in row
    speed = res["speed"]
    assert speed["path"] == "generic" and speed["seconds"]["dp"] > 0 and speed["ratio"] > 0
    assert speed["chunks_dp"] >= speed["chunks_nonprivate_expected"]
    assert res["augment"]["ratio_per_example"] > 0
