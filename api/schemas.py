"""Response models: the API's contract in its OpenAPI document."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from api.dataset_schemas import (  # re-exported
    AnalystBudgetOut,
    BudgetOut,
    BudgetSweep,
    CapsIn,
    DatasetBudget,
    DatasetList,
    DatasetOut,
)
from api.registry_schemas import (  # re-exported
    RegistryAccountant,
    RegistryDataset,
    RegistryModel,
    RegistryOption,
    RegistryOut,
    RegistryStrategy,
)
from dpsweep.plan import GridPlan
from dpsweep.plan_fields import DRY_RUN, public_fields, public_view


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Objective(_Out):
    metric: str
    mode: str


class BestOfArm(_Out):
    arm: str
    objective: float


class SweepItem(_Out):
    id: str
    name: str
    dataset: str
    state: str
    owner: str | None
    created_at: str
    started_at: str | None = Field(description="rounded down to 10 s for an analyst")
    finished_at: str | None = Field(
        description="for an analyst, the rounded start plus the duration rounded down to 10 s"
    )
    error: str | None
    randomness: str = Field(
        description="secret: each trial drew its batches and noise from a fresh OS secret; "
        "reproducible: from the public seed, so NOT private against anyone who knows the seed"
    )
    objective: Objective
    levels: list[float] = Field(description="the per-grid epsilon levels of its plan")
    trials: dict[str, int] | None = Field(
        description="trials by state; null for papernot-steinke sweeps (their count is private)"
    )
    best: list[BestOfArm] | None = Field(
        description="per arm, the best finished trial's objective; null for papernot-steinke"
    )


class SweepPage(_Out):
    items: list[SweepItem]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page")


class Pareto(_Out):
    epsilon: list[dict[str, Any]]
    calibration: list[dict[str, Any]]


class SweepOut(_Out):
    id: str
    name: str
    dataset: str
    state: str
    owner: str | None
    error: str | None
    created_at: str
    started_at: str | None = Field(description="rounded down to 10 s for an analyst")
    finished_at: str | None = Field(
        description="for an analyst, the rounded start plus the duration rounded down to 10 s"
    )
    randomness: str = Field(
        description="secret: each trial drew its batches and noise from a fresh OS secret; "
        "reproducible: from the public seed, so NOT private against anyone who knows the seed"
    )
    warning: str | None = Field(
        description="set for reproducible sweeps: their results are not private against anyone "
        "who knows the seed"
    )
    objective: Objective
    arms: list[dict[str, Any]]
    plan: list[dict[str, Any]]
    trials: dict[str, int] = Field(description="trials by state (papernot-steinke grids left out)")
    privacy: dict[str, Any] | None = Field(
        default=None,
        description="one epsilon per release, each with what it covers: grids (releasing "
        "every trial of a grid), sweep (all grids composed tightly), dataset_lifetime (the "
        "ledger's spend on these records), and the evaluation statement",
    )
    budget: dict[str, float | int | None]
    results: list[dict[str, Any]]
    pareto: Pareto


class _PlanGridView(_Out):
    """The dry run's view of one grid's plan; its fields are :func:`_plan_grid_fields`."""

    @classmethod
    def of(cls, plan: GridPlan, *, epsilon_reserved: Decimal, delta_reserved: Decimal) -> PlanGrid:
        """A dry run's view of one grid's plan (:data:`dpsweep.plan_fields.DRY_RUN`), and its
        reservation."""
        fields = public_view(plan, DRY_RUN)
        # A strategy without a second release has no split of sigma to show.
        fields["gradient_noise_multiplier"] = plan.gradient_noise_multiplier or None
        fields["epsilon_reserved"] = float(epsilon_reserved)
        fields["delta_reserved"] = float(delta_reserved)
        return cls.model_validate(fields)


def _plan_grid_fields() -> dict[str, Any]:
    """The dry run's fields: each public field of the view (dpsweep/plan_fields.py), typed as
    :class:`dpsweep.plan.GridPlan` types it and titled and described by the declaration, then
    the grid's reservation."""
    # A pydantic dataclass's fields, which mypy's view of the dataclass does not know.
    types: dict[str, FieldInfo] = GridPlan.__pydantic_fields__  # type: ignore[attr-defined]
    out: dict[str, Any] = {}
    for f in public_fields(DRY_RUN):
        info = types[f.name]
        typ: Any = list[str] if info.annotation == tuple[str, ...] else info.annotation
        default = ... if info.is_required() else info.get_default(call_default_factory=True)
        if f.name == "gradient_noise_multiplier":
            typ, default = float | None, ...  # always sent; null where nothing is split (of)
        if isinstance(default, tuple):
            default = list(default)
        out[f.name] = (typ, Field(default=default, title=f.label, description=f.help or None))
    out["epsilon_reserved"] = (float, Field(title="reserved ε"))
    out["delta_reserved"] = (float, Field(title="reserved δ"))
    return out


if TYPE_CHECKING:
    PlanGrid = _PlanGridView
else:
    # Derived from the one declaration of the plan's public fields (a test checks each is
    # GridPlan's, of its type).
    PlanGrid = create_model("PlanGrid", __base__=_PlanGridView, **_plan_grid_fields())


class PlanOut(_Out):
    name: str
    dataset: str
    grids: list[PlanGrid]
    trials: int
    epsilon_reserved: float
    delta_reserved: float


