"""Checking a kept model against its card: rebuild the evaluation split, re-evaluate, compare.

``dpsweep model TRIAL --check`` comes here. The evaluation split is rebuilt from the card's
``dataset.split`` (card version 2; for older cards, from the sweep's stored spec) through the
code the workers use (:func:`sweeper.datasets.resolution.resolve`, then
:func:`workers.datasets.loading.load_dataset`), and the model is measured with the trainer's
own metrics (:func:`workers.metrics.classification_metrics`), so a model that is the one the
card describes scores what the card says:

* exactly evaluated metrics (eval modes ``carve-out`` and ``public``) match up to float
  rounding: accuracy within one evaluation record (another forward pass may flip a prediction
  whose two best logits tie to rounding), loss and mse within a relative 1e-4;
* a DP-evaluated accuracy (eval mode ``dp``) is a noisy count of correct predictions over the
  declared number of evaluation records: it differs from the exact one by Gaussian noise of
  std ``sigma_e / n``, and the card's is the best of ``R`` noisy evaluations, so the check
  allows ``z * sigma_e / n`` with ``z`` such that all ``R`` noise draws stay below it with
  probability 0.999 (a union bound), plus one record.

**Privacy.** The re-computed numbers come from the evaluation records themselves, un-noised.
The local command line reads the data, so its user is the data's owner; in mode ``dp`` those
records are private and the exact accuracy is said to be for the owner only (never a
release). Nothing here writes anywhere, and the records' identity is compared, never shown.

torch is imported only when a model is evaluated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from dpsweep.plan import GridPlan, SweepPlan
from sweeper.datasets.resolution import resolve
from sweeper.store import Sweep
from sweeper.store.artifact_files import sha256_hex
from sweeper.sweeps.stored import typed_spec
from workers.datasets.loading import load_dataset
from workers.datasets.raw_records import raw_evaluation_inputs
from workers.models.descriptors import get_model_descriptor

#: The probability that the check calls a DP-evaluated model that is its card's "differs".
DP_FALSE_ALARM = 1e-3
#: Relative tolerance of exactly evaluated real-valued metrics (loss, mse).
REL_TOLERANCE = 1e-4

DP_NOTE = (
    "the card's accuracy is a DP release: a noisy count of correct predictions (noise std "
    "σ_e = {sigma:.4g} on a count over {n} records, so {std:.3g} in accuracy), the best of "
    "{r} such evaluations; the check allows {tol:.3g} (all {r} noise draws stay below it with "
    "probability {p})"
)
RAW_NOTE = (
    "fed the raw evaluation records: the model file carries the input transform its trainer applied"
)
SCALED_NOTE = "fed the evaluation records scaled as the trainer scaled them: {reason}"
OWNER_ONLY = (
    "the re-computed accuracy is exact, from the private evaluation records: it is shown to "
    "you as the data's owner and is not a release; do not share it"
)


@dataclass(frozen=True)
class Comparison:
    """One metric: the card's value, the re-computed one and the tolerance allowed."""

    metric: str
    card: float | None
    measured: float
    tolerance: float
    noisy: bool = False

    @property
    def matches(self) -> bool:
        return self.card is not None and abs(self.measured - self.card) <= self.tolerance


@dataclass(frozen=True)
class CheckResult:
    """The outcome of :func:`check_model`."""

    eval_mode: str
    n_records: int
    comparisons: list[Comparison]
    #: Whether the records read now are those the sweep trained and evaluated on (None:
    #: the sweep's plan does not say).
    same_records: bool | None
    #: Whether the weights checked are those the card describes (its sha256).
    weights_match_card: bool
    notes: list[str] = field(default_factory=list)

    @property
    def matches(self) -> bool:
        compared = [c for c in self.comparisons if c.card is not None]
        return bool(compared) and all(c.matches for c in compared)


