"""Importing the dataset catalog loads no numpy, torch or loader: the API's routes and the CLI's
dataset commands import it, and only the paths that read records need ``workers.datasets``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_catalog_imports_no_loader() -> None:
    code = (
        "import sys, sweeper.datasets; "
        "print(sorted(m for m in ('numpy', 'torch', 'workers.datasets') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
