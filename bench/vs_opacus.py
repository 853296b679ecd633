"""A sweep through dpsweep against the same trials as Opacus scripts in a process pool.

Two grids (``--grid``):

* ``demo``: ``examples/demo.yaml`` (33 trials: fixed, quantile and online clipping on digits with
  ``cnn``, three per-grid epsilon levels; ``--smoke`` cuts it to 2 trials of one epoch), so
  small that start-up decides its time;
* ``large``: a grid of the size users run (:func:`large_spec`): 105 trials of 625 steps on
  MNIST-1D (MLP 40-128-10, batch 64, SGD momentum 0.9, a moving average of the weights with
  decay 0.99, evaluation of both weights every 50 steps on the 1,000 public ``mnist1d-test``
  records), fixed 25 + automatic 5 + online 5 grid points at per-grid epsilon 1, 3 and 8
  (``--smoke``: 4 trials of 10 steps at one level). The Opacus trials read the same records
  (written once to an ``.npz``), with the same momentum, average and evaluation cadence.

Each grid runs two ways in the same run:

* ``dpsweep_s``: ``dpsweep run SPEC --quiet --workers N`` in a fresh directory with a fresh SQLite
  database, as a subprocess, until it exits (planning, Ray, every trial, results, plots);
* ``opacus_s``: every trial of that sweep as ``bench/opacus_trial.py``'s :func:`run_trial` in a
  ``multiprocessing`` pool of N processes (spawned, so their start-up and imports count), from
  pool start to the last result. Each trial takes its grid point's lr and clip (``clip`` or, for
  the adaptive arms, ``clip_init``), its planned noise multiplier, and the plan's steps, sample
  rate and evaluation schedule from the trials dpsweep stored. Opacus has no online or quantile
  clipping of this kind, so its trials clip at a flat norm: the same amount of training, not the
  same algorithm.

N (``workers``) is the number of workers dpsweep uses (``--workers``, default the CPU count, as
``dpsweep run``). It prints ``{"dpsweep_s", "opacus_s", "workers"}``, ``speedup`` (opacus_s /
dpsweep_s), ``target`` (>= 3x; printed, not asserted), ``trial_steps`` (every trial's steps,
summed) and each side's ``*_ms_per_trial_step`` (wall time x processes / trial-steps: the cost
of one trial-step on one core, start-up included).

Usage: ``python bench/vs_opacus.py [--json] [--workers N] [--grid demo|large] [--smoke]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cli_runs import DPSWEEP, cli_env, run_checked  # noqa: E402
from opacus_trial import run_trial  # noqa: E402

TARGET = 3.0


def demo_spec(*, smoke: bool) -> dict[str, Any]:
    """``examples/demo.yaml``; ``smoke``: its fixed arm at one lr, one epoch and one epsilon
    level (2 trials)."""
    spec = dict(yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text()))
    if smoke:
        spec["training"] = {**spec["training"], "epochs": 1}
        spec["privacy"] = {**spec["privacy"], "budgets": [8]}
        fixed = next(a for a in spec["arms"] if a["strategy"] == "fixed")
        spec["arms"] = [{**fixed, "grid": {**fixed["grid"], "lr": [0.3]}}]
    return spec


def large_spec(*, smoke: bool) -> dict[str, Any]:
    """The large grid (105 trials of 625 steps); ``smoke``: 4 trials of 10 steps, one level."""
    lrs: dict[str, Any] = {"logspace": [-1.5, 0.5], "k": 5}
    clips: dict[str, Any] = {"logspace": [-2, 0], "k": 5}
    training: dict[str, Any] = {
        "epochs": 10,
        "batch_size": 64,
        "optimizer": "sgd",
        "momentum": 0.9,
        "ema": {"decay": 0.99},
        "eval_every": 50,
    }
    if smoke:
        lrs, clips = {"logspace": [-1, 0], "k": 2}, [0.1]
        training = {**training, "steps": 10, "eval_every": 5}
        del training["epochs"]
    return {
        "name": "vs-opacus-large",
        "dataset": {"name": "mnist1d"},
        "eval": {"mode": "public", "dataset": "mnist1d-test"},
        "model": {"name": "mlp"},
        "training": training,
        "privacy": {"budgets": [3] if smoke else [1, 3, 8], "delta": 1.0e-5},
        "arms": [
            {"strategy": "fixed", "grid": {"lr": lrs, "clip": clips}},
            {"strategy": "automatic", "grid": {"lr": lrs if not smoke else [0.3]}},
            {
                "strategy": "online",
                "grid": {"lr": lrs if not smoke else [0.3]},
                "params": {"clip_init": 0.1},
            },
        ],
        "seeds": 1,
        "search": {"method": "grid"},
        "objective": {"metric": "accuracy", "mode": "max"},
    }


def mnist1d_npz(work: Path) -> Path:
    """MNIST-1D's records, as dpsweep generates (and caches) them, in one ``.npz`` for the
    Opacus trials: a user by hand would generate them once too."""
    import numpy as np  # deferred: the demo grid needs neither

    from workers.datasets.builtin import mnist1d_parts  # deferred: as above

    x, y, x_test, y_test = mnist1d_parts()
    path = work / "mnist1d.npz"
    np.savez(path, x=x, y=y, x_test=x_test, y_test=y_test)
    return path


def run_dpsweep(spec_path: Path, work: Path, workers: int) -> float:
    """Wall time of ``dpsweep run`` into ``work/demo.db``."""
    t0 = time.perf_counter()
    run_checked(
        [
            DPSWEEP,
            "run",
            str(spec_path),
            "--quiet",
            "--workers",
            str(workers),
            "--db",
            f"sqlite:///{work / 'demo.db'}",
        ],
        cwd=work,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def opacus_trials(
    spec: dict[str, Any], spec_path: Path, work: Path, data_path: Path | None = None
) -> list[dict[str, Any]]:
    """The sweep's trials as Opacus trials: dpsweep's stored grid points and sigmas, its plan's
    steps and sample rates, its momentum and average (``data_path``: the records' ``.npz``)."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from sweeper.store import Trial
    from sweeper.store.engine import make_engine

    out = run_checked(
        [DPSWEEP, "plan", "--json", str(spec_path), "--db", f"sqlite:///{work / 'demo.db'}"],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=work,
    )
    grids = {(g["arm"], float(g["epsilon_budget"])): g for g in json.loads(out.stdout)}
    engine = make_engine(f"sqlite:///{work / 'demo.db'}")
    try:
        with Session(engine) as s:
            rows = s.scalars(select(Trial)).all()
            trials = []
            for t in rows:
                g = grids[(t.arm, float(t.epsilon_budget))]
                params = dict(t.params)
                arm = next(a for a in spec["arms"] if a["strategy"] == t.strategy)
                clip = params.get(
                    "clip", params.get("clip_init", arm.get("params", {}).get("clip_init", 1.0))
                )
                training = spec["training"]
                ema = training.get("ema")
                trials.append(
                    {
                        "momentum": float(training.get("momentum", 0.0)),
                        "ema": float(ema["decay"]) if ema else None,
                        "model": spec["model"]["name"],
                        "lr": float(params["lr"]),
                        "clip": float(clip),
                        "sigma": float(t.noise_multiplier or g["gradient_noise_multiplier"]),
                        "steps": int(g["steps_per_trial"]),
                        "sample_rate": float(g["sample_rate"]),
                        "batch_size": int(spec["training"]["batch_size"]),
                        "eval_every": int(spec["training"].get("eval_every", 50)),
                        "seed": int(t.seed),
                        "test_fraction": float(spec["dataset"].get("test_fraction", 0.2)),
                        "data_path": str(data_path) if data_path else None,
                    }
                )
    finally:
        engine.dispose()
    return trials


def run_opacus(trials: list[dict[str, Any]], workers: int) -> float:
    """Wall time of every trial in a pool of ``workers`` spawned processes."""
    t0 = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(run_trial, trials, chunksize=1)
    return time.perf_counter() - t0


def main() -> None:
    """Run the bench; print the figures (``--json``: one JSON object)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--grid", choices=("demo", "large"), default="demo", help="which grid")
    ap.add_argument("--smoke", action="store_true", help="a few short trials, one epsilon level")
    a = ap.parse_args()

    spec = large_spec(smoke=a.smoke) if a.grid == "large" else demo_spec(smoke=a.smoke)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spec_path = work / "demo.yaml"
        spec_path.write_text(yaml.safe_dump(spec))
        data_path = mnist1d_npz(work) if a.grid == "large" else None
        dpsweep_s = run_dpsweep(spec_path, work, a.workers)
        trials = opacus_trials(spec, spec_path, work, data_path)
        opacus_s = run_opacus(trials, a.workers)

    trial_steps = sum(t["steps"] for t in trials)
    out: dict[str, Any] = {
        "grid": a.grid,
        "dpsweep_s": dpsweep_s,
        "opacus_s": opacus_s,
        "workers": a.workers,
        "trials": len(trials),
        "trial_steps": trial_steps,
        "dpsweep_ms_per_trial_step": 1000 * dpsweep_s * a.workers / trial_steps,
        "opacus_ms_per_trial_step": 1000 * opacus_s * a.workers / trial_steps,
        "speedup": opacus_s / dpsweep_s,
        "target": TARGET,
    }
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>10}: {v:.3f}" if isinstance(v, float) else f"{k:>10}: {v}")


if __name__ == "__main__":
    main()