class CancelOut(_Out):
    id: str
    state: str
    cancelled_pending: int = Field(
        description="unstarted trials dropped (papernot-steinke grids not counted)"
    )
    stopped_running: int = Field(
        description="running trials stopped; they stay charged (papernot-steinke not counted)"
    )
    released_epsilon: float
    papernot_steinke: str | None = Field(
        default=None,
        description="for sweeps with papernot-steinke grids, what the cancel means for them "
        "(their number of runs is secret, so they are not counted)",
    )


class ModelRef(_Out):
    """A trial's kept model: where to download it and its card, and what to check it by."""

    sha256: str = Field(description="SHA-256 of the safetensors file (hex); its ETag too")
    size_bytes: int = Field(description="size of the safetensors file")
    reproducible: bool = Field(
        description="trained in the labelled reproducible mode (noise and sampling from a "
        "public seed): NOT private against anyone who knows the seed"
    )
    url: str = Field(description="GET it: the weights (safetensors)")
    card_url: str = Field(description="GET it: the model card (JSON)")


class TrialItem(_Out):
    id: str
    sweep: str
    arm: str
    strategy: str
    epsilon_budget: float
    params: dict[str, Any]
    seed: int
    number: int = Field(description="position in its grid (0 for papernot-steinke trials)")
    state: str
    attempts: int
    noise_multiplier: float | None
    error: str | None
    metrics: dict[str, Any]
    objective: float | None
    single_run_epsilon: float | None = Field(
        description="what this run alone would cost, were it the only release from the data; "
        "NOT what was spent: the trial's grid spent epsilon_budget for all its trials "
        "(the sweep's privacy block says what each release covers)"
    )
    delta: float | None
    steps: int | None
    best_step: int | None
    started_at: str | None = Field(
        description="null for papernot-steinke trials; rounded down to 10 s for the analyst "
        "of another tenant's dataset (how long runs take follows the realised batches)"
    )
    finished_at: str | None = Field(
        description="null for papernot-steinke trials; for an analyst, the rounded start plus "
        "the duration rounded down to 10 s"
    )
    train_seconds: float | None = Field(
        description="null for papernot-steinke trials; rounded down to 10 s for an analyst"
    )
    randomness: str = Field(
        description="secret: each trial drew its batches and noise from a fresh OS secret; "
        "reproducible: from the public seed, so NOT private against anyone who knows the seed"
    )
    model: ModelRef | None = Field(
        description="the trained model kept for this trial (null: none is kept; the sweep's "
        "artifacts.keep says which are)"
    )


class TrialPage(_Out):
    items: list[TrialItem]
    next_cursor: str | None


class TrialPrivacy(_Out):
    charges: list[dict[str, Any]]
    epsilon_charged: float
    delta_charged: float
    single_run_epsilon: float | None = Field(
        description="what this run alone would cost (a single run's epsilon, not a spend)"
    )


class TrialDetail(TrialItem):
    target_delta: float | None
    worker: str | None = Field(
        description="the process that ran it; null for papernot-steinke trials and analysts"
    )
    planned: dict[str, Any]
    final_metrics: dict[str, Any]
    accountant: str | None
    reliability: list[dict[str, Any]]
    trajectories: dict[str, Any]
    step_time_ms_median: float | None = Field(
        description="null for papernot-steinke trials and analysts (a step's time follows its "
        "realised Poisson batch)"
    )
    diverged_at: int | None
    engine_path: str | None = Field(
        default=None, description="the engine path that trained it: packed or generic"
    )
    privacy: TrialPrivacy


class MetricPointOut(_Out):
    step: int
    value: float | None


class MetricHistory(_Out):
    trial: str
    metrics: dict[str, list[MetricPointOut]]


class ResultsOut(_Out):
    id: str
    state: str
    objective: Objective
    results: list[dict[str, Any]]


class ParetoPoint(_Out):
    x: float
    y: float
    arm: str
    dominated: bool
    epsilon_budget: float
    trial: str | None = Field(default=None, description="the trial to open for this point")
    params: dict[str, Any] | None = None
    y_std: float | None = Field(default=None, description="std of y over seeds (epsilon fronts)")
    seeds: int | None = None
    noise_multiplier: float | None = Field(default=None, description="sigma of the trial/grid")
    single_run_epsilon: float | None = Field(
        default=None,
        description="what this trial's run alone would cost (not a spend: its grid's budget is)",
    )


class ParetoOut(_Out):
    id: str
    x: str
    y: str
    x_mode: str
    y_mode: str
    points: list[ParetoPoint]


class Me(_Out):
    name: str | None = Field(description="the token's name; null when auth is off")
    admin: bool
    auth: bool = Field(description="whether this server requires tokens")


class Health(_Out):
    status: str


class Ready(_Out):
    status: str
    database: str
    schema_revision: str | None
    schedulers: int


__all__ = [
    "AnalystBudgetOut",
    "BudgetOut",
    "BudgetSweep",
    "CapsIn",
    "DatasetBudget",
    "DatasetList",
    "DatasetOut",
    "RegistryAccountant",
    "RegistryDataset",
    "RegistryModel",
    "RegistryOption",
    "RegistryOut",
    "RegistryStrategy",
]
