"""A throwaway PostgreSQL server for tests and benchmarks (initdb + pg_ctl, docs/environment.md)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


class PostgresMissing(RuntimeError):
    """The PostgreSQL server binaries are not installed."""


def pg_bin(name: str) -> str | None:
    """A PostgreSQL server binary on PATH or under /usr/lib/postgresql (newest), or None."""
    found = shutil.which(name)
    if found:
        return found
    hits = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return hits[-1] if hits else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def throwaway_postgres(prefix: str = "dpsweep-pg-") -> Iterator[str]:
    """Start a PostgreSQL server on 127.0.0.1 and yield its URL; stop and delete it after.

    PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user.

    Raises:
        PostgresMissing: initdb or pg_ctl not found.
    """
    initdb, pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise PostgresMissing(
            "PostgreSQL server binaries (initdb, pg_ctl) are missing; install them with "
            "apt-get install postgresql (.ci/run does)"
        )
    # Its own directory: pytest's temporary root is private to root, and the server must run
    # as another user when we are root.
    base = Path(tempfile.mkdtemp(prefix=prefix))
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    run_as: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
        shutil.chown(sock, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    started = False
    try:
        subprocess.run(
            [*run_as, initdb, "-D", str(data), "-U", "postgres", "-A", "trust"],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                *run_as,
                pg_ctl,
                "-D",
                str(data),
                "-l",
                str(base / "log"),
                "-w",
                "-o",
                f"-c listen_addresses=127.0.0.1 -p {port} -k {sock}",
                "start",
            ],
            check=True,
            capture_output=True,
        )
        started = True
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            subprocess.run(
                [*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "stop"],
                capture_output=True,
            )
        shutil.rmtree(base, ignore_errors=True)
