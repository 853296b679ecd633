"""Sweep throughput on a local Ray: the same sweep with 1 and with 2 workers.

A 16-trial digits sweep (one ``fixed`` arm, lr in [0.05, 0.1, 0.2, 0.5] x clip in
[0.5, 1, 2, 4], epsilon 8, delta 1e-5, batch 64, eval every 50 steps, ``mlp`` with one hidden
layer of 64 or ``--model cnn``; ``--steps`` per trial, by default 2000 for mlp and 300 for cnn,
about 1 to 1.5 s of training each so that training dominates) runs through
:func:`sweeper.driver.loop.run_sweep` into a temporary SQLite database, on one local Ray with 2 CPUs
started once (and warmed up with an untimed 2-trial sweep, so that worker start-up and imports
are not billed to the first configuration).
Each configuration gets a fresh sweep, created (privacy planned, trials stored) outside the
timed region. Configurations are interleaved (1, 2, 1, 2, ... workers, ``--repeats`` times) to
cope with noisy machines. It reports:

* ``workers_1_s``, ``workers_2_s``: the median wall time of ``run_sweep``, and their ratio
  ``speedup`` (target: >= 1.7x on 2 cores);
* the per-trial scheduling overhead, the time a trial spends in dpsweep outside training:
  ``finished_at - started_at - train_seconds`` from the trial's database row (claimed,
  charged, submitted to Ray, events streamed back, results written; ``train_seconds`` is the
  worker's whole ``train_pack`` call, so loading the dataset counts as training). Mean and
  max over every timed trial, per configuration; ``overhead_mean_s``/``overhead_max_s`` are
  the 2-worker figures (target: <= 0.5 s per trial). ``between_trials_s`` (per configuration)
  is the rest of the driver's cost: worker-slot time per trial with no trial claimed,
  ``(workers * wall - sum(finished_at - started_at)) / trials``; ``driver_cpu_s`` is the CPU
  time of this (the driver's) process during ``run_sweep``, which competes with the workers for
  the 2 cores.

The targets are printed next to the figures, not asserted.

By default every trial is its own Ray task (``--pack-size 1``). ``--pack-size N`` lets the
runner pack up to N compatible trials into one task: packing batches trials, which changes
what a "trial" costs (a pack's trials share its wall time, ``train_seconds`` is the pack's,
fewer tasks than trials may leave a worker idle, and ``between_trials_s`` goes negative as a
pack's trials overlap).

Usage: ``python bench/sweep_throughput.py [--json] [--quick] [--model mlp|cnn] [--steps N]
[--repeats R] [--pack-size N]``. ``--repeats`` defaults to 2. ``--quick`` runs 4 trials (2x2
grid) of 50 (mlp) or 20 (cnn) steps, once per configuration, in well under a minute; the full
bench takes under 2 minutes with mlp on a 2-core VM.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from sweeper.driver.loop import run_sweep
from sweeper.settings import SweeperSettings
from sweeper.store import Trial, TrialState
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep

TARGETS = {"speedup": 1.7, "overhead_s": 0.5}
WORKERS = (1, 2)
LRS = [0.05, 0.1, 0.2, 0.5]
CLIPS = [0.5, 1.0, 2.0, 4.0]
# About 1.2 s (mlp) and 1.5 s (cnn) of training per trial on one core of the dev VM.
DEFAULT_STEPS = {"mlp": 2000, "cnn": 300}
QUICK_STEPS = {"mlp": 50, "cnn": 20}


def spec(name: str, *, model: str, steps: int, quick: bool) -> dict[str, Any]:
    """The sweep: 16 trials (4 in quick mode) of one ``fixed`` arm at epsilon 8."""
    lrs, clips = (LRS[1:3], CLIPS[1:3]) if quick else (LRS, CLIPS)
    return {
        "name": name,
        "dataset": {"name": "digits"},
        "model": {"name": model, "options": {"hidden": [64]} if model == "mlp" else {}},
        "training": {"steps": steps, "batch_size": 64, "eval_every": 50},
        "privacy": {"budgets": [8], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": lrs, "clip": clips}}],
    }


def _utc(dt: datetime | None) -> datetime:
    assert dt is not None
    # SQLite hands back naive datetimes for timezone-aware columns; they were stored as UTC.
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt


def trial_times(engine: Engine, sweep_id: str) -> list[tuple[float, float]]:
    """(start-to-finish seconds, train seconds) of each trial; every trial must be done."""
    with Session(engine) as session:
        trials = list(session.scalars(select(Trial).where(Trial.sweep_id == sweep_id)))
    bad = [
        f"{t.number}: {t.state.value} {t.error or ''}" for t in trials if t.state != TrialState.done
    ]
    if bad:
        raise RuntimeError(f"sweep {sweep_id}: trials not done: {bad}")
    return [
        (
            (_utc(t.finished_at) - _utc(t.started_at)).total_seconds(),
            float(t.train_seconds or 0.0),
        )
        for t in trials
    ]


def start_ray() -> Any:
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR
    )
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=256 * 2**20,
        log_to_driver=False,
        logging_level="WARNING",
    )
    return ray


def run(*, model: str, steps: int, repeats: int, pack_size: int, quick: bool) -> dict[str, Any]:
    settings = SweeperSettings(max_pack_size=pack_size or None)
    walls: dict[int, list[float]] = {w: [] for w in WORKERS}
    overheads: dict[int, list[float]] = {w: [] for w in WORKERS}
    trains: dict[int, list[float]] = {w: [] for w in WORKERS}
    idle: dict[int, list[float]] = {w: [] for w in WORKERS}
    driver_cpu: dict[int, list[float]] = {w: [] for w in WORKERS}
    n_trials = 0
    with tempfile.TemporaryDirectory(prefix="dpsweep-bench-") as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        upgrade(url)
        engine = make_engine(url)
        ray = start_ray()
        try:
            # Warm-up: start both worker processes and import torch and the trainer there.
            warm = spec("warm-up", model=model, steps=10, quick=True)
            warm["arms"][0]["grid"] = {"lr": LRS[1:3], "clip": [1.0]}
            run_sweep(engine, create_sweep(engine, warm), settings=settings, workers=2)
            for r in range(repeats):
                for w in WORKERS:
                    t0 = time.perf_counter()
                    sweep_id = create_sweep(
                        engine, spec(f"bench-r{r}-w{w}", model=model, steps=steps, quick=quick)
                    )
                    created_s = time.perf_counter() - t0
                    t0, c0 = time.perf_counter(), time.process_time()
                    outcome = run_sweep(engine, sweep_id, settings=settings, workers=w)
                    walls[w].append(time.perf_counter() - t0)
                    driver_cpu[w].append(time.process_time() - c0)
                    if outcome.state != "done":
                        raise RuntimeError(f"sweep {sweep_id} ended {outcome.state}")
                    times = trial_times(engine, sweep_id)
                    n_trials = len(times)
                    overheads[w].extend(total - train for total, train in times)
                    trains[w].extend(train for _, train in times)
                    # Worker-slot time per trial with no trial claimed at all (between trials).
                    idle[w].append((w * walls[w][-1] - sum(t for t, _ in times)) / len(times))
                    print(
                        f"repeat {r + 1}/{repeats}, {w} worker(s): {walls[w][-1]:.2f} s "
                        f"(sweep created in {created_s:.1f} s, untimed)",
                        file=sys.stderr,
                    )
        finally:
            ray.shutdown()
            engine.dispose()
    w1, w2 = statistics.median(walls[1]), statistics.median(walls[2])
    per_config = {
        str(w): {
            "wall_s": [round(x, 3) for x in walls[w]],
            "wall_median_s": round(statistics.median(walls[w]), 3),
            "train_mean_s": round(statistics.fmean(trains[w]), 3),
            "overhead_mean_s": round(statistics.fmean(overheads[w]), 3),
            "overhead_max_s": round(max(overheads[w]), 3),
            "between_trials_s": round(statistics.fmean(idle[w]), 3),
            "driver_cpu_s": round(statistics.median(driver_cpu[w]), 3),
        }
        for w in WORKERS
    }
    return {
        "trials": n_trials,
        "workers_1_s": round(w1, 3),
        "workers_2_s": round(w2, 3),
        "speedup": round(w1 / w2, 3),
        "overhead_mean_s": per_config["2"]["overhead_mean_s"],
        "overhead_max_s": per_config["2"]["overhead_max_s"],
        "per_config": per_config,
        "targets": TARGETS,
        "model": model,
        "steps": steps,
        "pack_size": pack_size,
        "repeats": repeats,
    }


def _mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quick", action="store_true", help="4 trials, fewer steps, one repeat")
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    p.add_argument("--steps", type=int, default=None, help="steps per trial")
    p.add_argument("--repeats", type=int, default=None, help="runs per configuration")
    p.add_argument(
        "--pack-size",
        type=int,
        default=1,
        help="most trials per Ray task; packing batches trials (0: the runner's own cap)",
    )
    a = p.parse_args(argv)
    steps = a.steps or (QUICK_STEPS if a.quick else DEFAULT_STEPS)[a.model]
    repeats = a.repeats or (1 if a.quick else 2)
    out = run(model=a.model, steps=steps, repeats=repeats, pack_size=a.pack_size, quick=a.quick)
    if a.json:
        print(json.dumps(out))
        return 0
    print(
        f"{out['trials']}-trial digits sweep, {a.model}, {steps} steps, pack size {a.pack_size}, "
        f"local Ray with 2 CPUs, median of {repeats}"
        + (" (quick: trials too short to judge the targets)" if a.quick else "")
    )
    print(
        f"{'workers':>7} {'wall s':>8} {'train/trial s':>14} {'overhead mean s':>16} "
        f"{'max s':>7} {'between trials s':>17} {'driver CPU s':>13}"
    )
    for w in WORKERS:
        c = out["per_config"][str(w)]
        print(
            f"{w:>7} {c['wall_median_s']:8.2f} {c['train_mean_s']:14.3f} "
            f"{c['overhead_mean_s']:16.3f} {c['overhead_max_s']:7.3f} "
            f"{c['between_trials_s']:17.3f} {c['driver_cpu_s']:13.2f}"
        )
    sp, oh = out["speedup"], out["overhead_mean_s"]
    print(
        f"speed-up {sp:.2f}x (target >= {TARGETS['speedup']}x: {_mark(sp >= TARGETS['speedup'])})"
    )
    ok = math.isfinite(oh) and oh <= TARGETS["overhead_s"]
    print(
        f"overhead per trial (2 workers) mean {oh:.3f} s, max {out['overhead_max_s']:.3f} s "
        f"(target <= {TARGETS['overhead_s']} s: {_mark(ok)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
