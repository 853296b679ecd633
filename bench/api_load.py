"""API read latency under concurrent clients, on SQLite and on PostgreSQL.

For each backend it creates a fresh database (SQLite: a temporary file; PostgreSQL: a
throwaway server started here with initdb + pg_ctl on 127.0.0.1, stopped at the end), loads a
*finished* sweep of ``--trials`` trials (default 2,000) straight through the store, starts a
real ``dpsweep serve`` on loopback (API only, no scheduler; ``api/testing/server.py``) and
measures, one endpoint at a time:

* ``GET /api/v1/sweeps/{id}/pareto`` (epsilon front of the objective),
* ``GET /api/v1/sweeps/{id}/trials?limit=100`` (first page, grid order),
* ``GET /api/v1/sweeps/{id}`` (the summary),

each with ``--clients`` concurrent clients (default 50; each one keep-alive connection,
released together) issuing ``--requests`` requests back to back (default 20), after
``--warmup`` untimed requests from one client (default 5). The clients are driven by one
asyncio loop that writes the requests and reads the responses itself (``--client raw``, the
default), because on a small machine the load generator shares the server's cores: one
thread and ``httpx.Client`` per client (``--client httpx``, the bench's first load
generator) costs 2-3 ms of CPU per request, about as much as the server's own work. Latency is the
wall time of one request, from sending it to having read the whole body. Per endpoint and
backend it reports p50, p99, mean and max latency, throughput (requests / wall time of the
phase), whether p99 meets the target (<= 100 ms at 50 clients on PostgreSQL; printed, not
asserted), the response size and, to tell service time from queueing:

* ``serial_ms``: the median of the warm-up requests after the first (one request at a time);
* ``cold_ms``: the first request (on the pareto endpoint, measured first, it includes building
  the server's cached summary of the sweep, which ``GET /sweeps/{id}`` then reads too);
* ``server_cpu_ms`` / ``client_cpu_ms``: CPU time per request of the API server (its
  process and its ``--api-workers`` worker processes, from ``/proc``; PostgreSQL's own
  processes are not counted) and of this process.

Any non-200 response makes the script exit 1.

The sweep is ``bench/finished_sweep.py``'s: a real one, planned and stored by the store's own
functions, then finished in bulk as the runner would have left it.

The clients run in this process, on the same machine as the server: on a 2-core VM they take
CPU from the server (``client_cpu_ms``), so latencies are somewhat worse than the server alone
would give. Small ``--trials`` plan slower than large ones (each grid's few trials get little
noise, which the PLD accountant handles slowly): loading 200 trials takes ~2 s, planning
included, and 40 take ~4 s.

Usage: ``python bench/api_load.py [--json] [--trials N] [--clients C] [--requests R]
[--warmup W] [--backends sqlite,postgresql] [--api-workers K] [--client raw|httpx]``. The
full bench (defaults, both backends) takes a few minutes on a 2-core VM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from api_load_raw import RequestFailed, measure_raw, server_cpu_seconds  # noqa: E402
from finished_sweep import OWNER, load_finished_sweep, sweep_spec  # noqa: E402

from api.testing.postgres import PostgresMissing, throwaway_postgres  # noqa: E402
from api.testing.server import start_server  # noqa: E402
from dpsweep.spec import load_spec  # noqa: E402
from sweeper.store.schema import upgrade  # noqa: E402

TARGET_P99_MS = 100.0
TARGET_BACKEND = "postgresql"
BACKENDS = ("sqlite", "postgresql")
ENDPOINTS = {
    "GET /sweeps/{id}/pareto": "/api/v1/sweeps/{id}/pareto",
    "GET /sweeps/{id}/trials?limit=100": "/api/v1/sweeps/{id}/trials?limit=100",
    "GET /sweeps/{id}": "/api/v1/sweeps/{id}",
}


# ---------------------------------------------------------------------------------------------
# Databases


@contextlib.contextmanager
def sqlite_database() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="dpsweep-bench-sqlite-") as tmp:
        yield f"sqlite:///{tmp}/bench.db"


def postgres_database() -> contextlib.AbstractContextManager[str]:
    """A throwaway PostgreSQL server on 127.0.0.1 (:mod:`api.testing.postgres`, as in the tests)."""
    return throwaway_postgres(prefix="dpsweep-bench-pg-")


DATABASES = {"sqlite": sqlite_database, "postgresql": postgres_database}


# ---------------------------------------------------------------------------------------------
# Load


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values``, interpolated linearly between ranks."""
    s = sorted(values)
    if not s:
        return math.nan
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _check(path: str, r: httpx.Response) -> None:
    if r.status_code != 200:
        raise RequestFailed(f"GET {path}: HTTP {r.status_code}: {r.text[:500]}")


