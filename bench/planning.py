"""How long a sweep takes to plan: the wait before its first trial, after a submit or `dpsweep run`.

For each spec it times :func:`sweeper.sweeps.create.prepare_sweep` (the dataset loaded for N,
every grid's noise multiplier calibrated with the PLD accountant and verified by the second
accountant, every grid's per-run charge schedule), the CPU-heavy part of creating a sweep,
on this machine's cores (the planner's process pool, ``DPSWEEP_PLAN_PROCESSES``):

* ``examples/demo.yaml``: `make demo`'s 9 grids (3 arms x 3 epsilon levels);
* ``four_grids``: 2 arms x 2 levels, retries 1, 120 steps a trial;
* ``ten_thousand`` (issue 41): one 10,000-trial grid (digits, mlp, 4 epochs, compose),
  timed differently: planned *and reserved* (:func:`sweeper.sweeps.create.create_sweep` on a
  fresh SQLite store: its 10,000 trial rows and the ledger's reservation), what ``dpsweep
  run`` waits before training. It reports ``plan_seconds``, ``reserve_seconds`` and their sum
  ``seconds`` (target: under 5 s), the grid's charge points (the accountant evaluations of
  its schedule: O(log K)), and checks that the runs' charges add up exactly to the ledger's
  reservation.

The first two specs are timed twice in the same run, alternating, ``--repeats`` times (median):

* ``seconds``: dpsweep's planning, whose subsampled-Gaussian PLDs come from
  :mod:`workers.accounting.gaussian_pld` (dp_accounting's construction, its inverse privacy
  loss computed for the whole grid at once);
* ``library_seconds``: the same planning with dp_accounting's own per-point loop (the
  library's class in place of the vectorised one: what planning cost before), and
  ``speedup``, their ratio.

Both give the same plan: the bench checks that every grid's noise multiplier and charge
schedule are equal.

Usage: ``python bench/planning.py [--repeats N] [--specs demo,four_grids,ten_thousand]
[--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FOUR_GRIDS: dict[str, Any] = {
    "name": "four_grids",
    "dataset": {"name": "digits"},
    "model": {"name": "cnn"},
    "training": {"steps": 120, "batch_size": 64, "eval_every": 40},
    "privacy": {"budgets": [3, 8], "delta": 1e-5, "retries": 1},
    "arms": [
        {"strategy": "fixed", "grid": {"lr": [0.1, 0.3, 1.0], "clip": [1.0]}},
        {"strategy": "automatic", "grid": {"lr": [0.3, 1.0]}},
    ],
}


TEN_THOUSAND: dict[str, Any] = {
    "name": "ten_thousand",
    "dataset": {"name": "digits"},
    "model": {"name": "mlp"},
    "training": {"epochs": 4, "batch_size": 64},
    "privacy": {"budgets": [8], "delta": 1e-5, "accounting": "compose"},
    "arms": [
        {
            "strategy": "fixed",
            "grid": {
                "lr": {"logspace": [-2, 1], "k": 1000},
                "clip": {"logspace": [-1, 1], "k": 10},
            },
        }
    ],
}


@contextlib.contextmanager
def library_loop() -> Iterator[None]:
    """Plan with dp_accounting's own ``GaussianPrivacyLoss`` (its per-point Python loop)."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    from workers.accounting import gaussian_pld

    saved = gaussian_pld._CLASS
    gaussian_pld._CLASS = plm.GaussianPrivacyLoss
    try:
        yield
    finally:
        gaussian_pld._CLASS = saved


def _fingerprint(prepared: Any) -> list[Any]:
    return [
        (g.arm, g.epsilon_budget, g.noise_multiplier, [str(e) for e in s.epsilon])
        for g, s in zip(prepared.plan.grids, prepared.schedules, strict=True)
    ]


