"""Settings of a sweep driver process (`dpsweep run`, the server): environment prefix DPSWEEP_."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class SweeperSettings(BaseSettings):
    """``DPSWEEP_RAY_ADDRESS=ray://...`` etc. override the defaults."""

    model_config = SettingsConfigDict(env_prefix="DPSWEEP_", extra="ignore", env_ignore_empty=True)

    database_url: str | None = Field(default=None, description="default: sqlite:///dpsweep.db")
    ray_address: str | None = Field(
        default=None, description="an existing Ray cluster; default: start a local Ray"
    )
    workers: int | None = Field(
        default=None, ge=1, description="concurrent packs; default: the cluster's CPUs"
    )
    ray_object_store_mb: int = Field(default=256, ge=64)
    gpu_fraction: float = Field(
        default=1.0, gt=0, le=1, description="GPU share of one pack when the cluster has GPUs"
    )
    gpus_per_trial: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="GPU share of one trial (a spec's resources.gpus_per_trial overrides it); "
        "a pack then asks for its trials' sum, at most one GPU",
    )
    poll_seconds: float = Field(
        default=0.25, gt=0, description="how often the driver checks for results and cancels"
    )
    heartbeat_seconds: float = Field(default=2.0, gt=0)
    stale_after_seconds: float = Field(
        default=20.0,
        gt=0,
        description="a driver silent this long is presumed dead and its sweep may be resumed",
    )
    drain_seconds: float = Field(
        default=30.0,
        ge=0,
        description="on shutdown, how long running trials may finish before they are stopped",
    )
    max_concurrent_sweeps: int = Field(
        default=1, ge=1, description="sweeps a scheduler drives at once"
    )
    checkpoints_dir: str = Field(
        default="./dpsweep-checkpoints",
        description="where registered checkpoints live (one subdirectory per name, with its "
        "manifest dpsweep-checkpoint.json; dpsweep checkpoints register): a spec's "
        "model.checkpoint names one of them",
    )
    artifact_url: str | None = Field(
        default=None,
        description="where trained models are kept: a directory or an fsspec URL (s3://, "
        "gs://, a shared mount); default: <db>-artifacts beside the SQLite file",
    )
    artifact_quota_mb: float | None = Field(
        default=None,
        gt=0,
        description="most megabytes of kept models per tenant (default: no limit)",
    )
    idempotency_ttl_hours: float = Field(
        default=24.0, gt=0, description="how long an Idempotency-Key replays its response"
    )
    upload_ttl_days: float = Field(
        default=30.0,
        ge=0,
        description="unused uploads (no sweep, no active grant) are deleted after this many "
        "days (their ledgers stay); 0: never",
    )
    expiry_every_seconds: float = Field(
        default=600.0, gt=0, description="how often the scheduler expires keys and uploads"
    )
    max_pack_size: int | None = Field(
        default=None, ge=1, description="most trials per pack (default: the workers' setting)"
    )
