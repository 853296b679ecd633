"""The store's rows: SQLAlchemy 2.0 models of datasets, sweeps, trials, metrics and results,
and of the service's own records (API tokens, idempotency keys, heartbeats).

The database is the single source of truth for sweep state. Models share one metadata with the
budget ledger (:mod:`sweeper.privacy.ledger`; :mod:`sweeper.store.base`), and the schema is
created and upgraded only by Alembic migrations (``dpsweep db upgrade``; see
:mod:`sweeper.store.schema`).
"""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy import Enum as SAEnum
from sqlalchemy.orm import Mapped, mapped_column, relationship

from sweeper.store.base import Base
from sweeper.store.types import ExactDecimal


def _now() -> datetime:
    return datetime.now(UTC)


def iso(dt: datetime | None) -> str | None:
    """ISO 8601 in UTC with its offset (SQLite hands back naive datetimes, stored as UTC)."""
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC).isoformat()


def new_id() -> str:
    return uuid.uuid4().hex


def sweep_ledger_key(sweep: Sweep) -> str:
    """The ledger key a sweep reserved and charges under (its name for sweeps stored before
    ledgers were keyed by content)."""
    return sweep.ledger_key or sweep.dataset


class SweepState(enum.StrEnum):
    pending = "pending"
    running = "running"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"


class AuditState(enum.StrEnum):
    running = "running"
    succeeded = "succeeded"
    failed = "failed"


class TrialState(enum.StrEnum):
    pending = "pending"
    running = "running"
    done = "done"
    failed = "failed"
    interrupted = "interrupted"
    cancelled = "cancelled"


class Dataset(Base):
    """A name of a dataset known to the service, bound to the identity of its records.

    ``name`` is what specs and users say: a registry name (``digits``), ``name:path`` for a
    file given by path, an upload's id (``ds_...``), or a name registered with ``dpsweep
    datasets register``. ``content_sha256`` is the identity of the records the name was last
    seen with (:func:`workers.datasets.content_sha256`); the lifetime budget lives in the
    ledger under ``sha256:<content_sha256>``, so several names of the same records share one
    cap and one ledger, and deleting a name deletes no budget. ``NULL`` for rows stored before
    identities existed, until the name is next used (:func:`sweeper.datasets.identity.bind_name`).
    Uploads and registered files also record their format and the file they are read from
    (uploads also their owner); the API never serves the file back.
    """

    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    n_examples: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    owner: Mapped[str | None] = mapped_column(String(200), index=True)
    label: Mapped[str | None] = mapped_column(String(200))
    format: Mapped[str | None] = mapped_column(String(16))
    size_bytes: Mapped[int | None] = mapped_column(Integer)
    sha256: Mapped[str | None] = mapped_column(String(64))
    storage_path: Mapped[str | None] = mapped_column(Text)
    content_sha256: Mapped[str | None] = mapped_column(String(64), index=True)
    # What the owner declares public about the records, for analysts (label names, a
    # description), and which evaluation modes analysts may use (NULL: public and dp; an
    # unprotected carve-out releases raw metrics on private records, for the owner alone
    # unless listed here). See sweeper.datasets.grants.
    public_info: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    analyst_eval_modes: Mapped[list[str] | None] = mapped_column(JSON)


class Sweep(Base):
    __tablename__ = "sweeps"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200))
    dataset: Mapped[str] = mapped_column(String(200), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # as submitted
    plan: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    state: Mapped[SweepState] = mapped_column(
        SAEnum(SweepState, native_enum=False, length=16), default=SweepState.pending, index=True
    )
    owner: Mapped[str | None] = mapped_column(String(200), index=True)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=_now, onupdate=_now
    )
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Canonical hash of the spec: `dpsweep run SPEC` resumes an unfinished sweep of the same spec.
    spec_hash: Mapped[str | None] = mapped_column(String(64), index=True)
    # The process driving the sweep ("host:pid") and its last sign of life; a sweep whose
    # driver is gone may be taken over (resumed) by another process.
    driver: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The ledger key the sweep reserved under: ``sha256:<hex>`` of its data's records. NULL for
    # sweeps stored before ledgers were keyed by content; those use ``dataset`` (the name).
    # ``dataset`` stays the name users gave and see.
    ledger_key: Mapped[str | None] = mapped_column(String(200), index=True)
    # The audited epsilon of the whole sweep (sweeper.privacy.releases.sweep_release: seconds of
    # tight composition), computed once by the driver, and the sha256 of exactly what it was
    # computed from (the plan's composition input and the accountant's version). A reader uses
    # it only while that key matches the current plan; NULL: not computed yet (recomputed).
    release_key: Mapped[str | None] = mapped_column(String(64))
    release: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    trials: Mapped[list[Trial]] = relationship(back_populates="sweep", cascade="all, delete-orphan")


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (
        Index("ix_trials_sweep_state", "sweep_id", "state"),
        # The API's trial pages walk a sweep in grid order.
        Index("ix_trials_sweep_order", "sweep_id", "arm", "epsilon_budget", "number", "id"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    arm: Mapped[str] = mapped_column(String(200))
    strategy: Mapped[str] = mapped_column(String(64))
    epsilon_budget: Mapped[float] = mapped_column(Float)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)  # the grid point (lr, C, gamma, ...)
    seed: Mapped[int] = mapped_column(Integer)
    # Position in its grid, and the configuration it belongs to (seeds of one configuration
    # share it; tpe assigns a configuration's params when its first seed starts).
    number: Mapped[int] = mapped_column(Integer, default=0)
    config: Mapped[int] = mapped_column(Integer, default=0)
    noise_multiplier: Mapped[float | None] = mapped_column(Float)  # planned sigma
    target_delta: Mapped[float | None] = mapped_column(Float)
    state: Mapped[TrialState] = mapped_column(
        SAEnum(TrialState, native_enum=False, length=16), default=TrialState.pending
    )
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(200))
    pack_id: Mapped[str | None] = mapped_column(String(32), index=True)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Wall time the worker spent training (inside the trainer); the rest of finished - started
    # is dpsweep's scheduling overhead.
    train_seconds: Mapped[float | None] = mapped_column(Float)

    sweep: Mapped[Sweep] = relationship(back_populates="trials")
    metrics: Mapped[list[MetricPoint]] = relationship(
        back_populates="trial", cascade="all, delete-orphan"
    )
    result: Mapped[TrialResultRow | None] = relationship(
        back_populates="trial", cascade="all, delete-orphan"
    )


