"""A sweep's released trials exported as CSV (one row per trial) or JSON (summary + trials)."""

from __future__ import annotations

import csv
import io
import json

from sqlalchemy import Engine

from dpsweep.errors import ConfigError
from dpsweep.spec import randomness_label
from sweeper.privacy.releases import evaluation_statement
from sweeper.sweeps.stored import load_sweep
from sweeper.sweeps.summary import summarize, sweep_results


def export_sweep(engine: Engine, sweep_id: str, *, fmt: str) -> str:
    """The sweep's released trials as CSV (one row per trial), or JSON (summary + trials).

    Raises:
        ConfigError: an unknown format.
    """
    if fmt not in ("csv", "json"):
        raise ConfigError(f"unknown export format {fmt!r}; choose csv or json", field="format")
    sweep = load_sweep(engine, sweep_id)
    res = sweep_results(sweep)
    if fmt == "json":
        label = randomness_label(sweep.spec)
        trials = [r | {"randomness": label} for r in res.records]
        return json.dumps({"sweep": summarize(engine, sweep_id), "trials": trials}, indent=2)
    metric_names = sorted({k for r in res.records for k in (r["metrics"] or {})})
    param_names = sorted({k for r in res.records for k in (r["params"] or {})})
    base = [
        "id",
        "arm",
        "strategy",
        "epsilon_budget",
        "seed",
        "state",
        "attempts",
        "noise_multiplier",
        "single_run_epsilon",
        "delta",
        "steps",
        "best_step",
        "train_seconds",
        "error",
        "randomness",
        # How the metrics' evaluation records were protected: carve-out (exact, unprotected),
        # public (exact, a public dataset) or dp (noisy accuracy, charged).
        "evaluation",
    ]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(base + [f"param.{p}" for p in param_names] + metric_names)
    label = randomness_label(sweep.spec)
    evaluation = evaluation_statement(list(sweep.plan or []))["mode"]
    for r in res.records:
        r = r | {"randomness": label, "evaluation": evaluation}
        writer.writerow(
            [r.get(k) for k in base]
            + [r["params"].get(p) for p in param_names]
            + [(r["metrics"] or {}).get(m) for m in metric_names]
        )
    return buf.getvalue()
