"""Model cards: what a kept model is and how private it is, stored beside its weights.

A card is plain JSON (:func:`model_card`, written by :func:`card_bytes`) with a short Markdown
rendering (:func:`render_card_markdown`, the README.md beside a downloaded model). It says
which trial trained the model (strategy, hyperparameters, seed), on which dataset, with which
architecture and weights, the epsilon and delta of the releases it belongs to (its grid and
the whole sweep) with the accountant and verifier, sigma, q and T, what the evaluation data
was and whether epsilon covers it, and the best checkpoint's metrics. Its
``dataset.split`` (card version 2) holds every setting the workers loaded the data with (the
loader, split seed, test fraction, bounds, declared classes...), so the evaluation split can
be rebuilt and the metrics checked (``dpsweep model TRIAL --check``).

Everything on a card is already public elsewhere: every figure is read from the stored plan,
the trial row and its result through the functions that build the sweep's summary
(:mod:`sweeper.privacy.releases`, :mod:`sweeper.sweeps.released`), never computed anew from
the records. In particular:

* the dataset is named as users see it, with its owner's view (split seed, test fraction,
  input bounds, feature clip, declared classes: :mod:`sweeper.datasets.fixed_view`; its
  analysts read the same view); the identity of its records (a hash of every record,
  :mod:`sweeper.datasets.identity`) is operator-only and never on a card;
* a trial's own epsilon appears only as ``single_run_epsilon``, labelled as what one run alone
  would cost; the grid's epsilon is what its release spent;
* a papernot-steinke grid's card is that of its selected trial only (anything else is
  refused) and carries no position, timestamp or duration: each would bound the secret number
  of runs (:mod:`sweeper.sweeps.released`);
* an analyst's card (their sweep on another tenant's data) has its times and duration rounded
  to 10 s, as the analyst reads them everywhere (:mod:`sweeper.datasets.analyst_clock`).

This module imports no torch: the weights arrive as a hash and a size. The card's fixed
sentences are :mod:`sweeper.artifacts.card_texts`, and its Markdown rendering
:mod:`sweeper.artifacts.card_markdown` (:func:`render_card_markdown`, re-exported here).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from dpsweep import __version__
from dpsweep.errors import ConfigError, IllegalState
from dpsweep.plan import GridPlan, SweepPlan
from sweeper.artifacts.card_finetuning import trial_finetuning
from sweeper.artifacts.card_markdown import render_card_markdown
from sweeper.artifacts.card_texts import (
    CLASSES_NOTE,
    IDENTITY_NOTE,
    NOT_PRIVATE_WARNING,
    SEED_REPRODUCIBLE,
    SEED_SECRET,
    SELECTED_NOTE,
    SINGLE_RUN_NOTE,
    SPLIT_CHECK,
    SPLIT_METHODS,
)
from sweeper.datasets.analyst_clock import analyst_names, coarse_time, for_analyst
from sweeper.datasets.grants import dataset_row
from sweeper.privacy.releases import evaluation_statement, grid_releases, sweep_release_of
from sweeper.store import Sweep, Trial, TrialResultRow, TrialState
from sweeper.sweeps.released import selected_trial, trial_record
from sweeper.sweeps.stored import grid_key, hidden_grids, randomness_fields, typed_spec
from workers.strategies import get_descriptor

#: 2: ``dataset.split`` (the settings that rebuild the evaluation split) was added.
CARD_VERSION = 2
CARD_FORMAT = "dpsweep-model-card"

#: What trial_record(selected_only=True) blanks: a papernot-steinke card leaves them out.
POSITION_KEYS = ("number", "started_at", "finished_at", "train_seconds")


def model_card(
    session: Session,
    trial: Trial,
    *,
    model: dict[str, Any],
    weights_sha256: str,
    weights_size_bytes: int,
) -> dict[str, Any]:
    """The model card of a finished trial's best checkpoint.

    Args:
        session: A session of the store (the trial's sweep, and its grid's trials for a
            papernot-steinke grid, are read through it).
        trial: The trial, state ``done``, with its result loaded.
        model: What rebuilds the architecture (:func:`workers.checkpoints.model_info`).
        weights_sha256: The hex SHA-256 of the safetensors file.
        weights_size_bytes: Its size.

    Returns:
        The card, JSON-serialisable (non-finite numbers become null).

    Raises:
        IllegalState: the trial is not done, has no result, or is a papernot-steinke trial
            that its grid does not release (not the selected one, or its search is not
            complete): such a model must never be kept.
    """
    result = trial.result
    if trial.state != TrialState.done or result is None:
        raise IllegalState(f"trial {trial.id} is not done with a result: it has no model")
    released = _released_grid(session, trial)
    sweep, plan, grid = released.sweep, released.plan, released.grid
    selected_only = released.selected_only
    randomness = randomness_fields(sweep.spec or {})
    private = _is_private(trial.strategy, grid, result.epsilon)
    analyst = bool(analyst_names(session, sweep.owner, [sweep.dataset]))

    warnings = [w for w in (randomness["warning"],) if w]
    if not private:
        warnings.insert(0, NOT_PRIVATE_WARNING)
    card: dict[str, Any] = {
        "format": CARD_FORMAT,
        "card_version": CARD_VERSION,
        "dpsweep_version": dpsweep_version(),
        "trial": _trial_section(trial, sweep, randomness["randomness"], selected_only, analyst),
        "dataset": _dataset_section(session, sweep, grid),
        "model": _model_section(model, weights_sha256, weights_size_bytes),
        # Where the weights started (a checkpoint's digest and declaration) and what DP-SGD
        # trained of them, as the grid's plan states it.
        "finetuning": trial_finetuning(
            sweep.spec or {},
            grid,
            trial.arm,
            trial.params or {},
            pretrained=model.get("pretrained"),
        ),
        "privacy": _privacy_section(trial, sweep, plan, grid, private, randomness, selected_only),
        "evaluation": _evaluation_section(plan, grid),
        "metrics": _metrics_section(result, metric=released.metric, mode=released.mode),
        "warnings": warnings,
    }
    if not selected_only:
        now = datetime.now(UTC)
        card["created_at"] = coarse_time(now) if analyst else now.isoformat()
    return _clean(card)


def card_bytes(card: dict[str, Any]) -> bytes:
    """The card as canonical JSON: sorted keys, indent 2, UTF-8, a trailing newline (the same
    card always gives the same bytes, so its hash identifies it).

    Raises:
        ValueError: the card holds a non-finite number (:func:`model_card` never does).
    """
    text = json.dumps(card, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False)
    return (text + "\n").encode("utf-8")


def dpsweep_version() -> str:
    """The installed dpsweep's version (the source tree's, when it runs uninstalled)."""
    try:
        return version("dpsweep")
    except PackageNotFoundError:
        return __version__


# ---------------------------------------------------------------------------------------------
# Sections


@dataclass(frozen=True)
class _ReleasedGrid:
    """A trial's sweep and the planned grid its model belongs to, with the sweep's objective."""

    sweep: Sweep
    plan: Sequence[GridPlan]
    grid: GridPlan
    selected_only: bool  # a papernot-steinke grid: only its selected trial is released
    metric: str
    mode: str


def _released_grid(session: Session, trial: Trial) -> _ReleasedGrid:
    """The trial's sweep and planned grid, refusing a trial whose grid was never planned and a
    papernot-steinke trial its grid does not release (:func:`_check_selected`).

    Raises:
        IllegalState: no sweep, a grid outside the plan, or a trial its grid does not release.
    """
    sweep = session.get(Sweep, trial.sweep_id)
    if sweep is None:
        raise IllegalState(f"trial {trial.id} has no sweep")
    spec = typed_spec(sweep)
    metric, mode = spec.objective.metric, spec.objective.mode
    plan = SweepPlan.from_stored(sweep.plan).grids
    key = grid_key(trial.arm, trial.epsilon_budget)
    grid = next((g for g in plan if g.grid == key), None)
    if grid is None:
        # Nothing was planned (so nothing accounted) for this trial's grid: no card.
        raise IllegalState(f"trial {trial.id}'s grid {key!r} is not in its sweep's plan")
    selected_only = key in hidden_grids(sweep)
    if selected_only:
        _check_selected(session, trial, metric=metric, mode=mode)
    return _ReleasedGrid(sweep, plan, grid, selected_only, metric, mode)


def _model_section(model: dict[str, Any], sha256: str, size_bytes: int) -> dict[str, Any]:
    """What rebuilds the architecture, and the weights file's format, hash and size."""
    return dict(model) | {
        "weights": {
            "format": "safetensors",
            "sha256": sha256,
            "size_bytes": int(size_bytes),
        }
    }