def _sanity(name: str, body: Any, trials: int) -> None:
    """The API sees the sweep as finished, with every trial done."""
    if name == "GET /sweeps/{id}":
        ok = body["state"] == "done" and body["trials"]["done"] == trials
    elif name == "GET /sweeps/{id}/pareto":
        ok = bool(body["points"])
    else:
        ok = len(body["items"]) == min(100, trials) and body["items"][0]["state"] == "done"
    if not ok:
        raise RequestFailed(f"{name}: unexpected body {json.dumps(body)[:500]}")


def measure(
    base: str,
    token: str,
    path: str,
    *,
    clients: int,
    requests: int,
) -> tuple[list[float], float, int]:
    """``clients`` threads, each with its own keep-alive client, issue ``requests`` requests
    back to back, starting together. Returns (latencies in ms, wall seconds, errors)."""
    headers = {"Authorization": f"Bearer {token}"}
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    failures: list[str] = []
    ready = threading.Barrier(clients + 1)
    go = threading.Event()

    def client(i: int) -> None:
        with httpx.Client(base_url=base, headers=headers, timeout=120.0) as c:
            # Open the connection before the clock starts.
            c.get("/health")
            ready.wait()
            go.wait()
            out = latencies[i]
            for _ in range(requests):
                t0 = time.perf_counter()
                try:
                    r = c.get(path)
                    ok = r.status_code == 200
                except httpx.HTTPError as exc:
                    ok, r = False, None
                    failures.append(f"{type(exc).__name__}: {exc}")
                out.append((time.perf_counter() - t0) * 1000.0)
                if not ok:
                    errors[i] += 1
                    if r is not None and len(failures) < 5:
                        failures.append(f"HTTP {r.status_code}: {r.text[:300]}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    t0 = time.perf_counter()
    go.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if failures:
        print(f"  {path}: {sum(errors)} failed request(s), e.g. {failures[0]}", file=sys.stderr)
    return [x for lat in latencies for x in lat], wall, sum(errors)


def settle(url: str) -> None:
    """On PostgreSQL, VACUUM ANALYZE after the bulk load, as autovacuum soon would: the bulk
    UPDATE of every trial left dead rows, and the planner has no statistics yet."""
    if not url.startswith("postgresql"):
        return
    from sqlalchemy import create_engine, text

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as c:
            c.execute(text("VACUUM ANALYZE"))
    finally:
        engine.dispose()


def bench_endpoint(
    base: str,
    token: str,
    name: str,
    path: str,
    args: argparse.Namespace,
    server_pid: int | None,
    trials: int,
) -> dict[str, Any]:
    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120.0
    ) as c:
        serial = []
        for _ in range(max(1, args.warmup)):
            t0 = time.perf_counter()
            r = c.get(path)
            serial.append((time.perf_counter() - t0) * 1000.0)
            _check(path, r)
        _sanity(name, r.json(), trials)
        size = len(r.content)
    load = measure_raw if args.client == "raw" else measure
    server_cpu0, client_cpu0 = server_cpu_seconds(server_pid), time.process_time()
    lat, wall, errors = load(base, token, path, clients=args.clients, requests=args.requests)
    server_cpu1, client_cpu1 = server_cpu_seconds(server_pid), time.process_time()
    p99 = percentile(lat, 0.99)
    return {
        "p50_ms": percentile(lat, 0.50),
        "p99_ms": p99,
        "mean_ms": sum(lat) / len(lat),
        "max_ms": max(lat),
        "rps": len(lat) / wall,
        "n": len(lat),
        "errors": errors,
        "meets_target": p99 <= TARGET_P99_MS,
        # The first request to the endpoint, and the median of the other warm-up requests
        # (one client, one request at a time: the service time without queueing).
        "cold_ms": serial[0],
        "serial_ms": percentile(serial[1:] or serial, 0.5),
        "bytes": size,
        # CPU per request of the API server process and of this (the clients') process.
        "server_cpu_ms": (
            None
            if server_cpu0 is None or server_cpu1 is None
            else (server_cpu1 - server_cpu0) * 1000.0 / len(lat)
        ),
        "client_cpu_ms": (client_cpu1 - client_cpu0) * 1000.0 / len(lat),
    }


