"""The API load benchmark's low-level probes: a server's CPU time from ``/proc``, and requests
driven over raw keep-alive sockets by one asyncio loop (:func:`measure_raw`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

import httpx


class RequestFailed(RuntimeError):
    pass


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process so far (Linux ``/proc``; None elsewhere)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    out: list[int] = []
    for task in tasks:
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def server_cpu_seconds(pid: int | None) -> float | None:
    """CPU time so far of the API server: the process and, with ``--api-workers`` > 1, its
    worker processes (uvicorn's supervisor forks them)."""
    total = _cpu_seconds(pid)
    if pid is None or total is None:
        return total
    for child in _children(pid):
        total += _cpu_seconds(child) or 0.0
    return total


class _RawResponse:
    """Status and body of one HTTP/1.1 response read by :func:`_read_response`."""

    __slots__ = ("body", "status")

    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body


async def _read_response(reader: asyncio.StreamReader) -> _RawResponse:
    """One whole response (Content-Length or chunked body) from a keep-alive connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        return _RawResponse(status, await reader.readexactly(int(headers["content-length"])))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers are sent
                return _RawResponse(status, b"".join(parts))
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    raise RequestFailed(f"response without a length: {head[:300]!r}")


def measure_raw(
    base: str,
    token: str,
    path: str,
    *,
    clients: int,
    requests: int,
) -> tuple[list[float], float, int]:
    """:func:`measure` with ``clients`` keep-alive connections driven by one asyncio loop
    that writes each request and reads its whole response itself (no HTTP library), so that
    the load generator, which shares the machine's cores with the server, costs the server
    as little CPU as it can. Each client still sends its next request only after reading the
    previous response, and latency is still from sending to having read the whole body."""
    url = httpx.URL(base)
    host, port = url.host, url.port or 80
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        "Accept: */*\r\n\r\n"
    ).encode()
    health = f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    latencies: list[float] = []
    failures: list[str] = []

    async def run() -> float:
        conns = [await asyncio.open_connection(host, port) for _ in range(clients)]
        try:
            # Open every connection before the clock starts.
            for reader, writer in conns:
                writer.write(health)
                await _read_response(reader)
            go = asyncio.Event()

            async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await go.wait()
                for _ in range(requests):
                    t0 = time.perf_counter()
                    writer.write(request)
                    r = await _read_response(reader)
                    latencies.append((time.perf_counter() - t0) * 1000.0)
                    if r.status != 200:
                        failures.append(f"HTTP {r.status}: {r.body[:300]!r}")

            tasks = [asyncio.create_task(client(r, w)) for r, w in conns]
            await asyncio.sleep(0)
            t0 = time.perf_counter()
            go.set()
            await asyncio.gather(*tasks)
            return time.perf_counter() - t0
        finally:
            for _, writer in conns:
                writer.close()

    wall = asyncio.run(run())
    if failures:
        print(f"  {path}: {len(failures)} failed request(s), e.g. {failures[0]}", file=sys.stderr)
    return latencies, wall, len(failures)
