"""``dpsweep plan``'s output: the plan as JSON, as a table, and the notes under the table."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from api.cli.sweeps import describe_scaling
from dpsweep.plan import GridPlan
from dpsweep.plan_fields import CLI, per_unit, plan_field, public_fields, public_view, unit_suffix
from dpsweep.spec import DEFAULT_GRIDS, propose_grid

#: ``dpsweep plan --json``'s keys (:data:`dpsweep.plan_fields.CLI`'s view).
PLAN_KEYS = tuple(f.name for f in public_fields(CLI))

#: The table's columns, by field: header and cell format come from the one declaration
#: (:data:`dpsweep.plan_fields.PUBLIC_PLAN_FIELDS`); arm and release are left-aligned.
PLAN_COLUMNS = tuple(
    plan_field(name)
    for name in (
        "arm",
        "epsilon_budget",
        "trials",
        "noise_multiplier",
        "gradient_noise_multiplier",
        "epsilon_per_trial",
        "epsilon_total",
        "epsilon_verified",
        "steps_per_trial",
        "sample_rate",
        "release",
    )
)
_LEFT = ("arm", "release")
#: The columns whose figures are epsilons: "per person" follows their header with a unit.
_EPSILONS = ("epsilon_budget", "epsilon_per_trial", "epsilon_total", "epsilon_verified")


def plan_json(rows: list[GridPlan]) -> str:
    """The plan's rows as one JSON array (:data:`PLAN_KEYS`)."""
    return json.dumps([public_view(r, CLI) for r in rows])


def plan_table(title: str, rows: list[GridPlan]) -> Table:
    """The plan as a table, one row per grid; with a privacy unit, the title and every
    epsilon's header say what one unit is (``grid ε per person``)."""
    unit = rows[0].privacy_unit if rows else None
    table = Table(title=f"{title}{unit_suffix(unit)}")
    for col in PLAN_COLUMNS:
        label = f"{col.label}{per_unit(unit)}" if col.name in _EPSILONS else col.label
        table.add_column(label, justify="left" if col.name in _LEFT else "right")
    for r in rows:
        stored = r.to_stored()
        table.add_row(*(col.cell(stored[col.name]) for col in PLAN_COLUMNS))
    return table


def print_plan_notes(console: Console, spec: Any, plan: Any, rows: list[Any]) -> None:
    """What the table leaves out: the whole sweep's epsilon, the engine path, default grids,
    each grid's notes and warnings, the inputs' scaling and what epsilon covers."""
    from sweeper.privacy.releases import evaluation_statement  # deferred: SQLAlchemy

    console.print(whole_sweep_line(plan, rows))
    unit = rows[0].privacy_unit
    if per_unit(unit):
        console.print(unit_line(rows))
    console.print(
        f"model {spec.model.name}: trained on the {rows[0].engine_path or 'auto'} engine "
        "path (packed: the fast batched path; generic: any nn.Module, per-example gradients)"
    )
    console.print(model_start_line(rows))
    for arm in spec.arms:
        # An arm that gives no grid gets its strategy's default (dpsweep.spec.DEFAULT_GRIDS),
        # written into the spec: say which grid that is.
        default = DEFAULT_GRIDS.get(arm.strategy)
        if default and arm.grid == propose_grid(default, spec.model.name, arm.params):
            console.print(
                f"arm {arm.label}: {arm.strategy}'s default grid for model {spec.model.name} "
                f"(what an arm without a grid gets): {_point(dict(arm.grid))}"
            )
    for r in rows:
        _print_grid_notes(console, r, metric=spec.objective.metric)
    if rows[0].input_scaling:
        console.print(describe_scaling(rows[0].input_scaling))
    console.print(evaluation_statement(rows)["statement"])