def _evaluation_section(plan: Sequence[GridPlan], grid: GridPlan) -> dict[str, Any]:
    """What the evaluation data was and whether epsilon covers it, with the grid's evaluation
    releases and their noise."""
    return evaluation_statement(plan) | {
        "eval_releases": grid.eval_releases,
        "eval_noise_multiplier": grid.eval_noise_multiplier,
        "epsilon_eval": grid.epsilon_eval,
    }


def _metrics_section(result: TrialResultRow, *, metric: str, mode: str) -> dict[str, Any]:
    """The objective and the best checkpoint's released metrics."""
    return {
        "metric": metric,
        "mode": mode,
        "best_step": result.best_step,
        # The released best-checkpoint metrics, exactly as the trial's record shows them
        # (for DP evaluation, the noisy accuracy the row holds and nothing else).
        "values": {k: v for k, v in (result.metrics or {}).items() if k != "reliability"},
    }


def _check_selected(session: Session, trial: Trial, *, metric: str, mode: str) -> None:
    """Refuse a papernot-steinke trial its grid does not release (see
    :func:`sweeper.sweeps.released.selected_trial`)."""
    trials = list(
        session.scalars(
            select(Trial)
            .where(
                Trial.sweep_id == trial.sweep_id,
                Trial.arm == trial.arm,
                Trial.epsilon_budget == trial.epsilon_budget,
            )
            .options(selectinload(Trial.result))
        )
    )
    best = selected_trial(trials, metric=metric, mode=mode)
    if best is None or best.id != trial.id:
        # The message names neither the selected trial nor a count: both are secret.
        raise IllegalState(
            f"trial {trial.id} is not released by its papernot-steinke grid: only the selected "
            "trial of a completed search has a model"
        )


