"""``dpsweep serve`` says where the dashboard is and how to sign in (issue 51, item 7)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

from sweeper.privacy.ledger.amounts import show_amount


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_banner_names_the_dashboard_url(tmp_path: Path) -> None:
    port = _free_port()
    exe = Path(sys.executable).with_name("dpsweep")
    proc = subprocess.Popen(
        [
            str(exe),
            "serve",
            "--no-auth",
            "--port",
            str(port),
            "--db",
            f"sqlite:///{tmp_path / 'd.db'}",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "DPSWEEP_DEV": "true", "DPSWEEP_DRAIN_SECONDS": "1"},
        start_new_session=True,  # its scheduler child goes with it, below
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        assert proc.stderr is not None
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("dashboard:"):
                break
    finally:
        # The banner is all this test needs: the server and its scheduler go at once.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    banner = "".join(lines)
    assert f"dashboard: http://127.0.0.1:{port}/ (no sign-in (--no-auth))" in banner, banner


def test_refusals_show_amounts_short() -> None:
    """A ledger sum is shown to 6 digits, marked approximate; a short exact amount as is."""
    assert show_amount(Decimal("21.813037671057316")) == "≈21.813"
    assert show_amount(Decimal("0.5")) == "0.5"
    assert show_amount(Decimal(8)) == "8.0"
    assert show_amount(Decimal.from_float(0.1) + Decimal.from_float(0.2)) == "≈0.3"
