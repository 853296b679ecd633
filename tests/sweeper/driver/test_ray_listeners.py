"""A local Ray, and ``dpsweep serve`` with its scheduler and local Ray, listen on loopback only.

docs/sweeps.md promises "127.0.0.1 only": nothing that dpsweep starts on its own may accept
connections from another host. Every listening TCP socket of the process tree (the driver,
Ray's GCS, raylet, agents and workers; the API server and its scheduler) is read from
``/proc`` and must be bound to 127.0.0.1 or ::1, never to 0.0.0.0, ``::`` or one of the host's
addresses.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from api.testing.server import start_server
from sweeper.store.schema import upgrade

pytestmark = pytest.mark.skipif(
    not Path("/proc/net/tcp").exists(), reason="reads listening sockets from Linux's /proc"
)


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket: its address, port, and the process holding it."""

    ip: str
    port: int
    pid: int
    process: str

    def __str__(self) -> str:
        return f"{self.process} (pid {self.pid}) on {self.ip}:{self.port}"


def _children() -> dict[int, list[int]]:
    """Every process's children, from each ``/proc/<pid>/stat``'s parent id."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # The command name in parentheses may hold spaces: the parent id follows its ")".
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry))
    return out


def _tree(root: int) -> list[int]:
    """``root`` and all its descendants."""
    children = _children()
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def _process_name(pid: int) -> str:
    """A short name for ``pid``: Ray's workers and agents rename themselves (``ray::IDLE``),
    the GCS and raylet are binaries (their file name), and a Python program is named by its
    script or ``-m`` module (``dpsweep``, ``sweeper.driver.scheduler``)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    if not argv:
        return "?"
    first = argv[0].rsplit("/", 1)[-1] if argv[0].startswith("/") else argv[0].split(" ")[0]
    if first.startswith("python") and len(argv) > 1:
        rest = argv[2] if argv[1] == "-m" and len(argv) > 2 else argv[1]
        return f"{first} {rest.rsplit('/', 1)[-1]}"
    return first


def _decode(hex_ip: str, family: int) -> str:
    """The text form of an address as ``/proc/net/tcp{,6}`` writes it (32-bit words in host
    byte order)."""
    words = [int(hex_ip[i : i + 8], 16) for i in range(0, len(hex_ip), 8)]
    return socket.inet_ntop(family, b"".join(struct.pack("=I", w) for w in words))


def listeners(root: int) -> list[Listener]:
    """The listening TCP sockets held by ``root`` and its descendants.

    ``/proc/net/tcp{,6}`` lists the sockets of this network namespace with their inodes; a
    process's ``/proc/<pid>/fd`` links name the inodes it holds (readable for our own
    processes).
    """
    owner: dict[str, int] = {}
    for pid in _tree(root):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owner.setdefault(target[len("socket:[") : -1], pid)
    out = []
    for family, table in ((socket.AF_INET, "/proc/net/tcp"), (socket.AF_INET6, "/proc/net/tcp6")):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:  # no IPv6 in this kernel
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in owner:  # 0A: TCP_LISTEN
                continue
            hex_ip, hex_port = local.split(":")
            pid = owner[inode]
            ip = _decode(hex_ip, family)
            out.append(Listener(ip, int(hex_port, 16), pid, _process_name(pid)))
    return sorted(out, key=lambda x: (x.process, x.port))


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def _assert_loopback_only(found: list[Listener], *, expect: tuple[str, ...]) -> None:
    """Every listener is on loopback; the scan saw each process kind in ``expect`` (else it
    would pass by seeing nothing)."""
    shown = "\n".join(f"  {x}" for x in found)
    for kind in expect:
        assert any(kind in x.process for x in found), f"no listener of {kind!r} seen:\n{shown}"
    exposed = [str(x) for x in found if not _loopback(x.ip)]
    assert not exposed, "listening beyond loopback:\n" + "\n".join(exposed) + f"\nall:\n{shown}"


def _settle(root: int, *, expect: tuple[str, ...], timeout: float) -> list[Listener]:
    """The listeners of ``root``'s tree once each kind in ``expect`` has one and the set has
    stopped growing for a moment (Ray's agents and prestarted workers come up after the
    driver's ``ray.init`` returns)."""
    deadline = time.monotonic() + timeout
    last: set[Listener] = set()
    stable_since = time.monotonic()
    while True:
        found = listeners(root)
        now = time.monotonic()
        if set(found) != last:
            last, stable_since = set(found), now
        seen_all = all(any(k in x.process for x in found) for k in expect)
        if (seen_all and now - stable_since >= 3.0) or now > deadline:
            return found
        time.sleep(0.5)