def _is_private(strategy: str, grid: GridPlan, single_run_epsilon: float | None) -> bool:
    """Whether the model is DP: a private strategy, planned with an epsilon, that ran with
    one. Anything unknown reads as not private (a card must never claim more than holds)."""
    try:
        strategy_private = bool(get_descriptor(strategy).private)
    except ConfigError:
        strategy_private = False
    return strategy_private and math.isfinite(grid.epsilon_total) and single_run_epsilon is not None


def _trial_section(
    trial: Trial, sweep: Sweep, randomness: str, selected_only: bool, analyst: bool
) -> dict[str, Any]:
    """The trial as its released record shows it (to its analyst, ``analyst``: coarse
    times), without its metrics (see ``metrics``)."""
    rec = trial_record(trial, selected_only=selected_only)
    rec = for_analyst(rec) if analyst else rec
    out: dict[str, Any] = {
        "id": trial.id,
        "sweep": sweep.id,
        "sweep_name": sweep.name,
        "arm": rec["arm"],
        "strategy": rec["strategy"],
        "epsilon_budget": rec["epsilon_budget"],
        "hyperparameters": dict(rec["params"] or {}),
        "seed": rec["seed"],
        "seed_seeds": SEED_REPRODUCIBLE if randomness == "reproducible" else SEED_SECRET,
        "steps": rec["steps"],
        "best_step": rec["best_step"],
    }
    if not selected_only:
        out |= {k: rec[k] for k in POSITION_KEYS}
    return out


def _dataset_section(session: Session, sweep: Sweep, grid: GridPlan) -> dict[str, Any]:
    """The dataset by its name, with the sizes and input scaling the summary's plan shows, and
    the settings that rebuild its evaluation split (:func:`split_section`)."""
    return {
        "name": sweep.dataset,
        "identity": None,
        "identity_note": IDENTITY_NOTE,
        "n_train": grid.n_train,
        "n_eval": grid.n_eval,
        # With a privacy unit, n_train and n_eval count units (people), not records.
        "privacy_unit": grid.privacy_unit,
        "eval_mode": grid.eval_mode or "carve-out",
        "eval_dataset": grid.eval_dataset,
        # How the model's inputs were scaled and bounded: a user of the model needs it.
        "input_scaling": grid.input_scaling,
        "split": split_section(session, sweep),
    }


