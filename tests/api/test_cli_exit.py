"""The ``dpsweep`` console script ends its process as soon as a command is done
(:func:`api.cli.entry`), and loses nothing on the way: the whole output, the exit code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DPSWEEP = shutil.which("dpsweep", path=str(Path(sys.executable).parent)) or "dpsweep"


# The command run the ordinary way: argv after "-c CODE" is the command's.
_ORDINARY = "import sys; from api.cli import main; sys.exit(main())"


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DPSWEEP, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_piped_output_is_whole(tmp_path: Path) -> None:
    # Tens of kilobytes into a pipe: every byte is flushed before the quick exit. The same
    # command exiting the ordinary way (sys.exit) is the reference; both in fresh processes.
    out = _run("plugins", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    ordinary = subprocess.run(
        [sys.executable, "-c", _ORDINARY, "plugins", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        timeout=120,
        check=True,
    )
    assert out.stdout == ordinary.stdout
    assert len(out.stdout) > 10_000
    assert json.loads(out.stdout)


def test_exit_codes_and_messages_survive(tmp_path: Path) -> None:
    usage = _run("run", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert usage.returncode == 2
    assert "spec file not found" in usage.stderr
    failure = _run("show", "sw_nope", "--db", f"sqlite:///{tmp_path / 'x.db'}", cwd=tmp_path)
    assert failure.returncode == 1
    assert "no sweep 'sw_nope'" in failure.stderr


# A stand-in command run through the real entry(): small writes that stay in the stream's
# buffer, an exit handler, and (with "thread") a non-daemon thread still writing.
_COMMAND = """
import atexit, sys, threading, time
import api.cli as cli

def command(argv=None):
    for i in range(2000):
        print(i)
    sys.stderr.write("to stderr")
    atexit.register(lambda: print("exit handler ran"))
    if "thread" in sys.argv:
        def late():
            time.sleep(0.5)
            print("late thread")
        threading.Thread(target=late).start()
    return 3

cli.main = command
cli.entry()
"""


@pytest.mark.parametrize("thread", [False, True])
def test_entry_flushes_runs_exit_handlers_and_waits_for_threads(
    tmp_path: Path, thread: bool
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _COMMAND, *(["thread"] if thread else [])],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        # Block-buffered streams, as a user's usually are when piped.
        env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
        timeout=60,
        check=False,
    )
    assert out.returncode == 3
    lines = out.stdout.splitlines()
    assert lines[:2000] == [str(i) for i in range(2000)]
    assert "exit handler ran" in lines
    assert ("late thread" in lines) is thread
    assert out.stderr.endswith("to stderr")