# The driver side exactly as dpsweep starts it (sweeper.driver.ray_backend.ray_session), in a
# fresh interpreter: what Ray reads at import must be what a `dpsweep run` or scheduler sees,
# not whatever this pytest process imported or initialised before.
_DRIVER = textwrap.dedent(
    """
    import sys

    from sweeper.driver.ray_backend import ray_session
    from sweeper.settings import SweeperSettings

    with ray_session(SweeperSettings(), workers=1):
        import ray

        # One task, so a worker process has certainly started and opened its own server.
        assert ray.get(ray.remote(lambda: 1).remote()) == 1
        print("ready", flush=True)
        sys.stdin.readline()
    """
)

# The same, with Ray started in the background while `dpsweep run` plans (EarlyRay): the start
# runs in a thread that must outlive it (Ray's processes die with the thread that spawned them),
# ray_session uses that Ray without shutting it down, and close() does.
_EARLY_DRIVER = textwrap.dedent(
    """
    import sys

    import ray

    from sweeper.driver.ray_backend import EarlyRay, ray_session
    from sweeper.settings import SweeperSettings

    early = EarlyRay(SweeperSettings(), workers=1)
    early.ready()
    with ray_session(SweeperSettings(), workers=1):
        assert ray.get(ray.remote(lambda: 1).remote()) == 1
        print("ready", flush=True)
        sys.stdin.readline()
    assert ray.is_initialized(), "ray_session shut down a Ray it did not start"
    early.close()
    assert not ray.is_initialized()
    print("closed", flush=True)
    """
)

# Ray's own processes that must be seen listening (names as /proc/<pid>/cmdline shows them).
_RAY = ("gcs_server", "raylet", "ray::")


def _clean_env() -> dict[str, str]:
    """This environment less any Ray cluster address: the local-Ray path is under test."""
    drop = ("RAY_ADDRESS", "DPSWEEP_RAY_ADDRESS")
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.mark.parametrize("driver_code", [_DRIVER, _EARLY_DRIVER], ids=["session", "early"])
def test_local_ray_listens_on_loopback_only(driver_code: str) -> None:
    driver = subprocess.Popen(
        [sys.executable, "-c", driver_code],
        cwd=Path(__file__).resolve().parents[3],
        env=_clean_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None and driver.stdin is not None
        line = driver.stdout.readline()
        assert line.strip() == "ready", f"the driver did not start Ray (exit {driver.poll()})"
        found = _settle(driver.pid, expect=_RAY, timeout=30.0)
        _assert_loopback_only(found, expect=_RAY)
        driver.stdin.write("\n")
        driver.stdin.flush()
        rest = driver.stdout.read()
        assert driver.wait(timeout=60) == 0
        if driver_code is _EARLY_DRIVER:
            assert rest.strip() == "closed"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


@pytest.mark.slow  # `dpsweep serve` with its scheduler's local Ray: about 30 s on two cores
def test_serve_listens_on_loopback_only(tmp_path: Path) -> None:
    """The API server (uvicorn), its scheduler child and the scheduler's local Ray."""
    url = f"sqlite:///{tmp_path / 'serve.db'}"
    upgrade(url)
    server = start_server(url, tmp_path, workers=1, env=_clean_env())
    try:
        # The API's own port belongs to the `dpsweep` process (uvicorn in the parent).
        expect = ("dpsweep", *_RAY)
        found = _settle(server.proc.pid, expect=expect, timeout=60.0)
        _assert_loopback_only(found, expect=expect)
        port = int(server.base.rsplit(":", 1)[1])
        assert any(x.port == port and "dpsweep" in x.process for x in found), found
    finally:
        server.stop()


def test_early_ray_reports_a_failed_start() -> None:
    """A Ray that could not start is the caller's error when it asks for Ray (ready), not a
    silent thread's: here the object store is smaller than Ray's minimum."""
    code = textwrap.dedent(
        """
        from sweeper.driver.ray_backend import EarlyRay
        from sweeper.settings import SweeperSettings

        early = EarlyRay(SweeperSettings(ray_object_store_mb=64), workers=1)
        try:
            early.ready()
        except Exception as exc:
            print("refused", type(exc).__name__)
        else:
            print("started")
        early.close()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[3],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.split()[:1] == ["refused"], out.stdout + out.stderr