def split_section(session: Session, sweep: Sweep) -> dict[str, Any]:
    """What rebuilds a sweep's evaluation split: the dataset section of its stored spec (which
    carries its owner's view, :func:`sweeper.datasets.fixed_view.apply_view`: the values the
    workers loaded it with), its evaluation mode and dataset, and the declared class list.

    All of it is what the sweep's viewer already sees: the spec they submitted (with the
    owner's view filled in) and the dataset's view, which its analysts read too.
    """
    spec = typed_spec(sweep)
    d, ev = spec.dataset, spec.eval
    mode = str(ev.mode or "carve-out")
    row = dataset_row(session, d.name)
    classes = None if row is None else (row.config or {}).get("classes")
    return {
        "loader": d.name,
        "path": d.path,
        "labels_path": d.labels_path,
        "label_column": d.label_column,
        "options": dict(d.options or {}),
        "eval_mode": mode,
        "eval_dataset": ev.dataset,
        "split_seed": d.split_seed,
        "test_fraction": d.test_fraction,
        "method": SPLIT_METHODS.get(mode, mode),
        "input_bounds": None if d.input_bounds is None else list(d.input_bounds),
        "feature_clip": d.feature_clip,
        "classes": None if classes is None else [str(c) for c in classes],
        "classes_note": CLASSES_NOTE,
        "check": SPLIT_CHECK,
    }


def _privacy_section(
    trial: Trial,
    sweep: Sweep,
    plan: Sequence[GridPlan],
    grid: GridPlan,
    private: bool,
    randomness: dict[str, Any],
    selected_only: bool,
) -> dict[str, Any]:
    """The releases the model belongs to (its grid, the sweep) and the mechanism's figures."""
    result = trial.result
    assert result is not None
    base: dict[str, Any] = {
        "private": private,
        "randomness": randomness["randomness"],
        "randomness_warning": randomness["warning"],
    }
    if not private:
        return base | {
            "epsilon": None,
            "delta": None,
            "warning": NOT_PRIVATE_WARNING,
            "single_run_epsilon": None,
        }
    release = next(g for g in grid_releases(plan) if g["grid"] == grid.grid)
    release |= {
        "verifier": grid.verifier,
        "epsilon_verified_lower": grid.epsilon_verified_lower,
        "epsilon_verified_upper": grid.epsilon_verified_upper,
    }
    out = base | {
        # The model belongs to its grid's release: that epsilon is what releasing it spent.
        "epsilon": release["epsilon"],
        "delta": release["delta"],
        # What one unit of every epsilon here protects: example (a row) or a person.
        "privacy_unit": grid.privacy_unit,
        "covers": release["covers"],
        "grid": release,
        # As the summary shows it: stored by the driver for this plan, else computed.
        "sweep": sweep_release_of(sweep),
        "accounting": grid.accounting,
        "accountant": grid.accountant,
        "verification": {
            "verified_by": grid.verified_by,
            "verifier": grid.verifier,
            "epsilon_verified": grid.epsilon_verified,
            "epsilon_verified_lower": grid.epsilon_verified_lower,
            "epsilon_verified_upper": grid.epsilon_verified_upper,
        },
        "noise_multiplier": trial.noise_multiplier,
        "gradient_noise_multiplier": grid.gradient_noise_multiplier,
        "sample_rate": grid.sample_rate,
        "steps": grid.steps_per_trial,
        "target_delta": trial.target_delta,
        "single_run_epsilon": {
            "epsilon": result.epsilon,
            "delta": result.delta,
            "accountant": result.accountant,
            "note": SINGLE_RUN_NOTE,
        },
        "warning": None,
    }
    if selected_only:
        out |= {"selected_trial": True, "selection": SELECTED_NOTE}
    return out


def _clean(value: Any) -> Any:
    """JSON cannot carry NaN or infinities; they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


__all__ = [
    "CARD_FORMAT",
    "CARD_VERSION",
    "NOT_PRIVATE_WARNING",
    "card_bytes",
    "dpsweep_version",
    "model_card",
    "render_card_markdown",
    "split_section",
]
