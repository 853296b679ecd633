"""Response and request models of data owners and analysts: grants, allowances, the audit
log and the analysts' policy of a dataset."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PublicInfo(_Out):
    """What a dataset's owner declares public about it (never computed from the records)."""

    label_names: list[str] | None = Field(default=None, description="the classes' names")
    description: str | None = Field(default=None, description="free text")


class Allowance(_Out):
    """An analyst's ε allowance on a dataset and their use of it."""

    epsilon_allowance: float = Field(description="what the owner granted")
    epsilon_used: float = Field(
        description="what their sweeps hold on the records: reserved less released unused "
        "(charges stay counted)"
    )
    epsilon_left: float = Field(description="allowance less used; 0 once revoked")
    active: bool = Field(description="false once the owner revoked the grant")


class GrantsSummary(_Out):
    active: int = Field(description="active grants to analysts")
    epsilon_allowance: float = Field(description="their allowances together")


class GrantIn(_Out):
    analyst: str = Field(min_length=1, max_length=200, description="the analyst's tenant name")
    epsilon_allowance: float = Field(
        ge=0, allow_inf_nan=False, description="the ε their sweeps may hold on the records"
    )
    note: str | None = Field(default=None, max_length=2000)
    confirm: bool = Field(
        default=False,
        description="grant the name although no API token has it yet (otherwise such a "
        "grant is refused: a typo would grant no one, and the right tenant nothing)",
    )


class GrantOut(_Out):
    id: str
    dataset: str
    analyst: str
    epsilon_allowance: float
    granted_by: str | None
    note: str
    created_at: str | None
    revoked_at: str | None
    active: bool
    epsilon_used: float | None = Field(
        default=None,
        description="in lists: what the analyst's sweeps hold on the records (reserved less "
        "released unused)",
    )


class GrantList(_Out):
    items: list[GrantOut]


class AuditEntry(_Out):
    id: int = Field(
        description="the entry's number in the log you read (1, 2, ...: the order of the "
        "releases; an analyst's log numbers their own entries only), for ?after="
    )
    at: str | None
    principal: str | None = Field(description="who received it (the sweep's owner)")
    dataset: str
    sweep_id: str
    trial_id: str | None
    kind: str = Field(
        description="trial, trial-failed, trial-cancelled, selected-trial, model, audit or train"
    )
    grid: str | None
    epsilon: float = Field(description="the ε charged for what it covers (0 for a model)")
    delta: float
    detail: dict[str, Any]


class AuditPage(_Out):
    items: list[AuditEntry]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page")


class DatasetViewOut(_Out):
    """How every sweep on a stored dataset splits and scales its records (set by its owner;
    an analyst's spec cannot change it)."""

    test_fraction: float = Field(description="the share of records held out for evaluation")
    split_seed: int = Field(description="the seed (in eval mode dp: the key) of the split")
    input_bounds: list[float] | None = Field(description="declared bounds of every input")
    feature_clip: float = Field(description="the clip of features scaled by public statistics")
    n_examples: int | None = Field(
        description="the number of records: plans take N, q and T from it (to an analyst: "
        "only when declared, else null)"
    )
    classes: list[str] | None = Field(
        default=None, description="the class list in encoding order (sizes the model's output)"
    )
    input_shape: list[int] | None = Field(
        default=None, description="the shape of one record's features (sizes the model's input)"
    )
    declared: list[Literal["n_examples", "classes", "input_shape", "n_units"]] = Field(
        default_factory=list,
        description="the facts its owner declared public; an analyst sees and plans with these "
        "only, and a dataset is granted to analysts once all three (with a privacy unit: all "
        "four, n_units too) are declared",
    )
    privacy_unit: str | None = Field(
        default=None,
        description="datasets with a privacy unit only: its unit column (set by its owner)",
    )
    n_units: int | None = Field(
        default=None,
        description="datasets with a privacy unit only: the number of units; plans take the "
        "sample rate and N in units from it (to an analyst: only when declared, else null)",
    )


class DatasetViewIn(_Out):
    test_fraction: float | None = Field(default=None, gt=0, lt=1)
    split_seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    input_bounds: list[float] | None = Field(
        default=None, min_length=2, max_length=2, description="[lo, hi]; null: none"
    )
    feature_clip: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    n_examples: int | None = Field(default=None, ge=2, lt=2**53)
    classes: list[Annotated[str, StringConstraints(min_length=1, max_length=200)]] | None = Field(
        default=None, min_length=2, max_length=10000
    )
    input_shape: list[Annotated[int, Field(gt=0, lt=2**31)]] | None = Field(
        default=None, min_length=1, max_length=4, description="declared shape of the features"
    )
    n_units: int | None = Field(
        default=None,
        ge=1,
        lt=2**53,
        description="the number of privacy units, declared public (datasets with a unit)",
    )
    privacy_unit: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="the same as the policy's privacy_unit",
    )


class PolicyOut(_Out):
    dataset: str
    analyst_eval_modes: list[str]
    public_info: PublicInfo
    view: DatasetViewOut | None = Field(
        default=None, description="how sweeps read the records (stored files only)"
    )


class PublicInfoIn(_Out):
    label_names: list[Annotated[str, StringConstraints(min_length=1, max_length=200)]] | None = (
        Field(default=None, max_length=10000)
    )
    description: str | None = Field(default=None, max_length=10000)


class PolicyIn(_Out):
    analyst_eval_modes: list[Literal["carve-out", "public", "dp"]] | None = Field(
        default=None,
        max_length=3,
        description="the evaluation modes analysts may use (left out: unchanged)",
    )
    public_info: PublicInfoIn | None = Field(
        default=None,
        description="each field given replaces the declared one (null withdraws it); fields "
        "left out are kept",
    )
    view: DatasetViewIn | None = Field(
        default=None,
        description="each setting given replaces the owner's view of the records (every later "
        "sweep, the owner's and the analysts', reads them so); settings left out are kept. "
        "n_examples, classes and input_shape given declare those facts public (null "
        "withdraws the declaration)",
    )
    declare_counted: bool = Field(
        default=False,
        description="declare the counted number of records, class list and feature shape "
        "(and number of privacy units) public as they are (the owner's choice: analysts then "
        "see them exactly)",
    )
    privacy_unit: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="set the unit column (null: none, each row its own unit); left out: "
        "unchanged. Refused (409) once the records' ledger has spent or reserved anything: "
        "epsilon spent per row does not protect a person. The file is read again with it, "
        "and the number of units must then be declared anew",
    )