def time_spec(spec: Any, repeats: int) -> dict[str, Any]:
    from sweeper.sweeps.create import prepare_sweep

    prepare_sweep(spec)  # warm-up: imports, the dataset's first load
    ours: list[float] = []
    library: list[float] = []
    fingerprints = set()
    for _ in range(repeats):
        t0 = time.perf_counter()
        a = prepare_sweep(spec)
        ours.append(time.perf_counter() - t0)
        with library_loop():
            t0 = time.perf_counter()
            b = prepare_sweep(spec)
            library.append(time.perf_counter() - t0)
        fingerprints.add(json.dumps(_fingerprint(a)))
        if _fingerprint(a) != _fingerprint(b):
            raise SystemExit(f"{spec.name}: the two plans differ")
    if len(fingerprints) != 1:
        raise SystemExit(f"{spec.name}: planning is not deterministic")
    s, lib = statistics.median(ours), statistics.median(library)
    return {
        "grids": len(a.plan.grids),
        "seconds": round(s, 3),
        "library_seconds": round(lib, 3),
        "speedup": round(lib / s, 2),
    }


def time_plan_and_reserve(spec: Any) -> dict[str, Any]:
    """Plan ``spec`` and store and reserve it on a fresh SQLite store (one run, timed)."""
    import tempfile
    from decimal import Decimal

    from dpsweep.spec import load_spec
    from sweeper.privacy.charges import charge_points, exact_sum
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger
    from sweeper.store.engine import make_engine
    from sweeper.store.schema import upgrade
    from sweeper.sweeps.create import create_sweep, prepare_sweep

    # Warm-up on a one-trial copy: imports and the dataset's first load, not the grid's size.
    raw = spec.model_dump(mode="json")
    raw["arms"][0]["grid"] = {"lr": [0.1], "clip": [1.0]}
    prepare_sweep(load_spec(raw))
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade(url)
        engine = make_engine(url)
        t0 = time.perf_counter()
        prepared = prepare_sweep(spec)
        t1 = time.perf_counter()
        sweep_id = create_sweep(engine, spec, prepared=prepared)
        t2 = time.perf_counter()
        from sqlalchemy import select
        from sqlalchemy.orm import Session

        from sweeper.store import Sweep

        with Session(engine) as session:
            key = session.scalars(select(Sweep.ledger_key).where(Sweep.id == sweep_id)).one()
        reserved = BudgetLedger(engine).summary(key).epsilon_reserved
        engine.dispose()
    (grid,), (sched,) = prepared.plan.grids, prepared.schedules
    # The runs' charges add up exactly to the grid's reservation, which is the ledger's.
    runs = [sched.charge_for_run(j)[0] for j in range(1, sched.runs + 1)]
    if exact_sum(runs) != sched.reserved_epsilon or Decimal(reserved) != sched.reserved_epsilon:
        raise SystemExit(f"{spec.name}: the runs' charges do not add up to the reservation")
    points = len(charge_points(grid.trials))
    if sched.runs != grid.trials or len(sched.epsilon) != points:
        raise SystemExit(f"{spec.name}: the schedule is not one value per charge point")
    return {
        "grids": 1,
        "trials": grid.trials,
        "charge_points": points,
        "plan_seconds": round(t1 - t0, 3),
        "reserve_seconds": round(t2 - t1, 3),
        "seconds": round(t2 - t0, 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--specs",
        default="demo,four_grids,ten_thousand",
        help="comma-separated: demo,four_grids,ten_thousand",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from dpsweep.spec import load_spec

    specs = {
        "demo": load_spec(ROOT / "examples" / "demo.yaml"),
        "four_grids": load_spec(FOUR_GRIDS),
        "ten_thousand": load_spec(TEN_THOUSAND),
    }
    wanted = [name.strip() for name in args.specs.split(",") if name.strip()]
    unknown = sorted(set(wanted) - set(specs))
    if unknown:
        p.error(f"unknown spec(s) {unknown}; choose from {sorted(specs)}")
    out = {
        name: time_plan_and_reserve(specs[name])
        if name == "ten_thousand"
        else time_spec(specs[name], args.repeats)
        for name in wanted
    }
    if args.json:
        print(json.dumps(out))
        return 0
    for name, r in out.items():
        if "trials" in r:
            print(
                f"{name:>10}: {r['trials']} trials planned and reserved in {r['seconds']:.2f} s "
                f"(plan {r['plan_seconds']:.2f} s, store and reserve {r['reserve_seconds']:.2f} "
                f"s; {r['charge_points']} charge points)"
            )
            continue
        print(
            f"{name:>10}: {r['grids']} grids planned in {r['seconds']:.2f} s "
            f"(dp_accounting's loop: {r['library_seconds']:.2f} s, {r['speedup']:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