def split_settings(card: dict[str, Any], stored_spec: dict[str, Any] | None) -> dict[str, Any]:
    """The card's ``dataset.split``; for a card written before it (version 1), the same
    settings read from the sweep's stored spec (``stored_spec``)."""
    split = (card.get("dataset") or {}).get("split")
    if isinstance(split, dict):
        return dict(split)
    if stored_spec is None:
        raise ValueError(
            "the card has no dataset.split (it was written before cards carried it) and the "
            "sweep's spec is not available"
        )
    spec = typed_spec(stored_spec)
    d, ev = spec.dataset, spec.eval
    return {
        "loader": d.name,
        "path": d.path,
        "labels_path": d.labels_path,
        "label_column": d.label_column,
        "options": dict(d.options or {}),
        "eval_mode": str(ev.mode or "carve-out"),
        "eval_dataset": ev.dataset,
        "split_seed": d.split_seed,
        "test_fraction": d.test_fraction,
        "input_bounds": None if d.input_bounds is None else list(d.input_bounds),
        "feature_clip": d.feature_clip,
        "classes": None,  # the catalog's declaration, as resolution reads it
    }


def rebuild_split(engine: Engine | None, split: dict[str, Any]) -> Any:
    """The :class:`workers.datasets.records.Dataset` the workers loaded: the split's settings
    resolved as a sweep's are (:func:`sweeper.datasets.resolution.resolve`) and loaded.

    Raises:
        ConfigError, DatasetError: as resolution and loading (an unknown dataset, a file
            that is gone...).
    """
    return load_dataset(_split_spec(engine, split))


def _split_spec(engine: Engine | None, split: dict[str, Any]) -> Any:
    """The card's split settings as the workers' ``DatasetSpec`` (see :func:`rebuild_split`)."""
    dataset = {
        "name": split["loader"],
        "path": split.get("path"),
        "labels_path": split.get("labels_path"),
        "label_column": split.get("label_column"),
        "options": dict(split.get("options") or {}),
        "test_fraction": split.get("test_fraction", 0.2),
        "split_seed": split.get("split_seed", 0),
        "input_bounds": split.get("input_bounds"),
        "feature_clip": split.get("feature_clip"),
    }
    mode = str(split.get("eval_mode") or "carve-out")
    spec = resolve(engine, dataset, {"mode": mode, "dataset": split.get("eval_dataset")})
    if split.get("classes") is not None:
        # The class list the card states: the encoding the model was trained with.
        spec = replace(spec, classes=tuple(str(c) for c in split["classes"]))
    return spec


def measure(
    module: Any,
    data: Any,
    *,
    task: str,
    dp: bool,
    inputs: Any = None,
    chunk: int = 2048,
) -> dict[str, float]:
    """The model's metrics on ``data``'s evaluation split, computed as the trainer does.

    ``inputs``: what the model is fed, the raw evaluation records for a model that takes raw
    records (default: the scaled ones, ``data.x_test``, which a reconstruction is compared
    with either way).

    ``dp``: the exact count of correct predictions (a non-finite logit row counts as wrong, as
    in the noisy count) over the denominator the noisy count used
    (:attr:`workers.datasets.records.Dataset.planning_n_eval`): the noisy accuracy's mean.
    """
    # deferred: torch; no module of the sweeper layer imports it at import time
    import torch

    # deferred: workers.metrics pulls torch
    from workers.metrics import classification_metrics, reconstruction_metrics

    x = torch.from_numpy(data.x_test)
    fed = x if inputs is None else torch.from_numpy(inputs)
    y = torch.from_numpy(data.y_test)
    module.eval()
    outs = []
    with torch.no_grad():
        for start in range(0, fed.shape[0], chunk):
            outs.append(module(fed[start : start + chunk]))
    out = torch.cat(outs, dim=0).unsqueeze(0)
    if task != "classification":
        return {k: float(v) for k, v in reconstruction_metrics(out, x)[0].items()}
    if dp:
        ok = torch.isfinite(out[0]).all(dim=-1) & (out[0].argmax(dim=-1) == y)
        return {"accuracy": float(ok.sum()) / float(data.planning_n_eval)}
    m = classification_metrics(out, y)[0]
    return {k: float(m[k]) for k in ("accuracy", "loss") if k in m}


def dp_tolerance(*, noise_multiplier: float, n_eval: int, releases: int) -> float:
    """How far a DP-evaluated accuracy may be from the exact one (module docstring)."""
    z = NormalDist().inv_cdf(1.0 - DP_FALSE_ALARM / (2.0 * max(1, releases)))
    return z * noise_multiplier / n_eval + 1.0 / n_eval


