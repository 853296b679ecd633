"""The sweep spec: pydantic models, loaded from YAML or JSON, and grid expansion.

A spec names a dataset and model, training settings, per-grid epsilon levels with one delta
and an accounting method, and arms: one strategy each, with a grid of hyperparameters and fixed
params. Every arm at every level is one *grid*; the planner gives each grid its noise
multiplier. docs/spec.md documents every field, with its meaning, default and an example.

It lives in the light ``dpsweep`` package (pydantic and PyYAML only) so the SDK validates a spec
with the server's own models before sending it, and the server carries these typed models end
to end (submission, planning, the driver).

This module holds the whole spec (:class:`SweepSpec`), its dataset, model and arm sections,
and :func:`load_spec`. The larger sections live in modules of their own and are re-exported
here, so every name is read from ``dpsweep.spec`` as before:

* :mod:`dpsweep.spec_training`: ``training`` (:class:`TrainingConfig`, :class:`EmaConfig`);
* :mod:`dpsweep.spec_privacy`: ``privacy`` (:class:`PrivacyConfig`,
  :class:`SearchDistribution`);
* :mod:`dpsweep.spec_eval`: ``eval`` (:class:`EvalConfig`);
* :mod:`dpsweep.spec_model`: ``model`` (:class:`ModelConfig`: checkpoint, trainable part, LoRA,
  public pre-training);
* :mod:`dpsweep.default_grids`: the built-in strategies' default grids (:data:`DEFAULT_GRIDS`,
  :func:`propose_grid`), and :mod:`dpsweep.model_sizes`: the large models whose default
  learning rates are smaller (:data:`LARGE_MODELS`).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from dpsweep.default_grids import DEFAULT_GRIDS, DEFAULT_LRS, propose_grid
from dpsweep.errors import ConfigError
from dpsweep.model_sizes import LARGE_MODEL_LR_SCALE, LARGE_MODELS, model_size_class
from dpsweep.spec_base import StrictSection
from dpsweep.spec_eval import DEFAULT_EVAL_EPSILON_SHARE, EVAL_MODES, EvalConfig
from dpsweep.spec_model import (
    LORA_RANK_AXIS,
    TRAINABLE_PARTS,
    LoraConfig,
    ModelConfig,
    PretrainConfig,
)
from dpsweep.spec_privacy import (
    ACCOUNTING_METHODS,
    DISTRIBUTIONS,
    PrivacyConfig,
    SearchDistribution,
)
from dpsweep.spec_training import (
    EMA_DP_FIELD,
    LR_SCHEDULES,
    ROWS_PER_UNIT_AXIS,
    UNIT_BOUNDINGS,
    EmaConfig,
    TrainingConfig,
)


class DatasetConfig(StrictSection):
    name: str = Field(description="dataset registry name, e.g. digits")
    path: str | None = None
    labels_path: str | None = None
    label_column: str | None = None
    test_fraction: float = Field(default=0.2, gt=0, lt=1)
    split_seed: int = 0
    eval_split: Literal["public"] = Field(
        default="public",
        description="kept for specs written before `eval`; how evaluation is protected is "
        "chosen by the spec's `eval` section",
    )
    options: dict[str, Any] = Field(default_factory=dict)
    privacy_unit: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="the column (csv, text_csv) or array (npz) that says whose each row is "
        "(e.g. patient_id): every epsilon then protects a whole unit, all its rows, and the "
        "dataset's ledger counts units. Never a feature. A stored dataset's unit is set by its "
        "owner at upload or registration (leave it out, or repeat it); a built-in with units "
        "(mnist1d-people) has its own. Omitted: each row is its own unit (example-level DP)",
    )
    input_bounds: tuple[float, float] | None = Field(
        default=None,
        description="bounds of every raw input value, declared by the data owner (e.g. [0, 255] "
        "for pixels); values outside are clipped. Omitted: images with a known pixel format use "
        "it, everything else is scaled with robust statistics of the public evaluation split",
    )
    feature_clip: float = Field(
        default=5.0,
        gt=0,
        description="after scaling by public statistics, every tabular feature is clipped to "
        "[-feature_clip, feature_clip], so no record, however extreme, moves a model more than "
        "any other",
    )

    @field_validator("input_bounds")
    @classmethod
    def _bounds(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and not (math.isfinite(v[0]) and math.isfinite(v[1]) and v[0] < v[1]):
            raise ValueError(
                f"input_bounds must be two finite numbers [lo, hi] with lo < hi; got {list(v)}"
            )
        return v


class Axis(StrictSection):
    """``{logspace: [a, b], k: n}`` (10^a .. 10^b) or ``{linspace: [a, b], k: n}``."""

    logspace: tuple[float, float] | None = None
    linspace: tuple[float, float] | None = None
    k: int = Field(ge=1)

    @model_validator(mode="after")
    def _one(self) -> Axis:
        if (self.logspace is None) == (self.linspace is None):
            raise ValueError("give exactly one of logspace: [a, b] or linspace: [a, b], with k")
        return self

    def values(self) -> list[float]:
        lo, hi = self.logspace if self.logspace is not None else self.linspace  # type: ignore[misc]
        pts = [lo + (hi - lo) * i / (self.k - 1) for i in range(self.k)] if self.k > 1 else [lo]
        return [10.0**p for p in pts] if self.logspace is not None else pts


class ArmConfig(StrictSection):
    strategy: str
    name: str | None = Field(default=None, description="defaults to the strategy name")
    grid: dict[str, list[Any] | Axis] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)
    tune_on: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "public pre-tuning: the name of a dataset declared public (registered with "
            "`dpsweep datasets register FILE --name NAME --public`, or a built-in declared "
            "public such as mnist1d-test; the same kind of name as eval.dataset takes). Each of "
            "the arm's grids first trains its points on those public records at its planned "
            "noise multiplier (no epsilon spent), and is centred on the best point; its size, "
            "and so K and sigma, are unchanged. Not with search method tpe"
        ),
    )

    @field_validator("grid", mode="before")
    @classmethod
    def _axes(cls, grid: Any) -> Any:
        # An axis is a list of values or a {logspace|linspace: [a, b], k: n} mapping; checking
        # here gives one clear message instead of pydantic's per-union-member errors.
        if not isinstance(grid, dict):
            return grid
        out: dict[str, Any] = {}
        for name, axis in grid.items():
            if isinstance(axis, list):
                out[name] = axis
            elif isinstance(axis, dict | Axis):
                try:
                    out[name] = axis if isinstance(axis, Axis) else Axis.model_validate(axis)
                except ValueError as exc:
                    raise ValueError(
                        f"grid axis {name!r}: {_first_error(exc)}; an axis is a list of values "
                        "or {logspace: [a, b], k: n} / {linspace: [a, b], k: n}"
                    ) from None
            else:
                raise ValueError(
                    f"grid axis {name!r} must be a list of values or {{logspace: [a, b], k: n}}"
                    f" / {{linspace: [a, b], k: n}}; got {axis!r}"
                )
        return out

    @property
    def label(self) -> str:
        return self.name or self.strategy

    def size(self) -> int:
        """The number of grid points, without building them."""
        return math.prod(v.k if isinstance(v, Axis) else len(v) for v in self.grid.values())

    def points(self) -> list[dict[str, Any]]:
        """Every grid point: the cartesian product of the axes (``lr`` included)."""
        names = list(self.grid)
        axes = [v.values() if isinstance(v, Axis) else list(v) for v in self.grid.values()]
        for name, values in zip(names, axes, strict=True):
            if not values:
                raise ConfigError(
                    f"grid axis {name!r} of arm {self.label!r} is empty",
                    field=f"arms.{self.label}.grid.{name}",
                )
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes)]


class SearchConfig(StrictSection):
    method: Literal["grid", "random", "tpe"] = "grid"
    n: int | None = Field(default=None, ge=1, description="trials per grid for random / tpe")
    seed: int = Field(default=0, description="seeds random and tpe search (not the training)")

    @model_validator(mode="after")
    def _n(self) -> SearchConfig:
        if self.method != "grid" and self.n is None:
            raise ValueError(f"search method {self.method} needs n (the number of trials)")
        return self


class ObjectiveConfig(StrictSection):
    metric: str = "accuracy"
    mode: Literal["max", "min"] = "max"


class ResourcesConfig(StrictSection):
    gpus_per_trial: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=(
            "GPU share of one trial (0.25: four trials per GPU); a pack asks for its trials' "
            "sum, at most one GPU. Default: DPSWEEP_GPUS_PER_TRIAL, else one GPU per pack. "
            "Ignored on clusters without GPUs (trials run on CPU)"
        ),
    )


class ArtifactsConfig(StrictSection):
    """Which trained models a sweep keeps (safetensors, with a model card beside each)."""

    keep: Literal["best_per_grid", "all", "none"] = Field(
        default="best_per_grid",
        description=(
            "best_per_grid: each grid's (strategy and epsilon level's) best released trial by "
            "the objective; all: every released trial; none: no model. A papernot-steinke "
            "grid only ever stores its selected trial's model"
        ),
    )


class SweepSpec(StrictSection):
    name: str = Field(min_length=1)
    dataset: DatasetConfig
    model: ModelConfig
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    privacy: PrivacyConfig
    arms: list[ArmConfig] = Field(min_length=1)
    seeds: int = Field(default=1, ge=1)
    search: SearchConfig = Field(default_factory=SearchConfig)
    objective: ObjectiveConfig = Field(default_factory=ObjectiveConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    eval: EvalConfig = Field(
        default_factory=EvalConfig,
        description="how the evaluation records are protected (carve-out, public, dp)",
    )
    artifacts: ArtifactsConfig = Field(
        default_factory=ArtifactsConfig,
        description="which trained models are kept, with their model cards",
    )

    @model_validator(mode="after")
    def _default_grids(self) -> SweepSpec:
        """An arm that names a built-in strategy and gives neither a grid nor an ``lr`` gets
        the strategy's default grid for the model (:data:`DEFAULT_GRIDS`, its descriptor's).

        Such an arm was refused before (no learning rate), so a spec that gives a grid or an
        ``lr`` is untouched and behaves as it always did. The proposed grid is written into
        the spec, so the stored spec, the plan's trial counts and every trial show it.
        """
        for arm in self.arms:
            if arm.grid or "lr" in arm.params:
                continue
            default = DEFAULT_GRIDS.get(arm.strategy)
            # A plug-in strategy gets no default: the submission check asks for its lr.
            proposed = propose_grid(default, self.model.name, arm.params) if default else {}
            if proposed:
                arm.grid = dict(proposed)
        return self

    @model_validator(mode="after")
    def _consistent(self) -> SweepSpec:
        labels = [a.label for a in self.arms]
        if len(set(labels)) != len(labels):
            raise ValueError(
                f"arm names must be unique; got {labels} (set name: on repeated strategies)"
            )
        if self.eval.mode == "public" and self.eval.dataset == self.dataset.name:
            raise ValueError(
                "eval.dataset names the training dataset: evaluation records are never trained "
                "on; register the public evaluation records under their own name"
            )
        if self.training.ema is not None and self.eval.mode == "dp":
            # With DP evaluation every measurement is a noisy release that the plan charges
            # (workers.schedule.eval_releases counts one per evaluation point); measuring the
            # averaged weights too would double them. Refused rather than under-charged.
            raise ValueError(
                f"{EMA_DP_FIELD}: an average of the weights is measured beside the raw "
                "weights at every evaluation, and with eval mode dp each measurement is a "
                "noisy release the plan does not charge; use eval mode carve-out or public, "
                "or leave training.ema out"
            )
        if self.privacy.accounting == "papernot-steinke" and self.search.method == "tpe":
            raise ValueError(
                "search tpe is adaptive (each trial depends on earlier results), which "
                "papernot-steinke's analysis of independent random trials does not cover; use "
                "accounting: compose, or search: random"
            )
        return self

    def planned_trials(self) -> int:
        """Trials the sweep plans over all its grids (retries included; for papernot-steinke,
        the mean number of runs), computed without building any grid."""
        total = 0
        for arm in self.arms:
            points = arm.size() if self.search.method == "grid" else int(self.search.n or 0)
            per_grid = points * (self.seeds if self.privacy.charge_repeats else 1)
            total += (per_grid + self.privacy.retries) * len(self.privacy.budgets)
        return total

    def trials_per_grid(self, arm: ArmConfig) -> int:
        """K: grid points (or n for random/tpe) times the seeds when repeats are charged."""
        points = len(arm.points()) if self.search.method == "grid" else int(self.search.n or 0)
        return points * (self.seeds if self.privacy.charge_repeats else 1)


def randomness_label(spec: dict[str, Any]) -> str:
    """How a stored sweep's batches and noise were drawn: ``secret`` or ``reproducible``.

    Specs stored before secret randomness existed have no ``privacy.reproducible`` key; their
    trials drew noise from public seeds, so they are labelled ``reproducible`` (fail closed).
    """
    reproducible = (spec.get("privacy") or {}).get("reproducible", True)
    return "reproducible" if reproducible else "secret"


def _first_error(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        e = errors()[0]
        loc = ".".join(str(p) for p in e["loc"])
        return f"{loc}: {e['msg']}" if loc else str(e["msg"])
    return str(exc)


def load_spec(source: str | Path | dict[str, Any]) -> SweepSpec:
    """Parse a spec from a dict, a YAML/JSON file path, or YAML/JSON text.

    Raises:
        ConfigError: naming the failing field and what is allowed.
    """
    if isinstance(source, dict):
        data: Any = source
    else:
        text = str(source)
        path = Path(text)
        if "\n" not in text and path.suffix.lower() in (".yaml", ".yml", ".json"):
            if not path.is_file():
                raise ConfigError(f"{path}: spec file not found")
            text = path.read_text()
        try:
            data = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise ConfigError(f"the spec is not valid YAML or JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError("a spec must be a mapping with keys name, dataset, model, privacy, arms")
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        if not loc and EMA_DP_FIELD in str(first["msg"]):
            # A check across sections is raised at the root; it names its field itself.
            raise ConfigError(
                str(first["msg"]).removeprefix("Value error, "), field=EMA_DP_FIELD
            ) from exc
        raise ConfigError(f"{loc}: {first['msg']}", field=loc) from exc


__all__ = [
    "ACCOUNTING_METHODS",
    "DEFAULT_EVAL_EPSILON_SHARE",
    "DEFAULT_GRIDS",
    "DEFAULT_LRS",
    "DISTRIBUTIONS",
    "EMA_DP_FIELD",
    "EVAL_MODES",
    "LARGE_MODELS",
    "LARGE_MODEL_LR_SCALE",
    "LORA_RANK_AXIS",
    "LR_SCHEDULES",
    "ROWS_PER_UNIT_AXIS",
    "TRAINABLE_PARTS",
    "UNIT_BOUNDINGS",
    "ArmConfig",
    "ArtifactsConfig",
    "Axis",
    "DatasetConfig",
    "EmaConfig",
    "EvalConfig",
    "LoraConfig",
    "ModelConfig",
    "ObjectiveConfig",
    "PretrainConfig",
    "PrivacyConfig",
    "ResourcesConfig",
    "SearchConfig",
    "SearchDistribution",
    "SweepSpec",
    "TrainingConfig",
    "load_spec",
    "model_size_class",
    "propose_grid",
    "randomness_label",
]
