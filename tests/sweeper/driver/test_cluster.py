"""A real two-node Ray cluster on loopback, with PostgreSQL: trials land on both nodes, and
losing a node mid-sweep is handled by the crash policy with every charge intact.

The test starts a head (``ray start --head``) and a second node (``ray start --address``),
each in its own session with its own resource label, and points ``dpsweep run`` at the
cluster (``DPSWEEP_RAY_ADDRESS``). It kills only the processes it started: each node's whole
session.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.testing.postgres import free_port
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.rows import EntryKind
from sweeper.store import Sweep, SweepState, Trial, TrialState
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from tests.conftest import fresh_postgres_database

pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).with_name("ray"))
DPSWEEP = str(Path(sys.executable).with_name("dpsweep"))
# Multi-node on one host: Ray needs this (docs/environment.md); auth off on both sides of a loopback
# cluster; node deaths detected within seconds instead of the default ~30 s.
RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
SPEC = """\
name: cluster-sweep
dataset: {name: digits}
model: {name: mlp}
training: {epochs: 20, batch_size: 64, eval_every: 100}
privacy: {budgets: [40], delta: 1.0e-5, accounting: basic, retries: 2}
arms:
  - strategy: fixed
    grid: {lr: [0.1, 0.3, 1.0], clip: [0.5, 2.0]}
seeds: 2
"""


def _env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "DPSWEEP_"))}
    return {**base, **RAY_ENV}


def _kill_session(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal every process of ``proc``'s session (a node's raylet, its workers, ...)."""
    ps = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
    for line in ps.splitlines():
        pid, sid = line.split()
        if int(sid) == proc.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), sig)


def _nodes(address: str) -> list[dict[str, Any]]:
    code = (
        "import json, ray\n"
        f"ray.init(address={address!r}, logging_level='ERROR')\n"
        "print(json.dumps([{'id': n['NodeID'], 'alive': n['Alive'], "
        "'resources': n['Resources']} for n in ray.nodes()]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120
    )
    if out.returncode != 0:
        return []
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.second: subprocess.Popen[bytes] | None = None
        self.ray_tmp = tempfile.mkdtemp(prefix="dpsray-", dir="/tmp")

    def _start(self, args: list[str], log: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [
                RAY,
                "start",
                *args,
                "--node-ip-address=127.0.0.1",
                "--num-cpus=1",
                "--block",
                "--object-store-memory=100000000",
            ],
            env=_env(),
            stdout=(self.tmp / log).open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its session id is its pid: all of the node, ours alone
        )
        self.procs.append(proc)
        return proc

    def up(self) -> dict[str, str]:
        self._start(
            [
                "--head",
                f"--port={self.port}",
                "--include-dashboard=false",
                # Short: Ray's socket paths under it must fit in 107 bytes.
                f"--temp-dir={self.ray_tmp}",
                '--resources={"head_node": 1}',
            ],
            "head.log",
        )
        self._wait(1)
        self.second = self._start(
            [f"--address={self.address}", '--resources={"second_node": 1}'], "second.log"
        )
        nodes = self._wait(2)
        return {
            ("second" if "second_node" in n["resources"] else "head"): n["id"][:12] for n in nodes
        }

    def _wait(self, alive: int, timeout: float = 120) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            nodes = [n for n in _nodes(self.address) if n["alive"]]
            if len(nodes) >= alive:
                return nodes
            time.sleep(1)
        logs = "".join((self.tmp / f).read_text(errors="replace")[-2000:] for f in ("head.log",))
        raise AssertionError(f"the Ray cluster did not reach {alive} node(s):\n{logs}")

    def kill_second(self) -> None:
        assert self.second is not None
        _kill_session(self.second, signal.SIGKILL)
        self.second.wait(timeout=30)

    def down(self) -> None:
        for proc in reversed(self.procs):
            _kill_session(proc, signal.SIGTERM)
        # The head's `ray start --block` outlives a SIGTERM (it was still there after 20 s,
        # every run); a short grace, then its whole session is killed and the temp dir removed.
        deadline = time.monotonic() + 3
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            _kill_session(proc, signal.SIGKILL)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.down()