def check_model(
    engine: Engine,
    card: dict[str, Any],
    weights: bytes,
    *,
    sweep_id: str | None = None,
) -> CheckResult:
    """Rebuild the card's evaluation split, evaluate ``weights`` on it, compare with the card.

    Args:
        engine: The local database (catalog datasets are resolved through it, and the sweep's
            plan says which records it trained on).
        card: The model card (as stored beside the model).
        weights: The safetensors bytes to check (the kept file, or a downloaded copy).
        sweep_id: The card's sweep (default: the card's ``trial.sweep``).

    Raises:
        ConfigError, DatasetError: the model or the data cannot be rebuilt here.
    """
    # deferred: workers.checkpoints pulls torch (see measure)
    from workers.checkpoints import RawInputModel, build_trained

    sid = sweep_id or str((card.get("trial") or {}).get("sweep") or "")
    with Session(engine) as session:
        sweep = session.get(Sweep, sid) if sid else None
        stored_spec = None if sweep is None else dict(sweep.spec or {})
        plan = SweepPlan.from_stored(None if sweep is None else sweep.plan).grids
    split = split_settings(card, stored_spec)
    spec = _split_spec(engine, split)
    data = load_dataset(spec)
    info = card["model"]
    module = build_trained(info, weights)
    task = get_model_descriptor(str(info["name"])).task
    mode = str(split.get("eval_mode") or "carve-out")
    dp = mode == "dp" and task == "classification"
    notes: list[str] = []
    inputs = None
    if isinstance(module, RawInputModel):
        # The model carries its transform: fed the raw records, as its user will feed it.
        inputs = raw_evaluation_inputs(spec)
        notes.append(RAW_NOTE)
    elif data.kind != "tokens":
        notes.append(SCALED_NOTE.format(reason=_transform_reason(info)))
    got = measure(module, data, task=task, dp=dp, inputs=inputs)
    values = dict((card.get("metrics") or {}).get("values") or {})
    n_records = int(data.x_test.shape[0])
    if dp:
        ev = card.get("evaluation") or {}
        sigma = ev.get("eval_noise_multiplier")
        releases = int(ev.get("eval_releases") or 1)
        denominator = int(data.planning_n_eval)
        if sigma is None:
            raise ValueError("the card's DP evaluation states no noise multiplier")
        tol = dp_tolerance(noise_multiplier=float(sigma), n_eval=denominator, releases=releases)
        notes.append(
            DP_NOTE.format(
                sigma=float(sigma),
                n=denominator,
                std=float(sigma) / denominator,
                r=releases,
                tol=tol,
                p=1 - DP_FALSE_ALARM,
            )
        )
        notes.append(OWNER_ONLY)
        card_accuracy = _num(values.get("accuracy"))
        comparisons = [Comparison("accuracy", card_accuracy, got["accuracy"], tol, True)]
    else:
        comparisons = _exact_comparisons(values, got, n_records)
    weights_sha = ((info.get("weights") or {}).get("sha256")) or ""
    return CheckResult(
        eval_mode=mode,
        n_records=n_records,
        comparisons=comparisons,
        same_records=_same_records(plan, data.content_sha256),
        weights_match_card=sha256_hex(weights) == weights_sha,
        notes=notes,
    )


def _exact_comparisons(
    values: dict[str, Any], got: dict[str, float], n_records: int
) -> list[Comparison]:
    """Exactly evaluated metrics beside the card's: accuracy within one record, loss and mse
    within :data:`REL_TOLERANCE`."""
    out = []
    for key in ("accuracy", "loss", "mse"):
        if key not in got:
            continue
        card_value = _num(values.get(key))
        if key == "accuracy":
            tol = 1.0 / max(1, n_records) + 1e-12
        else:
            tol = REL_TOLERANCE * max(1.0, abs(card_value or 0.0))
        if card_value is not None or key == "accuracy":
            out.append(Comparison(key, card_value, got[key], tol))
    return out


def _transform_reason(info: dict[str, Any]) -> str:
    """Why the card's model file holds no input transform (an older card says nothing)."""
    described = info.get("input_transform")
    if isinstance(described, dict) and described.get("reason"):
        return str(described["reason"])
    return "it was kept before model files carried their input transform"


def _same_records(plan: Sequence[GridPlan], identity: str) -> bool | None:
    """Whether ``identity`` is that of the records the sweep's grids were planned on."""
    known = {g.dataset_sha256 for g in plan if g.dataset_sha256}
    if not known:
        return None
    return identity in known


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


__all__ = [
    "CheckResult",
    "Comparison",
    "check_model",
    "dp_tolerance",
    "measure",
    "rebuild_split",
    "split_settings",
]
