"""Running the ``dpsweep`` command from a benchmark, as a user would (one place for both
``bench/first_result.py`` and ``bench/vs_opacus.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The ``dpsweep`` command installed beside this interpreter.
DPSWEEP = str(Path(sys.executable).with_name("dpsweep"))


def run_checked(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` that raises with the command's stderr when it fails."""
    p = subprocess.run(cmd, **kwargs)
    if p.returncode:
        err = p.stderr if isinstance(p.stderr, str) else (p.stderr or b"").decode(errors="replace")
        raise RuntimeError(f"{cmd[:2]} exited with {p.returncode}:\n{err[-4000:]}")
    return p


def cli_env() -> dict[str, str]:
    """This environment without a Ray address: every dpsweep process starts its own local Ray."""
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DPSWEEP_RAY_ADDRESS")}
