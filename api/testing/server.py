"""A real dpsweep server for tests: ``dpsweep serve`` (uvicorn on loopback, with its scheduler
child and a local Ray) in a subprocess, on a free port, against a given database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from api.testing.postgres import free_port
from sweeper.store.engine import make_engine
from sweeper.store.tokens import create_token

DPSWEEP = str(Path(sys.executable).with_name("dpsweep"))


@dataclass
class Server:
    """A running ``dpsweep serve``: its process, address, database, log and tokens."""

    db_url: str
    base: str
    proc: subprocess.Popen[bytes]
    log: Path
    args: list[str]
    env: dict[str, str]
    tokens: dict[str, str] = field(default_factory=dict)

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        """An httpx client on this server, with ``token`` as its bearer token."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base, headers=headers, timeout=120.0, **kwargs)

    def token(self, name: str, *, admin: bool = False) -> str:
        """A token for ``name`` (created once per server)."""
        key = f"{name}:{admin}"
        if key not in self.tokens:
            engine = make_engine(self.db_url)
            try:
                self.tokens[key], _ = create_token(engine, name=name, admin=admin)
            finally:
                engine.dispose()
        return self.tokens[key]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120.0) -> int:
        """Send ``sig`` and wait (killing it after ``timeout`` s); its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)

    def restart(self, *, ready_timeout: float = 180.0) -> Server:
        """Start the same server again (same port, database and settings)."""
        return _launch(self.db_url, self.args, self.env, self.log, self.base, ready_timeout)

    def logs(self) -> str:
        """What the server wrote so far (stdout and stderr)."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _launch(
    db_url: str,
    args: list[str],
    env: dict[str, str],
    log: Path,
    base: str,
    ready_timeout: float,
    wait_ready: bool = True,
) -> Server:
    out = log.open("ab")
    proc = subprocess.Popen([DPSWEEP, *args], env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Server(db_url, base, proc, log, args, env)
    deadline = time.monotonic() + ready_timeout
    path = "/ready" if wait_ready else "/health"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"dpsweep serve exited with {proc.returncode}:\n{server.logs()}")
        try:
            if httpx.get(base + path, timeout=2.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop(signal.SIGKILL)
            raise RuntimeError(f"dpsweep serve not ready after {ready_timeout} s:\n{server.logs()}")
        time.sleep(0.3)


def start_server(
    db_url: str,
    workdir: Path,
    *,
    workers: int = 2,
    scheduler: bool = True,
    auth: bool = True,
    env: dict[str, str] | None = None,
    ready_timeout: float = 180.0,
    api_workers: int = 1,
) -> Server:
    """Start ``dpsweep serve`` against ``db_url`` and wait until it is ready."""
    port = free_port()
    args = ["serve", "--port", str(port), "--db", db_url, "--workers", str(workers)]
    if api_workers > 1:
        args += ["--api-workers", str(api_workers)]
    if not scheduler:
        args.append("--no-scheduler")
    if not auth:
        args.append("--no-auth")
    full_env = {
        **{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DPSWEEP_RAY_ADDRESS")},
        "DPSWEEP_DATA_DIR": str(workdir / "data"),
        "DPSWEEP_POLL_SECONDS": "0.1",
        "DPSWEEP_HEARTBEAT_SECONDS": "0.5",
        "DPSWEEP_SSE_POLL_SECONDS": "0.1",
        "DPSWEEP_PLANNER_PROCESSES": "2",
        **(env or {}),
    }
    return _launch(
        db_url,
        args,
        full_env,
        workdir / f"server-{port}.log",
        f"http://127.0.0.1:{port}",
        ready_timeout,
        wait_ready=scheduler,
    )


# A sweep small enough to finish in seconds on two cores: 2 trials on digits with an MLP.
SMALL_SPEC = """\
name: api-small
dataset: {name: digits}
model: {name: mlp}
training: {epochs: 2, batch_size: 128, eval_every: 10}
privacy: {budgets: [2], delta: 1.0e-5, accounting: basic}
arms:
  - strategy: fixed
    grid: {lr: [0.3, 1.0], clip: [1.0]}
"""
