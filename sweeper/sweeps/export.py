"""A sweep's released trials exported as CSV (one row per trial) or JSON (summary + trials).

Each trial carries its kept model, if any: in JSON its ``model`` (the trial listing's
reference with the trial and the command that writes it out,
:func:`sweeper.sweeps.summary.local_model_ref`; null when none is kept) and the summary's
``models``; in CSV the ``model_*`` columns (empty when none is kept).
"""

from __future__ import annotations

import csv
import io
import json

from sqlalchemy import Engine

from dpsweep.columns import metric_column, param_column
from dpsweep.errors import ConfigError
from dpsweep.plan import SweepPlan
from dpsweep.spec import randomness_label
from sweeper.privacy.releases import evaluation_statement
from sweeper.sweeps.stored import load_sweep
from sweeper.sweeps.summary import kept_models, summarize, sweep_results, trial_models

# The CSV's columns of a trial's kept model, and the reference's fields they hold.
MODEL_COLUMNS = {
    "model_url": "url",
    "model_card_url": "card_url",
    "model_sha256": "sha256",
    "model_size_bytes": "size_bytes",
    "model_cli": "cli",
}


def export_sweep(engine: Engine, sweep_id: str, *, fmt: str) -> str:
    """The sweep's released trials as CSV (one row per trial), or JSON (summary + trials).

    Raises:
        ConfigError: an unknown format.
    """
    if fmt not in ("csv", "json"):
        raise ConfigError(f"unknown export format {fmt!r}; choose csv or json", field="format")
    sweep = load_sweep(engine, sweep_id)
    res = sweep_results(sweep)
    models = trial_models(engine, res.records)
    if fmt == "json":
        label = randomness_label(sweep.spec)
        trials = [r | {"randomness": label, "model": models.get(r["id"])} for r in res.records]
        summary = summarize(engine, sweep_id, sweep=sweep) | {
            "models": kept_models(engine, res, models)
        }
        return json.dumps({"sweep": summary, "trials": trials}, indent=2)
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
        # What each epsilon protects: example (a record), or the dataset's unit (a person).
        "privacy_unit",
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
    # The SDK's DataFrame columns (dpsweep.columns): `lr`, `accuracy`; prefixed where taken.
    taken = [*base, *MODEL_COLUMNS]
    params_header = [param_column(p, taken) for p in param_names]
    metrics_header = [metric_column(m, [*taken, *params_header]) for m in metric_names]
    writer.writerow(taken + params_header + metrics_header)
    label = randomness_label(sweep.spec)
    plan = SweepPlan.from_stored(sweep.plan)
    evaluation = evaluation_statement(plan.grids)["mode"]
    for r in res.records:
        r = r | {"randomness": label, "evaluation": evaluation, "privacy_unit": plan.privacy_unit}
        ref = models.get(r["id"]) or {}
        writer.writerow(
            [r.get(k) for k in base]
            + [ref.get(field) for field in MODEL_COLUMNS.values()]
            + [r["params"].get(p) for p in param_names]
            + [(r["metrics"] or {}).get(m) for m in metric_names]
        )
    return buf.getvalue()
