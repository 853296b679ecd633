"""The public view of a grid's plan, declared once: which fields of
:class:`dpsweep.plan.GridPlan` each reader shows, under what label, with what help.

Every public view of a plan is derived from :data:`PUBLIC_PLAN_FIELDS`: the CLI's
``dpsweep plan --json`` keys and its table's headers and cell formats (``api/cli/plan_view.py``),
a stored sweep's summary (``sweeper/sweeps/summary.py``: the API, ``dpsweep show --json``, the
export), the API's dry run and its OpenAPI schema (``api.schemas.PlanGrid``, whose titles and
descriptions the dashboard reads for its plan tables' headers), and the SDK, which returns the
server's JSON as it comes (the keys are :func:`public_fields` of :data:`SUMMARY` and
:data:`DRY_RUN`).

The fields a grid plan keeps inside (its charge schedule, the records' hash, the second
accountant's error bars, a papernot-steinke grid's shape of the number of runs) are in no view.
A field is shown only in the views that list it: a view never gains one by accident. A stored
sweep's ``trials`` is its number of stored runs, which a grid that releases only its selected
trial (papernot-steinke) keeps secret: :func:`public_view` leaves it out there.

This module is part of the light contract package: it imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from dpsweep.plan import EXAMPLE_UNIT, GridPlan

__all__ = [
    "CLI",
    "DRY_RUN",
    "PUBLIC_PLAN_FIELDS",
    "SUMMARY",
    "PublicPlanField",
    "View",
    "per_unit",
    "plan_field",
    "public_fields",
    "public_view",
    "unit_suffix",
]

#: A reader of plans: ``dpsweep plan --json`` (the operator's local dry run), a stored
#: sweep's summary, and the API's dry run (``POST /api/v1/sweeps:plan``).
View = Literal["cli", "summary", "dry_run"]
CLI: View = "cli"
SUMMARY: View = "summary"
DRY_RUN: View = "dry_run"

_ALL: frozenset[View] = frozenset({CLI, SUMMARY, DRY_RUN})


@dataclass(frozen=True)
class PublicPlanField:
    """One public field of a grid's plan.

    Attributes:
        name: the :class:`~dpsweep.plan.GridPlan` field, and its key in every view.
        label: a table's column header (the CLI's table; the API schema's title).
        help: what it means (the API schema's description).
        views: the views that show it.
        fmt: a table cell's format spec (``format(value, fmt)``; empty: the value as text).
    """

    name: str
    label: str
    help: str = ""
    views: frozenset[View] = _ALL
    fmt: str = ""

    def cell(self, value: Any) -> str:
        """``value`` as a table cell shows it."""
        return format(value, self.fmt)


def _f(name: str, label: str, help: str = "", *, fmt: str = "", only: str = "") -> PublicPlanField:
    # ``only``: the views that show it, comma-separated (empty: all three).
    views: frozenset[View] = frozenset(only.split(",")) if only else _ALL  # type: ignore[arg-type]
    return PublicPlanField(name, label, help, views, fmt)


_SIGMA = ".4g"

#: Every public field, in the order ``dpsweep plan --json`` writes them.
PUBLIC_PLAN_FIELDS: tuple[PublicPlanField, ...] = (
    _f("arm", "arm"),
    _f("strategy", "strategy"),
    _f("epsilon_budget", "level ε", "the grid's epsilon level", fmt="g"),
    _f("delta", "δ"),
    _f(
        "trials",
        "trials",
        "planned runs (the mean for papernot-steinke); in a sweep's summary, the runs stored, "
        "left out for a grid that releases only its selected trial",
    ),
    _f("steps_per_trial", "steps", "T: the steps of one run"),
    _f("sample_rate", "q", "the Poisson sampling rate", fmt=_SIGMA),
    _f("noise_multiplier", "σ", "the noise multiplier every run of the grid uses", fmt=_SIGMA),
    _f(
        "epsilon_per_trial",
        "ε per trial",
        "what one run alone would cost (a single run's epsilon, not a spend)",
        fmt=_SIGMA,
    ),
    _f("epsilon_total", "grid ε", "the grid's epsilon: releasing all its trials", fmt=_SIGMA),
    _f("epsilon_verified", "verified ε", "the grid's epsilon by a second accountant", fmt=_SIGMA),
    _f("accounting", "accounting", "how the grid's runs compose"),
    _f("delta_per_trial", "δ per trial", only=CLI),
    _f(
        "gradient_noise_multiplier",
        "σ_g",
        "the gradient's own multiplier once a second query has split sigma (null in the dry "
        "run where nothing is split)",
        fmt=_SIGMA,
    ),
    _f("accountant", "accountant", "the accountant that calibrated sigma"),
    _f("verified_by", "verified by", "the second accountant", only=f"{CLI},{SUMMARY}"),
    _f("release", "release", "all, or selected-only (papernot-steinke)", only=f"{CLI},{SUMMARY}"),
    _f(
        "retries",
        "retries",
        "runs reserved for re-running interrupted trials",
        only=f"{SUMMARY},{DRY_RUN}",
    ),
    _f("input_scaling", "input scaling", "how the dataset's inputs are scaled and bounded"),
    _f("count_noise", "σ_b", "quantile: the count noise sigma_b chosen (spec left it out)"),
    _f("warnings", "warnings", "judgements to read (e.g. high noise), not refusals"),
    _f(
        "privacy_unit",
        "privacy unit",
        "what one unit of every epsilon protects: example (each row its own unit) or the "
        "dataset's unit (e.g. person): epsilon is then per unit, all of its rows together, and "
        "q, T, N and the evaluation counts are in units",
    ),
    _f(
        "n_train",
        "train records",
        "records the epsilon covers (with a privacy unit: units)",
        only=f"{CLI},{SUMMARY}",
    ),
    _f(
        "n_eval",
        "evaluation records",
        "the evaluation carve-out (with a privacy unit: units)",
        only=f"{CLI},{SUMMARY}",
    ),
    _f(
        "eval_mode",
        "evaluation",
        "how the evaluation records are protected: carve-out (unprotected), public (a dataset "
        "declared public) or dp (noisy accuracy, charged in this grid)",
    ),
    _f("eval_dataset", "evaluation dataset", "public: the evaluation dataset"),
    _f("eval_releases", "noisy evaluations", "dp: noisy counts per trial"),
    _f("eval_noise_multiplier", "σ_e", "dp: the noise multiplier of each noisy count", fmt=_SIGMA),
    _f("epsilon_eval", "evaluation ε", "dp: what the grid's evaluations alone cost (included)"),
    _f(
        "engine_path",
        "engine path",
        "the engine path its model trains on: packed (the fast batched path), generic (any "
        "nn.Module; per-example gradients from torch.func) or auto (decided when the model is "
        "built, for a plug-in)",
    ),
    _f(
        "tuned_on",
        "tuned on (public)",
        "public pre-tuning (the arm's tune_on): the public dataset the grid's points were "
        "trained on first, at this grid's noise multiplier (no epsilon spent)",
    ),
    _f("tuned_params", "best there", "the best point on the public records (lr included)"),
    _f("tuned_score", "its score", "its objective on the public records"),
    _f(
        "tuned_grid",
        "private grid centred on it",
        "the grid centred on the best point, which the trials are created from (same size as "
        "the spec's grid)",
    ),
    _f(
        "tuned_at",
        "tuned at (small batch)",
        "tuning small, then scaling (training.tune_batch_scale r): the public tuning's logical "
        "batch B / r and noise multiplier sigma / r (sigma / B as the private grid's, which "
        "runs at the full batch)",
    ),
    _f(
        "checkpoint",
        "checkpoint",
        "where the weights start: the registered checkpoint's name, kind and digest (the "
        "sha256 of its files, pinned in the stored spec) and its registration's declaration "
        "(trained_on: the public data it saw; private_records_seen: false); null: random "
        "initial weights",
    ),
    _f(
        "pretrained_on",
        "pre-trained on (public)",
        "public pre-training (model.pretrain_on): the public dataset the model is first trained "
        "on without noise (epsilon 0, nothing charged); the trials start from those weights, "
        "whose digest the model card gives; null: none",
    ),
    _f("trainable", "trained", "what DP-SGD trains: all, head, lora (r ...) or name patterns"),
    _f(
        "trained_parameters",
        "trained parameters",
        "parameters DP-SGD trains (clipped and noised) in a run of the grid; the fewest where "
        "a lora_r axis gives several ranks",
    ),
    _f(
        "trained_parameters_max",
        "at most",
        "the most trained parameters a run of the grid has (its largest LoRA rank)",
    ),
    _f(
        "total_parameters",
        "of total",
        "every parameter of the model as a run builds it (frozen ones included; LoRA's "
        "adapters at the largest rank)",
    ),
)

_BY_NAME = {f.name: f for f in PUBLIC_PLAN_FIELDS}


def per_unit(privacy_unit: str | None) -> str:
    """What follows an epsilon's figure in a label: ``" per person"``, or nothing for
    example-level DP (None or ``example``: every existing label stays as it was)."""
    if privacy_unit is None or privacy_unit == EXAMPLE_UNIT:
        return ""
    return f" per {privacy_unit}"


def unit_suffix(privacy_unit: str | None) -> str:
    """What follows an epsilon's figure where it is printed in full: ``" per person (unit:
    person)"``, or nothing for example-level DP. The unit is named twice on purpose: the
    first reads as a sentence, the second is the column (or array) that defines it."""
    short = per_unit(privacy_unit)
    return f"{short} (unit: {privacy_unit})" if short else ""


def plan_field(name: str) -> PublicPlanField:
    """The public field ``name``.

    Raises:
        KeyError: no public field of that name.
    """
    return _BY_NAME[name]


def public_fields(view: View) -> tuple[PublicPlanField, ...]:
    """The fields ``view`` shows, in order."""
    return tuple(f for f in PUBLIC_PLAN_FIELDS if view in f.views)


def public_view(plan: GridPlan, view: View, *, hide_count: bool = False) -> dict[str, Any]:
    """``plan`` as ``view`` shows it: its public fields' stored (JSON) values.

    In a stored sweep's :data:`SUMMARY`, ``trials`` is the number of stored runs
    (``planned_trials``), written last, and left out where ``hide_count`` (a grid that releases
    only its selected trial: its number of runs is secret).
    """
    stored = plan.to_stored()
    shown = {f.name: stored[f.name] for f in public_fields(view)}
    if view == SUMMARY:
        del shown["trials"]
        if not hide_count:
            shown["trials"] = plan.planned_trials
    return shown