def model_start_line(rows: list[Any]) -> str:
    """Where the model's weights start and how many parameters DP-SGD trains of the total
    (the plan's ``checkpoint``, ``trainable`` and parameter counts; a range over the grids and
    their LoRA ranks)."""
    r = rows[0]
    ckpt = r.checkpoint
    if ckpt is None:
        start = "weights start random" if not r.pretrained_on else "weights start"
    else:
        name = ckpt.get("name") or ckpt.get("path")
        seen = ckpt.get("trained_on")
        start = f"weights start from checkpoint {name} ({ckpt.get('kind')}, {ckpt.get('digest')})"
        if seen:
            start += f", trained on {seen}"
    if r.pretrained_on:
        # The public pre-training happens before the grid: no epsilon (public records only).
        pre = f"pre-trained at epsilon 0 on {r.pretrained_on} (public records, not charged)"
        start = f"{start} {pre}" if ckpt is None else f"{start}, then {pre}"
    low = [g.trained_parameters for g in rows if g.trained_parameters is not None]
    high = [
        g.trained_parameters_max or g.trained_parameters
        for g in rows
        if g.trained_parameters is not None
    ]
    totals = [g.total_parameters for g in rows if g.total_parameters is not None]
    kinds = sorted({g.trainable or "all" for g in rows})
    if not low or not totals:
        return f"{start}; trains {', '.join(kinds)} of its parameters"
    count = f"{min(low):,}" if min(low) == max(high) else f"{min(low):,}-{max(high):,}"
    line = f"{start}; trains {', '.join(kinds)}: {count} of {max(totals):,} parameters"
    if max(high) < max(totals):
        line += " (frozen parameters are neither clipped nor noised; the epsilon is the same)"
    return line


def unit_line(rows: list[Any]) -> str:
    """What a plan with a privacy unit protects, and what its q, T and N count."""
    r = rows[0]
    unit = r.privacy_unit
    return (
        f"privacy unit {unit}: every ε is per {unit} (unit: {unit}), all of a {unit}'s rows "
        f"together; q = batch / {r.n_train} training units, T and δ's bound (N) in units"
    )


def whole_sweep_line(plan: Any, rows: list[Any]) -> str:
    """The whole sweep's epsilon, and what the dataset's ledger is charged."""
    from sweeper.privacy.releases import sweep_release  # deferred: SQLAlchemy

    whole = sweep_release(rows)
    if whole is None:
        raise ValueError("a plan without grids")
    unit = unit_suffix(rows[0].privacy_unit)
    charged = (
        "the ledger is charged the grid's epsilon"
        if len(rows) == 1
        else f"the grids' sum, which the dataset's ledger is charged, is {plan.epsilon_total:.4g}"
    )
    return (
        f"whole sweep: epsilon {whole['epsilon']:.4g}{unit} at delta {whole['delta']:.3g} "
        f"({whole['method']}; {charged}); grids verified by {rows[0].verified_by}"
    )


def _print_grid_notes(console: Console, r: Any, *, metric: str) -> None:
    where = f"{r.arm} at ε {r.epsilon_budget:g}{per_unit(r.privacy_unit)}"
    if r.count_noise is not None:
        console.print(
            f"{where}: quantile count noise sigma_b = "
            f"{r.count_noise:.4g} (chosen: the spec leaves count_noise out)"
        )
    if r.eval_releases:
        console.print(
            f"{where}: DP evaluation, {r.eval_releases} "
            f"noisy counts per trial at sigma_e = {r.eval_noise_multiplier or 0:.4g} "
            f"(the evaluations alone: ε {r.epsilon_eval or 0:.4g}; included in the grid's ε)"
        )
    if r.tuned_on is not None:
        score = "n/a" if r.tuned_score is None else f"{r.tuned_score:.4g}"
        console.print(
            f"{where}: tuned on {r.tuned_on} (public records, no epsilon spent): best "
            f"{_point(r.tuned_params or {})} ({metric} {score}); private "
            f"grid centred: {_point(r.tuned_grid or {})}"
        )
    for w in r.warnings:
        console.print(f"[bold yellow]warning[/bold yellow] ({where}): {w}")


def _point(values: dict[str, Any]) -> str:
    """A point or a grid, short: ``lr=2, clip=[0.1, 1]``, ``lr=logspace[-1, 1] k=3``."""

    def one(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        if isinstance(v, list):
            return "[" + ", ".join(one(x) for x in v) + "]"
        if isinstance(v, dict) and "k" in v:
            kind = "logspace" if "logspace" in v else "linspace"
            return f"{kind}{one([float(x) for x in v[kind]])} k={v['k']}"
        return str(v)

    return ", ".join(f"{k}={one(v)}" for k, v in values.items())