class MetricPoint(Base):
    __tablename__ = "metric_points"
    __table_args__ = (Index("ix_metric_points_trial_name_step", "trial_id", "name", "step"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    trial_id: Mapped[str] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float | None] = mapped_column(Float)

    trial: Mapped[Trial] = relationship(back_populates="metrics")


class TrialResultRow(Base):
    """Final result of a trial: best-checkpoint metrics, epsilon spent, bins, trajectories."""

    __tablename__ = "trial_results"

    trial_id: Mapped[str] = mapped_column(
        ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True
    )
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    final_metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    epsilon: Mapped[float | None] = mapped_column(Float)
    delta: Mapped[float | None] = mapped_column(Float)
    accountant: Mapped[str | None] = mapped_column(String(32))
    steps: Mapped[int] = mapped_column(Integer)
    best_step: Mapped[int | None] = mapped_column(Integer)
    reliability: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    trajectories: Mapped[dict[str, Any]] = mapped_column(JSON)
    step_time_ms_median: Mapped[float | None] = mapped_column(Float)
    diverged_at: Mapped[int | None] = mapped_column(Integer)
    # The sweep's objective metric at the best checkpoint (None if not finite), so trials can
    # be sorted by it in SQL.
    objective: Mapped[float | None] = mapped_column(Float)
    # Which engine path trained it: "packed" or "generic" (NULL: stored before there were
    # two, so packed).
    engine_path: Mapped[str | None] = mapped_column(String(16))

    trial: Mapped[Trial] = relationship(back_populates="result")


class DatasetGrant(Base):
    """An owner's grant of a dataset to an analyst (another tenant), with an ε allowance.

    The analyst may submit sweeps on the dataset and reserve up to ``epsilon_allowance`` in
    total (what their sweeps reserve, less what they release unused, over every grant of the
    same records: :mod:`sweeper.datasets.grants`); the dataset's lifetime cap still bounds
    everyone together. A revoked grant (``revoked_at`` set) stops new reservations and new
    trials; what was charged stays charged. Rows are never deleted.
    """

    __tablename__ = "dataset_grants"
    __table_args__ = (Index("ix_dataset_grants_dataset_analyst", "dataset", "analyst"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    dataset: Mapped[str] = mapped_column(String(200))
    analyst: Mapped[str] = mapped_column(String(200), index=True)
    epsilon_allowance: Mapped[Decimal] = mapped_column(ExactDecimal())
    granted_by: Mapped[str | None] = mapped_column(String(200))
    note: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_by: Mapped[str | None] = mapped_column(String(200))


class ReleaseRecord(Base):
    """One entry of the audit log of releases: who received what, from which sweep and trial,
    at what ε, when. Append-only: the database refuses updates and deletes (triggers, see
    migration 0007), and nothing in the code writes one twice (``uq_release_records_what``).

    It keeps no foreign key: deleting a sweep keeps its audit trail, as it keeps its ledger.
    """

    __tablename__ = "release_records"
    __table_args__ = (
        UniqueConstraint("sweep_id", "trial_id", "kind", name="uq_release_records_what"),
        Index("ix_release_records_dataset_id", "dataset", "id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    # The ledger key of the records (their identity) and the name the sweep used.
    dataset: Mapped[str] = mapped_column(String(200))
    dataset_name: Mapped[str] = mapped_column(String(200))
    # Who received the release: the sweep's owner (NULL: local use).
    principal: Mapped[str | None] = mapped_column(String(200), index=True)
    sweep_id: Mapped[str] = mapped_column(String(32))
    trial_id: Mapped[str] = mapped_column(String(32), default="")  # "" for none
    # What: "trial" (a trial's metrics), "trial-failed" (a charged trial's failure),
    # "selected-trial" (a papernot-steinke grid's one release), "model" (a kept model).
    kind: Mapped[str] = mapped_column(String(32))
    grid: Mapped[str | None] = mapped_column(String(200))
    # The ε (and δ) charged for what this release covers; 0 for a model (covered by its
    # trial's release).
    epsilon: Mapped[Decimal] = mapped_column(ExactDecimal())
    delta: Mapped[Decimal] = mapped_column(ExactDecimal())
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class ModelArtifact(Base):
    """A trained model kept in the artifact store, with its model card.

    A row exists only once its file is completely written under ``key`` (temporary name, then
    rename) and its bytes hash to ``sha256``: a crash never leaves a row for a half-written
    file (:mod:`sweeper.artifacts.keeper`). Deleting the sweep (or the trial) deletes the row;
    the store's file is deleted after the row, and files no row names are collected.
    """

    __tablename__ = "model_artifacts"
    __table_args__ = (Index("ix_model_artifacts_sweep_grid", "sweep_id", "grid"),)

    trial_id: Mapped[str] = mapped_column(
        ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True
    )
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    # The tenant whose quota the bytes count against (the sweep's owner; NULL: local use).
    owner: Mapped[str | None] = mapped_column(String(200), index=True)
    grid: Mapped[str] = mapped_column(String(200))
    # The weights' file in the store (relative to its root); the card lies beside it.
    key: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    card: Mapped[dict[str, Any]] = mapped_column(JSON)
    card_sha256: Mapped[str] = mapped_column(String(64))
    card_size_bytes: Mapped[int] = mapped_column(BigInteger)
    # Trained in the labelled reproducible mode (noise and sampling from a public seed).
    reproducible: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class StagedModel(Base):
    """A kept model's weights between its trial's result and its artifact.

    Written in the same transaction as the trial's result, so that a driver killed before the
    artifact is in the store leaves the weights here, and the next driver writes them
    (:func:`sweeper.artifacts.keeper.flush_staged`); deleted in the transaction that adds the
    :class:`ModelArtifact` row.
    """

    __tablename__ = "staged_models"

    trial_id: Mapped[str] = mapped_column(
        ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True
    )
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    grid: Mapped[str] = mapped_column(String(200))
    weights: Mapped[bytes] = mapped_column(LargeBinary)
    # Public facts of the architecture the weights fit: input shape, classes, parameters.
    info: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class SweepEvent(Base):
    """One event of a sweep's life (state changes, metric points), for the live stream.

    Ids increase in commit order within a sweep: every transaction that appends events first
    locks the sweep's row (:func:`sweeper.sweeps.events.lock_sweep`), so a reader that resumes after
    id ``n`` never misses an event committed later with a smaller id.
    """

    __tablename__ = "sweep_events"
    __table_args__ = (Index("ix_sweep_events_sweep_id_id", "sweep_id", "id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    trial_id: Mapped[str | None] = mapped_column(String(32))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class ApiToken(Base):
    """A bearer token of the API. Only a hash of the secret is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)  # the owner of what it creates
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class IdempotencyRecord(Base):
    """The first response to a request that carried an ``Idempotency-Key``, to replay it."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("owner", "key", name="uq_idempotency_owner_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    owner: Mapped[str] = mapped_column(String(200))
    key: Mapped[str] = mapped_column(String(200))
    request_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[int | None] = mapped_column(Integer)  # None while the first is in progress
    body: Mapped[str | None] = mapped_column(Text)
    location: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class ServiceHeartbeat(Base):
    """A long-running process (a scheduler) and its last sign of life, for readiness."""

    __tablename__ = "service_heartbeats"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    info: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    beat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Audit(Base):
    """One canary audit (``dpsweep audit``, ``POST /api/v1/audits``): who asked, on which data
    (and which trial, for an audit of a trial's configuration), the request, and the result.

    ``error`` is a fixed public reason (:mod:`sweeper.driver.failures`), never an exception's
    text. ``charge`` is what the audit was charged (NULL: public data, nothing charged).
    """

    __tablename__ = "audits"
    __table_args__ = (Index("ix_audits_owner_created", "owner", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner: Mapped[str | None] = mapped_column(String(200))
    dataset: Mapped[str] = mapped_column(String(200))
    sweep_id: Mapped[str | None] = mapped_column(String(32), index=True)
    trial_id: Mapped[str | None] = mapped_column(String(32), index=True)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[AuditState] = mapped_column(
        SAEnum(AuditState, native_enum=False, length=16), default=AuditState.running
    )
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    charge: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
