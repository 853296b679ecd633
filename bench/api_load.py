"""API read latency under concurrent clients, on SQLite and on PostgreSQL.

For each backend it creates a fresh database (SQLite: a temporary file; PostgreSQL: a
throwaway server started here with initdb + pg_ctl on 127.0.0.1, stopped at the end), loads a
*finished* sweep of ``--trials`` trials (default 2,000) straight through the store, starts a
real ``dpsweep serve`` on loopback (API only, no scheduler; ``api/testing/server.py``) and
measures, one endpoint at a time:

* ``GET /api/v1/sweeps/{id}/pareto`` (epsilon front of the objective),
* ``GET /api/v1/sweeps/{id}/trials?limit=100`` (first page, grid order),
* ``GET /api/v1/sweeps/{id}`` (the summary),

each with ``--clients`` concurrent clients (default 50; one thread and one keep-alive
``httpx.Client`` each, released together) issuing ``--requests`` requests back to back
(default 20), after ``--warmup`` untimed requests from one client (default 5). Latency is the
wall time of one request, from sending it to having read the whole body. Per endpoint and
backend it reports p50, p99, mean and max latency, throughput (requests / wall time of the
phase), whether p99 meets the target (<= 100 ms at 50 clients on PostgreSQL; printed, not
asserted), the response size and, to tell service time from queueing:

* ``serial_ms``: the median of the warm-up requests after the first (one request at a time);
* ``cold_ms``: the first request (on the pareto endpoint, measured first, it includes building
  the server's cached summary of the sweep, which ``GET /sweeps/{id}`` then reads too);
* ``server_cpu_ms`` / ``client_cpu_ms``: CPU time per request of the API server process
  (from ``/proc``; PostgreSQL's own processes are not counted) and of this process.

Any non-200 response makes the script exit 1.

The sweep is a real one: :func:`sweeper.sweeps.create_sweep` plans and stores it (digits, mlp,
4 arms x 5 epsilon levels, ``accounting: basic``, grids sized so that the total is
``--trials``, rounded up to a multiple of the number of levels), then it is finished in bulk
in one transaction, as the runner would have left it: every trial ``done`` with start/finish
times, a result row (best-checkpoint and final accuracy/loss/ece/mce, epsilon, delta, steps,
best step, 15 reliability bins, trajectories), a metric point per metric and evaluation
(3 evaluations x 4 metrics), the runner's events (sweep running, each trial's running,
metric and done events, sweep done), one ledger charge per trial (the grid's next run in its
stored charge schedule; written in bulk with the dataset's totals moved from reserved to
spent exactly as ``BudgetLedger.charge`` does, because charging 2,000 trials one by one
through the ledger takes ~20 s on SQLite: each charge re-reads all of the sweep's entries),
then the sweep's release through the ledger and the sweep set ``done``. On PostgreSQL the
database is then ``VACUUM ANALYZE``d, as autovacuum soon would be after such a load.

The clients run in this process, on the same machine as the server: on a 2-core VM they take
CPU from the server (``client_cpu_ms``), so latencies are somewhat worse than the server alone
would give. Small ``--trials`` plan slower than large ones (each grid's few trials get little
noise, which the PLD accountant handles slowly): 200 trials take ~4 s to plan, 40 take ~12 s.

Usage: ``python bench/api_load.py [--json] [--trials N] [--clients C] [--requests R]
[--warmup W] [--backends sqlite,postgresql]``. The full bench (defaults, both backends) takes
a few minutes on a 2-core VM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from sqlalchemy import insert, select, update  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from api.testing.postgres import PostgresMissing, throwaway_postgres  # noqa: E402
from api.testing.server import start_server  # noqa: E402
from sweeper import db, events  # noqa: E402
from sweeper.charges import EXACT, exact_sum  # noqa: E402
from sweeper.ledger import BudgetLedger, DatasetBudget, EntryKind, LedgerEntry  # noqa: E402
from sweeper.spec import load_spec  # noqa: E402
from sweeper.store import (  # noqa: E402
    MetricPoint,
    Sweep,
    SweepEvent,
    SweepState,
    Trial,
    TrialResultRow,
    TrialState,
)
from sweeper.sweeps import create_sweep, grid_key, schedules  # noqa: E402

TARGET_P99_MS = 100.0
TARGET_BACKEND = "postgresql"
BACKENDS = ("sqlite", "postgresql")
OWNER = "bench"
ENDPOINTS = {
    "GET /sweeps/{id}/pareto": "/api/v1/sweeps/{id}/pareto",
    "GET /sweeps/{id}/trials?limit=100": "/api/v1/sweeps/{id}/trials?limit=100",
    "GET /sweeps/{id}": "/api/v1/sweeps/{id}",
}
LEVELS = [1.0, 2.0, 4.0, 8.0, 16.0]
# (strategy, second grid axis, its values, fixed params): four arms, as in a real comparison.
ARMS: list[tuple[str, str, list[float], dict[str, Any]]] = [
    ("fixed", "clip", [0.25, 0.5, 1.0, 2.0, 4.0], {}),
    # sigma_b must stay above sigma / 2, and sigma is large at epsilon 1 over 100 trials.
    ("quantile", "target_quantile", [0.1, 0.3, 0.5, 0.7, 0.9], {"count_noise": 2000.0}),
    ("automatic", "clip", [0.25, 0.5, 1.0, 2.0, 4.0], {}),
    ("online", "clip_init", [0.05, 0.1, 0.2, 0.5, 1.0], {}),
]
METRICS = ("accuracy", "loss", "ece", "mce")
N_BINS = 15
TEST_EXAMPLES = 360  # digits' 20% evaluation split


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
# A finished sweep


def sweep_spec(trials: int) -> dict[str, Any]:
    """A spec of about ``trials`` trials: 4 arms x 5 levels, rounded up to a multiple of 5."""
    levels = LEVELS[: max(1, min(len(LEVELS), trials))]
    per_level = math.ceil(trials / len(levels))
    arms = []
    for i, (strategy, axis, values, params) in enumerate(ARMS):
        k = per_level // len(ARMS) + (i < per_level % len(ARMS))
        if k == 0:
            continue
        second = values if k % len(values) == 0 and k >= 2 * len(values) else [values[2]]
        grid = {
            "lr": {"logspace": [-2.0, 0.5], "k": k // len(second)},
            axis: second,
        }
        arms.append({"strategy": strategy, "grid": grid, "params": params})
    return {
        "name": f"api-load-{trials}",
        "dataset": {"name": "digits"},
        "model": {"name": "mlp"},
        "training": {"epochs": 2, "batch_size": 128, "eval_every": 10},
        "privacy": {
            "budgets": levels,
            "delta": 1e-5,
            "accounting": "basic",
            "max_noise_multiplier": 1000.0,
        },
        "arms": arms,
        "objective": {"metric": "accuracy", "mode": "max"},
    }


def _eval_steps(steps: int, every: int) -> list[int]:
    out = list(range(every, steps + 1, every))
    return out if out and out[-1] == steps else [*out, steps]


def _fake_eval(rng: random.Random, quality: float) -> dict[str, Any]:
    """Plausible metrics and reliability bins for a model of accuracy about ``quality``."""
    acc = min(0.99, max(0.05, quality + rng.gauss(0, 0.02)))
    counts = [0] * N_BINS
    for _ in range(TEST_EXAMPLES):
        conf = min(0.999, max(0.1, rng.gauss(acc, 0.15)))
        counts[min(N_BINS - 1, int(conf * N_BINS))] += 1
    bins = []
    for m, cnt in enumerate(counts):
        mid = (m + 0.5) / N_BINS
        bins.append(
            {
                "lower": m / N_BINS,
                "upper": (m + 1) / N_BINS,
                "count": cnt,
                "accuracy": min(1.0, max(0.0, mid + rng.gauss(0, 0.05))) if cnt else None,
                "confidence": mid if cnt else None,
            }
        )
    ece = abs(rng.gauss(0.06, 0.03))
    return {
        "accuracy": acc,
        "loss": max(0.02, -math.log(acc) * 1.1 + rng.gauss(0, 0.03)),
        "ece": ece,
        "mce": ece * (2.0 + rng.random() * 2.0),
        "reliability": bins,
    }


@dataclass
class LoadedSweep:
    id: str
    trials: int
    seconds: float
    rows: dict[str, int] = field(default_factory=dict)


def load_finished_sweep(url: str, trials: int, *, seed: int = 0) -> LoadedSweep:
    """Create a sweep of about ``trials`` trials through the store and finish it in bulk."""
    t0 = time.perf_counter()
    rng = random.Random(seed)
    engine = db.make_engine(url)
    try:
        sweep_id = create_sweep(engine, sweep_spec(trials), owner=OWNER)
        ledger = BudgetLedger(engine)
        with Session(engine) as session, session.begin():
            events.lock_sweep(session, sweep_id)
            sweep = session.get(Sweep, sweep_id)
            assert sweep is not None and sweep.plan is not None
            # The ledger is keyed by the records' identity (sweeps.ledger_key), not the name.
            dataset, plan = sweep.ledger_key or sweep.dataset, {g["grid"]: g for g in sweep.plan}
            scheds = schedules(sweep)
            every = int(sweep.spec["training"]["eval_every"])
            rows = session.execute(
                select(Trial.id, Trial.arm, Trial.epsilon_budget, Trial.number, Trial.params)
                .where(Trial.sweep_id == sweep_id)
                .order_by(Trial.arm, Trial.epsilon_budget, Trial.number)
            ).all()
            n = len(rows)
            # Two workers, about 0.6 s a trial, ending a minute ago.
            end = datetime.now(UTC) - timedelta(minutes=1)
            start = end - timedelta(seconds=0.3 * n + 1.0)
            trial_updates: list[dict[str, Any]] = []
            results: list[dict[str, Any]] = []
            points: list[dict[str, Any]] = []
            evts: list[dict[str, Any]] = [
                {
                    "sweep_id": sweep_id,
                    "kind": events.SWEEP,
                    "trial_id": None,
                    "data": {"state": "running"},
                    "created_at": start,
                }
            ]
            charges: list[dict[str, Any]] = []
            for i, (tid, arm, level, number, params) in enumerate(rows):
                g = plan[grid_key(arm, level)]
                began = start + timedelta(seconds=0.3 * i)
                took = 0.5 + 0.2 * rng.random()
                done_at = began + timedelta(seconds=took)
                steps = int(g["steps_per_trial"])
                evals = _eval_steps(steps, every)
                # Better with more budget and a learning rate near 0.3.
                lr_penalty = 0.08 * math.log10(float(params["lr"]) / 0.3) ** 2
                quality = 0.55 + 0.4 * (1 - math.exp(-level / 4)) - lr_penalty
                history = [_fake_eval(rng, quality - 0.1 * (1 - s / steps)) for s in evals]
                best = max(range(len(evals)), key=lambda j: history[j]["accuracy"])
                metrics = {k: history[best][k] for k in METRICS}
                trial_updates.append(
                    {
                        "id": tid,
                        "state": TrialState.done,
                        "attempts": 1,
                        "worker": f"bench-{i % 2}",
                        "pack_id": tid,
                        "started_at": began,
                        "finished_at": done_at,
                        "train_seconds": took - 0.05,
                        "error": None,
                    }
                )
                results.append(
                    {
                        "trial_id": tid,
                        "metrics": metrics,
                        "final_metrics": {k: history[-1][k] for k in METRICS},
                        "epsilon": float(g["epsilon_per_trial"]),
                        "delta": float(g["delta_per_trial"]),
                        "accountant": g["accountant"],
                        "steps": steps,
                        "best_step": evals[best],
                        "reliability": history[best]["reliability"],
                        "trajectories": {
                            "step": evals,
                            "lr": [float(params["lr"])] * len(evals),
                            "clip": [
                                float(params.get("clip", params.get("clip_init", 1.0)))
                                * (1 + 0.1 * rng.random())
                                for _ in evals
                            ],
                        },
                        "step_time_ms_median": 2.5 + rng.random(),
                        "diverged_at": None,
                        "objective": metrics["accuracy"],
                    }
                )
                trial = {"trial": tid, "arm": arm, "epsilon_budget": level}
                evts.append(
                    {
                        "sweep_id": sweep_id,
                        "kind": events.TRIAL,
                        "trial_id": tid,
                        "data": trial | {"state": "running", "params": params},
                        "created_at": began,
                    }
                )
                for j, (s, h) in enumerate(zip(evals, history, strict=True)):
                    at = began + timedelta(seconds=took * (j + 1) / (len(evals) + 1))
                    values = {k: h[k] for k in METRICS}
                    points.extend(
                        {"trial_id": tid, "step": s, "name": k, "value": v}
                        for k, v in values.items()
                    )
                    evts.append(
                        {
                            "sweep_id": sweep_id,
                            "kind": events.METRIC,
                            "trial_id": tid,
                            "data": {"trial": tid, "step": s, "values": values},
                            "created_at": at,
                        }
                    )
                evts.append(
                    {
                        "sweep_id": sweep_id,
                        "kind": events.TRIAL,
                        "trial_id": tid,
                        "data": trial
                        | {"state": "done", "metrics": metrics, "epsilon": g["epsilon_per_trial"]},
                        "created_at": done_at,
                    }
                )
                # Each trial was its grid's (number + 1)-th run, charged before it started.
                run = number + 1
                eps, dlt = scheds[g["grid"]].charge_for_run(run)
                charges.append(
                    {
                        "dataset": dataset,
                        "sweep_id": sweep_id,
                        "trial_id": tid,
                        "kind": EntryKind.CHARGE,
                        "epsilon": eps,
                        "delta": dlt,
                        "created_at": began,
                        "note": f"run {run} of grid {g['grid']}",
                    }
                )
            evts.append(
                {
                    "sweep_id": sweep_id,
                    "kind": events.SWEEP,
                    "trial_id": None,
                    "data": {"state": "done", "error": None},
                    "created_at": end,
                }
            )
            session.execute(update(Trial), trial_updates)
            session.execute(insert(TrialResultRow), results)
            session.execute(insert(MetricPoint), points)
            session.execute(insert(SweepEvent), evts)
            # What BudgetLedger.charge does per trial, in bulk: the dataset's totals move from
            # reserved to spent (exactly), and one charge entry per trial is recorded.
            budget = session.scalars(
                select(DatasetBudget).where(DatasetBudget.dataset == dataset).with_for_update()
            ).one()
            spent_e = exact_sum([c["epsilon"] for c in charges])
            spent_d = exact_sum([c["delta"] for c in charges])
            budget.epsilon_reserved = EXACT.subtract(budget.epsilon_reserved, spent_e)
            budget.delta_reserved = EXACT.subtract(budget.delta_reserved, spent_d)
            budget.epsilon_spent = exact_sum((budget.epsilon_spent, spent_e))
            budget.delta_spent = exact_sum((budget.delta_spent, spent_d))
            budget.updated_at = end
            if min(budget.epsilon_reserved, budget.delta_reserved) < Decimal(0):
                raise RuntimeError("the charges exceed the sweep's reservation")
            session.execute(insert(LedgerEntry), charges)
            sweep.state = SweepState.done
            sweep.started_at = start
            sweep.finished_at = end
            sweep.driver = None
            sweep.heartbeat_at = end
        ledger.release(dataset, sweep_id=sweep_id, note="sweep finished")
        return LoadedSweep(
            sweep_id,
            n,
            time.perf_counter() - t0,
            {
                "trials": n,
                "metric_points": len(points),
                "events": len(evts) + 1,  # and create_sweep's "pending"
                "ledger_entries": len(charges) + 2,  # and the reservation and the release
            },
        )
    finally:
        engine.dispose()


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


class RequestFailed(RuntimeError):
    pass


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


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process so far (Linux ``/proc``; None elsewhere)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    server_cpu0, client_cpu0 = _cpu_seconds(server_pid), time.process_time()
    lat, wall, errors = measure(base, token, path, clients=args.clients, requests=args.requests)
    server_cpu1, client_cpu1 = _cpu_seconds(server_pid), time.process_time()
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
        db.upgrade(url)
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
                        # With worker processes the parent only supervises: CPU not measured.
                        server.proc.pid if args.api_workers == 1 else None,
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
