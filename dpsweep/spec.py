"""The sweep spec: pydantic models, loaded from YAML or JSON, and grid expansion.

A spec names a dataset and model, training settings, per-grid epsilon levels with one delta
and an accounting method, and arms: one strategy each, with a grid of hyperparameters and fixed
params. Every arm at every level is one *grid*; the planner gives each grid its noise
multiplier. docs/spec.md documents every field, with its meaning, default and an example.

It lives in the light ``dpsweep`` package (pydantic and PyYAML only) so the SDK validates a spec
with the server's own models before sending it, and the server carries these typed models end
to end (submission, planning, the driver).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dpsweep.accountants import DEFAULT_ACCOUNTANT, canonical_accountant
from dpsweep.errors import ConfigError

ACCOUNTING_METHODS = ("compose", "basic", "papernot-steinke")
DISTRIBUTIONS = ("logarithmic", "geometric", "truncated_negative_binomial", "poisson")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatasetConfig(_Strict):
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


EVAL_MODES = ("carve-out", "public", "dp")
# DP evaluation: the share of each grid's epsilon its evaluations may cost on their own when
# eval.noise_multiplier is left out. Composition is sub-additive, so half the budget for the
# evaluations raises the training sigma by only ~18 % on the demo, while each noisy accuracy
# gets ~2.2x less noise than at 0.1: the picked models are better and the released best is
# closer to the truth (bench/eval_modes.py: true accuracy 0.90 vs 0.86 of the carve-out's,
# released best over-stated by 0.05 vs 0.18).
DEFAULT_EVAL_EPSILON_SHARE = 0.5


class EvalConfig(_Strict):
    """How the evaluation records are protected: what epsilon covers.

    Evaluation records are never trained on. Three modes:

    * ``carve-out`` (default): ``dataset.test_fraction`` of the private dataset is held out and
      declared unprotected: metrics and the choice of the best checkpoint are released from it
      without DP; epsilon covers the training records only.
    * ``public``: ``dataset`` names a separately registered dataset that its owner declared
      public (``dpsweep datasets register FILE --name NAME --public``); every record of the
      private dataset is trained on, and epsilon covers all of them.
    * ``dp``: a carve-out (split by each record's own content, so adding a record moves no
      other) whose metrics are noisy counts: accuracy and the checkpoint choice only, charged
      in the plan and the ledger; epsilon covers every record, training and evaluation.
    """

    mode: Literal["carve-out", "public", "dp"] = Field(
        default="carve-out",
        description="carve-out (unprotected held-out split, the default), public (a dataset "
        "declared public by its owner) or dp (noisy accuracy, charged to the budget)",
    )
    dataset: str | None = Field(
        default=None,
        description="public: the registered name of the evaluation dataset, declared public",
    )
    noise_multiplier: float | None = Field(
        default=None,
        gt=0,
        description="dp: the Gaussian noise multiplier of each noisy count of correct "
        "predictions (sensitivity 1). Left out, each grid gets the smallest one whose releases "
        "alone cost at most epsilon_share of its budget",
    )
    epsilon_share: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description=f"dp: the share of each grid's epsilon the evaluations may cost on their "
        f"own when noise_multiplier is left out (default {DEFAULT_EVAL_EPSILON_SHARE})",
    )

    @model_validator(mode="before")
    @classmethod
    def _infer_mode(cls, data: Any) -> Any:
        # `eval: {dataset: NAME}` alone means a public evaluation dataset.
        if isinstance(data, dict) and data.get("dataset") is not None and "mode" not in data:
            return {**data, "mode": "public"}
        return data

    @model_validator(mode="after")
    def _fields_fit_mode(self) -> EvalConfig:
        if self.mode == "public" and not self.dataset:
            raise ValueError(
                "eval mode public needs dataset: the registered name of a dataset its owner "
                "declared public (dpsweep datasets register FILE --name NAME --public)"
            )
        if self.mode != "public" and self.dataset is not None:
            raise ValueError(f"eval.dataset applies to mode public only, not {self.mode}")
        if self.mode != "dp" and (self.noise_multiplier is not None or self.epsilon_share):
            raise ValueError(
                f"eval.noise_multiplier and eval.epsilon_share apply to mode dp only, not "
                f"{self.mode}"
            )
        if self.noise_multiplier is not None and self.epsilon_share is not None:
            raise ValueError(
                "give eval.noise_multiplier or eval.epsilon_share, not both: the share picks "
                "the noise multiplier"
            )
        if self.noise_multiplier is not None and not math.isfinite(self.noise_multiplier):
            raise ValueError("eval.noise_multiplier must be a finite number > 0")
        return self

    @property
    def share(self) -> float:
        """dp: the epsilon share used to pick the noise multiplier."""
        return self.epsilon_share or DEFAULT_EVAL_EPSILON_SHARE


class ModelConfig(_Strict):
    name: str
    options: dict[str, Any] = Field(default_factory=dict)


LR_SCHEDULES = ("constant", "cosine", "linear")
# The field a refusal of EMA with DP evaluation names (a check across two sections).
EMA_DP_FIELD = "training.ema"


class EmaConfig(_Strict):
    """An exponential moving average of the weights, kept beside the raw weights.

    After step t, ``ema = d_t * ema + (1 - d_t) * weights`` from the initial weights, with
    ``d_t = decay``, or with ``warmup`` ``d_t = min(decay, (1 + t) / (10 + t))`` (TensorFlow's
    ExponentialMovingAverage with num_updates: the initial weights are forgotten quickly in a
    short run). At every evaluation point both are measured, and the better one is selected
    exactly as any checkpoint is. It is post-processing of the noisy releases: no epsilon.
    """

    decay: float = Field(
        default=0.99,
        gt=0,
        lt=1,
        description="the weight of the running average at each step (0 < decay < 1)",
    )
    warmup: bool = Field(
        default=True,
        description="use min(decay, (1 + t) / (10 + t)) at step t, so a short run's average "
        "forgets the initial weights",
    )

    @field_validator("decay")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("decay must be a finite number with 0 < decay < 1")
        return v


class TrainingConfig(_Strict):
    epochs: float | None = Field(default=5.0, gt=0)
    steps: int | None = Field(default=None, ge=1, description="overrides epochs")
    batch_size: int = Field(default=64, ge=1, description="expected batch size b = qN")
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="heavy-ball momentum of sgd, as torch.optim.SGD (0 <= m < 1; 0: none)",
    )
    weight_decay: float = Field(default=0.0, ge=0)
    eval_every: int = Field(default=50, ge=1)
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        default="constant",
        description="how each trial's learning rate decays over the run after the warmup: "
        "constant, cosine (to 0, as CosineAnnealingLR) or linear (to 0, as LinearLR)",
    )
    warmup_steps: int = Field(
        default=0,
        ge=0,
        description="steps whose learning rate rises linearly from lr/warmup to lr",
    )
    warmup_fraction: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description="the warmup as a fraction of the run's steps (instead of warmup_steps)",
    )
    ema: EmaConfig | None = Field(
        default=None,
        description="keep an exponential moving average of the weights and select the better "
        "of raw and averaged weights at every evaluation (e.g. ema: {decay: 0.99})",
    )
    average: Literal["none", "ema"] | None = Field(
        default=None,
        description="shorthand: ema is ema: {decay: 0.99}; none is no average",
    )

    @field_validator("momentum", "weight_decay")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @model_validator(mode="after")
    def _warmup_and_average(self) -> TrainingConfig:
        if self.warmup_steps and self.warmup_fraction is not None:
            raise ValueError("give training.warmup_steps or training.warmup_fraction, not both")
        if self.average == "none" and self.ema is not None:
            raise ValueError("training.average is none but training.ema is given; keep one")
        if self.average == "ema" and self.ema is None:
            self.ema = EmaConfig()
        return self

    def warmup_for(self, total_steps: int) -> int:
        """The warmup in steps for a run of ``total_steps`` (a fraction is rounded)."""
        if self.warmup_fraction is not None:
            return round(self.warmup_fraction * total_steps)
        return int(self.warmup_steps)


class SearchDistribution(_Strict):
    """Distribution of the number of trials for papernot-steinke (Papernot & Steinke 2022)."""

    name: Literal["logarithmic", "geometric", "truncated_negative_binomial", "poisson"]
    eta: float | None = Field(default=None, description="shape of the truncated negative binomial")

    @model_validator(mode="after")
    def _eta(self) -> SearchDistribution:
        if self.name == "truncated_negative_binomial":
            if self.eta is None or not (self.eta > 0 and math.isfinite(self.eta)):
                raise ValueError("truncated_negative_binomial needs eta > 0 (e.g. eta: 0.5)")
        elif self.eta is not None:
            raise ValueError(f"eta applies only to truncated_negative_binomial, not {self.name}")
        return self

    @property
    def shape(self) -> float:
        """The ``shape`` of dp_accounting's RepeatAndSelectDpEvent."""
        return {
            "poisson": math.inf,
            "geometric": 1.0,
            "logarithmic": 0.0,
            "truncated_negative_binomial": float(self.eta or 0.0),
        }[self.name]


