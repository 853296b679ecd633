"""The store: SQLAlchemy 2.0 models of sweeps, trials, metrics and results.

The database is the single source of truth for sweep state. Models share one metadata with the
budget ledger (:mod:`sweeper.ledger`), and the schema is created and upgraded only by Alembic
migrations (``dpsweep db upgrade``; see :mod:`sweeper.db`).
"""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy import Enum as SAEnum
from sqlalchemy.orm import Mapped, mapped_column, relationship

from sweeper.ledger import LedgerBase

Base = LedgerBase  # one metadata for the ledger and the store
metadata = Base.metadata


def _now() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return uuid.uuid4().hex


class SweepState(enum.StrEnum):
    pending = "pending"
    running = "running"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"


class TrialState(enum.StrEnum):
    pending = "pending"
    running = "running"
    done = "done"
    failed = "failed"
    interrupted = "interrupted"
    cancelled = "cancelled"


class Dataset(Base):
    """A dataset known to the service. Its lifetime budget lives in the ledger's table."""

    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    n_examples: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


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

    trials: Mapped[list[Trial]] = relationship(back_populates="sweep", cascade="all, delete-orphan")


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (Index("ix_trials_sweep_state", "sweep_id", "state"),)

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

    trial: Mapped[Trial] = relationship(back_populates="result")
