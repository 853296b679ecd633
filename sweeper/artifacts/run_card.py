"""The model card of a one-off run (``dpsweep train -o DIR``), beside its weights.

It has the format of a sweep's card (:mod:`sweeper.artifacts.cards`: ``format``,
``card_version``, ``model``, ``dataset`` with ``input_scaling`` and ``split``, ``privacy``,
``evaluation``, ``metrics``, ``warnings``), with ``kind: train`` and a ``run`` section instead
of a sweep's ``trial``. Its epsilon is the run's own, labelled as such: the run is a release of
its own, charged to its dataset's lifetime budget (:mod:`sweeper.runs.one_off_charge`).

Everything on it is the run's own settings, what the charge recorded and the metrics the run
printed; the dataset's sizes are the planning sizes (a stored dataset's declared ones). No
torch: the weights arrive as bytes' hash and size.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from dpsweep.plan_fields import unit_suffix
from sweeper.artifacts.card_finetuning import finetuning_markdown, run_finetuning
from sweeper.artifacts.card_markdown import inputs_text
from sweeper.artifacts.card_texts import (
    NOT_PRIVATE_WARNING,
    SEED_REPRODUCIBLE,
    SEED_SECRET,
    SPLIT_METHODS,
)
from sweeper.artifacts.cards import CARD_FORMAT, CARD_VERSION, dpsweep_version
from sweeper.runs.single_run import PreparedRun

#: What a one-off run's epsilon covers (the run is its own release).
RUN_COVERS = (
    "this one training run (a one-trial grid), charged to the dataset's lifetime budget; "
    "this model is that run's only release"
)
CARVE_OUT_STATEMENT = (
    "ε covers the training records only: the held-out evaluation split is treated as public, "
    "and the metrics computed on it (and the choice of the best checkpoint) are released "
    "without DP"
)


def training_run_card(
    prepared: PreparedRun,
    summary: Mapping[str, Any],
    *,
    dataset: str,
    charge: Mapping[str, Any] | None,
    model: Mapping[str, Any],
    weights_sha256: str,
    weights_size_bytes: int,
) -> dict[str, Any]:
    """The card of a ``dpsweep train`` run's best checkpoint.

    Args:
        prepared: The run as planned (:func:`sweeper.runs.single_run.prepare_single_run`).
        summary: The trial's summary (:meth:`workers.training.specs.TrialResult.summary`).
        dataset: The dataset as the user named it (``loader:path`` for a file).
        charge: What the ledger was charged (None: a non-private run, nothing charged).
        model: What rebuilds the architecture (the result's ``model_info``).
        weights_sha256: The hex SHA-256 of the safetensors file.
        weights_size_bytes: Its size.

    Returns:
        The card, JSON-serialisable.
    """
    run = prepared.run
    private = prepared.noise_multiplier is not None and charge is not None
    reproducible = run.reproducible
    warnings = [] if private else [NOT_PRIVATE_WARNING]
    if reproducible:
        warnings.append(str(summary.get("warning") or "reproducible mode: not private"))
    return {
        "format": CARD_FORMAT,
        "card_version": CARD_VERSION,
        "kind": "train",
        "dpsweep_version": dpsweep_version(),
        "run": {
            "id": None if charge is None else charge["run"],
            "strategy": run.strategy,
            "hyperparameters": dict(prepared.params) | {"lr": run.lrs[0]},
            "seed": run.seed,
            "seed_seeds": SEED_REPRODUCIBLE if reproducible else SEED_SECRET,
            "steps": prepared.steps,
            "best_step": summary.get("best_step"),
        },
        "dataset": _dataset_section(prepared, dataset),
        "model": dict(model)
        | {
            "weights": {
                "format": "safetensors",
                "sha256": weights_sha256,
                "size_bytes": int(weights_size_bytes),
            }
        },
        # Where the weights started and what DP-SGD trained of them.
        "finetuning": run_finetuning(prepared),
        "privacy": _privacy_section(prepared, summary, charge, private=private),
        "evaluation": {"mode": "carve-out", "statement": CARVE_OUT_STATEMENT},
        "metrics": {
            "best_step": summary.get("best_step"),
            "values": {
                k: summary[k] for k in ("accuracy", "loss", "mse", "ece", "mce") if k in summary
            },
        },
        "warnings": warnings,
        "created_at": datetime.now(UTC).isoformat(),
    }


def _dataset_section(prepared: PreparedRun, dataset: str) -> dict[str, Any]:
    """The dataset as the run read it: its name, the input scaling the model expects, and the
    settings that rebuild its evaluation split."""
    d = prepared.spec.dataset
    data = prepared.data
    return {
        "name": dataset,
        "n_train": int(data.planning_n_train),
        "eval_mode": "carve-out",
        # How the model's inputs were scaled and bounded: a user of the model needs it.
        "input_scaling": dict(data.input_scaling or {}),
        "split": {
            "loader": d.name,
            "path": d.path,
            "labels_path": d.labels_path,
            "label_column": d.label_column,
            "options": dict(d.options or {}),
            "eval_mode": "carve-out",
            "split_seed": d.split_seed,
            "test_fraction": d.test_fraction,
            "method": SPLIT_METHODS.get("carve-out", "carve-out"),
            "input_bounds": None if d.input_bounds is None else list(d.input_bounds),
            "feature_clip": d.feature_clip,
        },
    }


def _privacy_section(
    prepared: PreparedRun,
    summary: Mapping[str, Any],
    charge: Mapping[str, Any] | None,
    *,
    private: bool,
) -> dict[str, Any]:
    """The run's own release: the epsilon charged, and sigma, q and T it was computed from."""
    run = prepared.run
    base: dict[str, Any] = {
        "private": private,
        "randomness": summary.get("randomness", "secret"),
    }
    if not private or charge is None:
        return base | {"epsilon": None, "delta": None, "warning": NOT_PRIVATE_WARNING}
    return base | {
        # The charge is this model's release: the epsilon spent to release it.
        "epsilon": charge["epsilon_charged"],
        "delta": charge["delta_charged"],
        # What one unit of the epsilon protects: example (a row) or the data's unit (a person).
        "privacy_unit": prepared.privacy_unit,
        "covers": RUN_COVERS + unit_suffix(prepared.privacy_unit),
        "accountant": run.accountant,
        "noise_multiplier": prepared.noise_multiplier,
        "sample_rate": prepared.sample_rate,
        "steps": prepared.steps,
        "ledger_run": charge["run"],
        "warning": None,
    }


def render_run_card_markdown(card: Mapping[str, Any]) -> str:
    """The README.md beside a ``dpsweep train`` model: what it is, its ε and what it covers,
    its metrics and how its inputs are scaled."""
    r, d, m, p = card["run"], card["dataset"], card["model"], card["privacy"]
    lines = [
        f"# Model card: {m.get('name')} from a `dpsweep train` run",
        "",
        f"Trained by dpsweep {card.get('dpsweep_version')} with strategy `{r['strategy']}` on "
        f"dataset `{d['name']}`.",
        "",
    ]
    if card.get("warnings"):
        lines += ["## Warnings", "", *(f"- **{w}**" for w in card["warnings"]), ""]
    lines += ["## Privacy", ""]
    if not p["private"]:
        lines.append(f"- {NOT_PRIVATE_WARNING}")
    else:
        lines += [
            f"- ε = {p['epsilon']:.4g}{unit_suffix(p.get('privacy_unit'))} at δ = "
            f"{p['delta']:g} (this run alone): covers "
            f"{p['covers']}.",
            f"- σ = {p['noise_multiplier']:.4g}, q = {p['sample_rate']:.4g}, T = {p['steps']} "
            f"steps, accountant `{p['accountant']}`.",
        ]
    metrics = card["metrics"]["values"]
    lines += [
        f"- Randomness: {p['randomness']}.",
        "",
        "## Evaluation",
        "",
        f"{card['evaluation']['statement']}.",
        "",
        f"## Metrics (best checkpoint, step {card['metrics'].get('best_step')})",
        "",
        "| metric | value |",
        "| --- | --- |",
        *(f"| {k} | {v:.4g} |" for k, v in sorted(metrics.items()) if v is not None),
        "",
        "## Model",
        "",
        f"- Architecture `{m.get('name')}` with options `{json.dumps(m.get('options') or {})}`, "
        f"input shape {m.get('input_shape')}, {m.get('num_classes')} classes.",
        f"- Weights: safetensors, {m['weights']['size_bytes']} bytes, sha256 "
        f"`{m['weights']['sha256']}`.",
        f"- Hyperparameters: `{json.dumps(r['hyperparameters'], sort_keys=True)}`; seed "
        f"{r['seed']} ({r['seed_seeds']}).",
        f"- Input scaling: `{json.dumps(d.get('input_scaling') or {}, sort_keys=True)}`.",
        f"- Inputs: {inputs_text(card)}.",
        "",
        *finetuning_markdown(card.get("finetuning")),
    ]
    return "\n".join(lines)
