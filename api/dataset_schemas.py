"""Response models of the datasets and their budgets (re-exported by :mod:`api.schemas`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from api.grant_schemas import Allowance, GrantsSummary, PublicInfo


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatasetBudget(_Out):
    epsilon_cap: float | None
    delta_cap: float | None
    epsilon_committed: float
    epsilon_reserved: float
    epsilon_remaining: float | None
    scope: Literal["records", "yours"] = Field(
        default="records",
        description="records: the records' lifetime totals; yours: a built-in set shared by "
        "every tenant, as your own spending (its cap less yours is remaining: others' spending "
        "may leave less)",
    )


class UploadLedger(_Out):
    """What an upload's records already have: the ledger it joined (yours only: another
    tenant's upload of the same records is another ledger, and never named)."""

    shared_with: list[str] = Field(
        description="your other datasets on the same records: they share this one ledger and "
        "cap (empty: a ledger of its own)"
    )
    existing: bool = Field(
        description="the same file and settings as your upload `id`: that upload is returned "
        "(200), nothing new is stored"
    )
    epsilon_cap: float | None
    delta_cap: float | None
    epsilon_committed: float
    delta_committed: float
    epsilon_reserved: float
    delta_reserved: float
    epsilon_remaining: float | None
    held_elsewhere: list[str] | None = Field(
        default=None,
        description="admins only: other owners' datasets of the same records, each with "
        "whose it is (other ledgers: their spending does not count on this one)",
    )
    message: str = Field(description="the same, in a sentence")


class DatasetOut(_Out):
    id: str
    name: str
    kind: str
    format: str | None
    role: str | None = Field(
        default=None,
        description="owner: yours (or you are an admin); analyst: another tenant's, granted "
        "to you (its public description and your allowance only); null: a built-in set",
    )
    owner: str | None = Field(
        default=None,
        description="whose it is (null: the operator's, a name registered on the command line "
        "without --owner, which admins see)",
    )
    public: bool | None = Field(
        default=None,
        description="a registered file its owner declared public (usable as eval.dataset)",
    )
    size_bytes: int | None = None
    created_at: str | None = None
    n_examples: int | None
    n_train: int | None
    input_shape: list[int] | None
    num_classes: int | None
    sha256: str | None = None
    label_column: str | None = None
    kind_of_data: str | None = None
    privacy_unit: str | None = Field(
        default=None,
        description="what one unit of its ε protects: the unit column its owner declared at "
        "upload or registration (e.g. patient_id: a person, all their rows), or example (each "
        "row its own unit). Fixed: a spec's dataset.privacy_unit may repeat it or leave it out",
    )
    n_units: int | None = Field(
        default=None,
        description="with a privacy unit: the number of units (the owner sees the count; an "
        "analyst only what the owner declared, else null). Rows per unit are never shown",
    )
    budget: DatasetBudget | None = None
    public_info: PublicInfo | None = Field(
        default=None, description="what the owner declared public (label names, description)"
    )
    analyst_eval_modes: list[str] | None = Field(
        default=None, description="the evaluation modes analysts may use"
    )
    allowance: Allowance | None = Field(
        default=None, description="analysts: your allowance on it and your use"
    )
    grants: GrantsSummary | None = Field(
        default=None, description="owners: the active grants to analysts"
    )
    ledger: UploadLedger | None = Field(
        default=None,
        description="an upload's answer: the ledger its records joined, with what is spent",
    )


class DatasetList(_Out):
    items: list[DatasetOut]


class BudgetSweep(_Out):
    """One run that reserved or spent ε on the records: the rows add up to what is
    committed."""

    sweep: str = Field(
        description="the run's id on the ledger (a sweep's id, audit_<id>, train_<id>)"
    )
    kind: Literal["sweep", "audit", "train"] = Field(
        default="sweep", description="a sweep, a canary audit or a dpsweep train run"
    )
    name: str | None = Field(description="its name (null: a deleted sweep's)")
    state: str = Field(description="its state (deleted: a sweep whose rows were deleted)")
    owner: str | None = Field(default=None, description="whose run (an analyst's, for owners)")
    epsilon_charged: float
    epsilon_reserved: float
    delta_charged: float
    delta_reserved: float


class BudgetOut(_Out):
    dataset: str
    epsilon_cap: float | None
    delta_cap: float | None
    epsilon_committed: float
    delta_committed: float
    epsilon_reserved: float
    delta_reserved: float
    epsilon_remaining: float | None
    delta_remaining: float | None
    sweeps: list[BudgetSweep]
    scope: Literal["records", "yours"] = Field(
        default="records",
        description="records: the records' lifetime totals; yours: a built-in set shared by "
        "every tenant, as your own spending (its cap less yours is remaining: others' spending "
        "may leave less)",
    )


class AnalystBudgetOut(Allowance):
    """An analyst's budget on a dataset: their allowance and their own sweeps (the records'
    lifetime totals include others' spending, so analysts do not see them)."""

    dataset: str
    role: Literal["analyst"]
    sweeps: list[BudgetSweep]


class CapsIn(_Out):
    epsilon_cap: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    delta_cap: float | None = Field(default=None, ge=0, lt=1, allow_inf_nan=False)