class PrivacyConfig(_Strict):
    budgets: list[float] = Field(min_length=1, description="per-grid epsilon levels")
    delta: float = Field(gt=0, lt=1)
    accounting: Literal["compose", "basic", "papernot-steinke"] = "compose"
    accountant: str = Field(
        default=DEFAULT_ACCOUNTANT,
        description="calibration accountant for compose/basic: a registered accountant's name "
        "(pld: dp_accounting's privacy loss distribution, tight; dp-rdp: dp_accounting's RDP, "
        "a looser upper bound; or a plug-in's, `dpsweep plugins accountants`). Legacy names "
        "are normalised: prv means pld (it always meant dp_accounting PLD), rdp means dp-rdp",
    )
    charge_repeats: bool = Field(default=True, description="every seed touches the data")
    distribution: SearchDistribution | None = Field(
        default=None, description="papernot-steinke: the distribution of the number of trials"
    )
    max_noise_multiplier: float | None = Field(
        default=None,
        gt=0,
        description="a hard maximum: plans needing more noise are refused as infeasible. Left "
        "out, a plan above sigma = 10 is accepted with a warning and an expected-utility hint "
        "(some strategies still learn there), and only sigma > 100 is refused",
    )
    reproducible: bool = Field(
        default=False,
        description="draw noise and Poisson sampling from the public seed instead of a fresh "
        "OS secret per trial: same seed, same result, for debugging and tests. NOT private "
        "against anyone who knows the seed; results are labelled so everywhere",
    )
    retries: int = Field(
        default=0,
        ge=0,
        description="extra runs per grid reserved up front for re-running trials interrupted by "
        "a crash (compose and basic); each grid is planned for its trials plus these runs",
    )

    @field_validator("budgets")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        for e in v:
            if not (e > 0 and math.isfinite(e)):
                raise ValueError(f"every epsilon level must be a finite number > 0; got {e}")
        # A grid is keyed by its arm and its level written to six significant digits
        # (sweeper.sweeps.stored.grid_key): two levels that write alike would be one grid.
        seen: dict[str, float] = {}
        for e in v:
            key = f"{e:g}"
            if key in seen:
                raise ValueError(
                    f"epsilon levels must differ: {seen[key]!r} and {e!r} are the same level "
                    f"({key}) to six significant digits; remove one"
                )
            seen[key] = e
        return v

    @field_validator("accountant")
    @classmethod
    def _accountant(cls, v: str) -> str:
        # One table of legacy names (dpsweep.accountants); the name itself is checked against
        # the accountant registry (plug-ins included) when the sweep is planned, as strategy
        # names are (torch-free; dpsweep imports no registry).
        v = canonical_accountant(v.strip())
        if not v:
            raise ValueError("privacy.accountant must name an accountant (e.g. pld)")
        return v

    @model_validator(mode="after")
    def _ps(self) -> PrivacyConfig:
        if self.accounting == "papernot-steinke" and self.distribution is None:
            raise ValueError(
                "accounting papernot-steinke needs a distribution "
                "(e.g. distribution: {name: logarithmic})"
            )
        if self.accounting != "papernot-steinke" and self.distribution is not None:
            raise ValueError("distribution applies only to accounting papernot-steinke")
        if self.accounting == "papernot-steinke" and self.retries:
            raise ValueError(
                "retries do not apply to accounting papernot-steinke: an interrupted random-"
                "search trial is not re-run (its count is part of the guarantee); set retries: 0"
            )
        return self