def _aware(dt: datetime) -> datetime:
    # SQLite hands back naive datetimes for timezone-aware columns; PostgreSQL aware ones.
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


def _trials(url: str) -> list[Trial]:
    engine = make_engine(url)
    try:
        with Session(engine) as s:
            return list(s.scalars(select(Trial)))
    finally:
        engine.dispose()


def test_a_sweep_runs_on_two_nodes_and_survives_losing_one(
    cluster: Cluster, postgres_url: str, tmp_path: Path
) -> None:
    node = cluster.up()
    assert set(node) == {"head", "second"}
    url = fresh_postgres_database(postgres_url, str(tmp_path))
    upgrade(url)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    env = {
        **_env(),
        "DPSWEEP_RAY_ADDRESS": cluster.address,
        "DPSWEEP_MAX_PACK_SIZE": "1",
        "DPSWEEP_POLL_SECONDS": "0.1",
    }
    log = (tmp_path / "run.log").open("wb")
    run = subprocess.Popen(
        [DPSWEEP, "run", str(spec), "--db", url, "--workers", "2", "--quiet"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        # Wait until both nodes have run trials and one is running on the second node.
        deadline = time.monotonic() + 300
        while True:
            trials = _trials(url)
            on = {
                n: [t for t in trials if t.worker and t.worker.endswith("@" + node[n])]
                for n in node
            }
            # A trial that has just started on the second node (most of its run still ahead),
            # so that the kill lands while it runs.
            now = datetime.now(UTC)
            running_there = [
                t
                for t in on["second"]
                if t.state == TrialState.running
                and t.started_at is not None
                and (now - _aware(t.started_at)).total_seconds() < 0.5
            ]
            if (
                on["head"]
                and running_there
                and any(t.state == TrialState.done for t in on["second"])
            ):
                break
            assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "trials never ran on both nodes"
            time.sleep(0.2)
        lost = {t.id for t in running_there}
        cluster.kill_second()
        assert run.wait(timeout=600) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        log.close()

    engine = make_engine(url)
    try:
        with Session(engine) as s:
            sweep = s.scalars(select(Sweep)).one()
            trials = list(s.scalars(select(Trial)))
        assert sweep.state == SweepState.done, sweep.error
        assert len(trials) == 12 and all(t.state == TrialState.done for t in trials)
        # The lost trial ran again (on the head) as a new, charged run; nothing else re-ran.
        rerun = {t.id for t in trials if t.attempts == 2}
        assert rerun and rerun <= lost, (rerun, lost)
        for t in trials:
            if t.id in rerun:
                assert t.worker and t.worker.endswith("@" + node["head"])
        assert all(t.attempts in (1, 2) for t in trials)
        lost = rerun
        assert sum(t.attempts for t in trials) == 12 + len(lost)

        # Charges intact: one per attempt, each trial's as many as its attempts; the grid's
        # unused retry runs went back; nothing is left reserved.
        ledger = BudgetLedger(engine)
        entries = ledger.entries(sweep.ledger_key or sweep.dataset, sweep.id)
        charges = [e for e in entries if e.kind == EntryKind.CHARGE]
        assert len(charges) == 12 + len(lost)
        per_trial: dict[str, int] = {}
        for e in charges:
            per_trial[e.trial_id] = per_trial.get(e.trial_id, 0) + 1  # type: ignore[index]
        assert all(per_trial[t.id] == t.attempts for t in trials)
        balance = ledger.sweep_balance(sweep.ledger_key or sweep.dataset, sweep_id=sweep.id)
        assert balance.epsilon_outstanding == Decimal(0)
        spent = balance.epsilon_charged + balance.epsilon_released
        assert abs(spent - balance.epsilon_reserved) < Decimal("1e-9")
        # basic accounting: the reservation is 12 + 2 (retries) equal runs; each attempt is
        # charged one of them, and the two that were not needed went back.
        per_run = balance.epsilon_reserved / 14
        assert abs(balance.epsilon_charged - per_run * len(charges)) < Decimal("1e-9")
        assert abs(balance.epsilon_released - per_run * (14 - len(charges))) < Decimal("1e-9")
    finally:
        engine.dispose()