def bench_backend(backend: str, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    with DATABASES[backend]() as url:
        upgrade(url)
        loaded = load_finished_sweep(url, args.trials)
        settle(url)
        log(f"{backend}: loaded {loaded.trials} finished trials in {loaded.seconds:.1f} s")
        with tempfile.TemporaryDirectory(prefix="dpsweep-bench-srv-") as tmp:
            server = start_server(url, Path(tmp), scheduler=False, api_workers=args.api_workers)
            try:
                token = server.token(OWNER)
                out: dict[str, Any] = {}
                for name, template in ENDPOINTS.items():
                    path = template.format(id=loaded.id)
                    row = bench_endpoint(
                        server.base,
                        token,
                        name,
                        path,
                        args,
                        server.proc.pid,
                        loaded.trials,
                    )
                    out[name] = row
                    log(
                        f"{backend}: {name}: p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} "
                        f"ms, {row['rps']:.0f} req/s"
                    )
                out["_sweep"] = {"id": loaded.id, "load_s": loaded.seconds, **loaded.rows}
                return out
            finally:
                server.stop()


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def table(result: dict[str, Any]) -> str:
    lines = [
        f"API read latency: a finished sweep of {result['trials']} trials, "
        f"{result['clients']} concurrent clients x {result['requests_per_client']} requests "
        f"per endpoint, loopback, {result['cpus']} CPU(s)",
        f"target: p99 <= {TARGET_P99_MS:g} ms at 50 clients on PostgreSQL "
        "(other backends shown in parentheses)",
        "",
        f"{'backend':<11} {'endpoint':<34} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'mean ms':>8} {'max ms':>8} {'req/s':>7} {'1-client':>8} {'srv cpu':>8} {'KiB':>7}"
        "  target",
    ]
    for backend in result["backends"]:
        rows = result[backend]
        if "skipped" in rows:
            lines.append(f"{backend:<11} skipped: {rows['skipped']}")
            continue
        for name in ENDPOINTS:
            r = rows[name]
            verdict = "ok" if r["meets_target"] else "MISS"
            if backend != TARGET_BACKEND:
                verdict = f"({verdict.lower()})"
            lines.append(
                f"{backend:<11} {name:<34} {r['n']:>6} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
                f"{r['mean_ms']:>8.1f} {r['max_ms']:>8.1f} {r['rps']:>7.0f} "
                f"{r['serial_ms']:>8.1f} {_ms(r['server_cpu_ms']):>8} {r['bytes'] / 1024:>7.1f}"
                f"  {verdict}"
            )
    lines += [
        "",
        "1-client: median latency with one client, one request at a time (no queueing); srv cpu:",
        "CPU ms of the API server process per request under load (PostgreSQL's own not counted).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trials", type=int, default=2000, help="trials of the sweep (default 2000)")
    p.add_argument("--clients", type=int, default=50, help="concurrent clients (default 50)")
    p.add_argument("--requests", type=int, default=20, help="requests per client (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed requests first (default 5)")
    p.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated: sqlite, postgresql (default both)",
    )
    p.add_argument(
        "--api-workers",
        type=int,
        default=1,
        help="API server processes (dpsweep serve --api-workers; default 1)",
    )
    p.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="load generator: raw (asyncio keep-alive sockets, cheap; default) or httpx (one "
        "thread and httpx.Client per client, as before: costs the shared cores ~2-3 ms of "
        "CPU per request)",
    )
    args = p.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - set(BACKENDS)
    if unknown or not backends:
        p.error(f"unknown backend(s) {sorted(unknown)}; choose from {', '.join(BACKENDS)}")
    if min(args.trials, args.clients, args.requests) < 1:
        p.error("--trials, --clients and --requests must be >= 1")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    result: dict[str, Any] = {
        "trials": load_spec(sweep_spec(args.trials)).planned_trials(),
        "clients": args.clients,
        "api_workers": args.api_workers,
        "client": args.client,
        "requests_per_client": args.requests,
        "target_p99_ms": TARGET_P99_MS,
        "target_backend": TARGET_BACKEND,
        "cpus": os.cpu_count(),
        "backends": backends,
    }
    failed = False
    for backend in backends:
        try:
            rows = bench_backend(backend, args, log)
        except RequestFailed as exc:
            log(f"{backend}: {exc}")
            result[backend] = {"skipped": f"failed: {exc}"}
            failed = True
            continue
        except PostgresMissing as exc:
            log(f"{backend}: skipped: {exc}")
            result[backend] = {"skipped": str(exc)}
            continue
        sweep = rows.pop("_sweep")
        result["trials"] = sweep["trials"]
        result[backend] = rows
        result.setdefault("sweeps", {})[backend] = sweep
        failed = failed or any(r["errors"] for r in rows.values())
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