class Axis(_Strict):
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


class ArmConfig(_Strict):
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


class SearchConfig(_Strict):
    method: Literal["grid", "random", "tpe"] = "grid"
    n: int | None = Field(default=None, ge=1, description="trials per grid for random / tpe")
    seed: int = Field(default=0, description="seeds random and tpe search (not the training)")

    @model_validator(mode="after")
    def _n(self) -> SearchConfig:
        if self.method != "grid" and self.n is None:
            raise ValueError(f"search method {self.method} needs n (the number of trials)")
        return self


class ObjectiveConfig(_Strict):
    metric: str = "accuracy"
    mode: Literal["max", "min"] = "max"


class ResourcesConfig(_Strict):
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


class ArtifactsConfig(_Strict):
    """Which trained models a sweep keeps (safetensors, with a model card beside each)."""

    keep: Literal["best_per_grid", "all", "none"] = Field(
        default="best_per_grid",
        description=(
            "best_per_grid: each grid's (strategy and epsilon level's) best released trial by "
            "the objective; all: every released trial; none: no model. A papernot-steinke "
            "grid only ever stores its selected trial's model"
        ),
    )


class SweepSpec(_Strict):
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


#: Registered models whose default grids get smaller learning rates: deep networks with many
#: layers (the noise grows with the parameter count; a large step diverges there). Every other
#: model, plug-ins' included, is treated as small (an MLP, a small CNN, a linear model).
LARGE_MODELS = frozenset({"wrn16_4", "res_cnn", "text_classifier"})
#: How much smaller a large model's default learning rates are.
LARGE_MODEL_LR_SCALE = 0.2
#: The default learning rates of a small model (DP-SGD steps along the mean of clipped
#: gradients, so a step is at most lr * C: these bracket what trains digits and tabular data).
DEFAULT_LRS = (0.1, 0.5, 2.0)
_CLIPS = (0.5, 2.0)
#: The default grid of each built-in strategy, for a small model: what an arm that names the
#: strategy and gives neither a grid nor an lr sweeps. The strategies' torch-free descriptors
#: (``workers.strategies.descriptors``) declare these same tables as their ``default_grid``;
#: they live here because the spec, torch-free and without the server, fills them in.
DEFAULT_GRIDS: dict[str, dict[str, tuple[Any, ...]]] = {
    "fixed": {"lr": DEFAULT_LRS, "clip": _CLIPS},
    "automatic": {"lr": DEFAULT_LRS, "clip": _CLIPS},
    "global": {"lr": DEFAULT_LRS, "clip": _CLIPS},
    "bam": {"lr": DEFAULT_LRS, "clip": _CLIPS},
    "quantile": {"lr": DEFAULT_LRS, "target_quantile": (0.5, 0.9)},
    # The clip and the learning rate adapt online: only the starting lr is swept.
    "online": {"lr": DEFAULT_LRS},
    "lipschitz": {"lr": DEFAULT_LRS},
    "nonprivate": {"lr": (0.01, 0.1, 0.5)},
}


def model_size_class(model: str) -> str:
    """``large`` for the deep registered models (:data:`LARGE_MODELS`), else ``small``."""
    return "large" if model in LARGE_MODELS else "small"


def propose_grid(
    default_grid: Mapping[str, tuple[Any, ...]], model: str, params: Mapping[str, Any]
) -> dict[str, list[Any]]:
    """A strategy's default grid for ``model``: its axes the arm's ``params`` leave out.

    Args:
        default_grid: the strategy's axes for a small model (:data:`DEFAULT_GRIDS`).
        model: the registered model name; a large one's learning rates are scaled down.
        params: the arm's fixed params (an axis they set is not proposed).
    """
    scale = LARGE_MODEL_LR_SCALE if model_size_class(model) == "large" else 1.0
    out: dict[str, list[Any]] = {}
    for name, values in default_grid.items():
        if name in params:
            continue
        out[name] = [float(f"{v * scale:.6g}") for v in values] if name == "lr" else list(values)
    return out


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
    "LR_SCHEDULES",
    "ArmConfig",
    "ArtifactsConfig",
    "Axis",
    "DatasetConfig",
    "EmaConfig",
    "EvalConfig",
    "ModelConfig",
    "ObjectiveConfig",
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
