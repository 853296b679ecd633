"""Shared fixtures: a real, throwaway PostgreSQL server started by the tests themselves."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    hits = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return hits[-1] if hits else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server on 127.0.0.1 for this test session (initdb + pg_ctl, shared/ENV.md).

    PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user.
    """
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.fail(
            "PostgreSQL server binaries (initdb, pg_ctl) are missing; .ci/run installs "
            "them with apt-get install postgresql"
        )
    # Its own directory: pytest's temporary root is private to root, and the server must run
    # as another user when we are root.
    base = Path(tempfile.mkdtemp(prefix="dpsweep-pg-"))
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    prefix: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
        shutil.chown(sock, "postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    subprocess.run(
        [*prefix, initdb, "-D", str(data), "-U", "postgres", "-A", "trust"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *prefix,
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
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True
        )


def fresh_postgres_database(base_url: str, key: str) -> str:
    """A new, empty database on the session's PostgreSQL server; its URL."""
    import sqlalchemy as sa

    name = f"t{abs(hash(key)) % 10**8}"
    admin = sa.create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return base_url.rsplit("/", 1)[0] + f"/{name}"
