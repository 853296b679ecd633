"""Settings of the API server process: environment prefix ``DPSWEEP_``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ApiSettings(BaseSettings):
    """``DPSWEEP_MAX_UPLOAD_BYTES=...`` etc. override the defaults."""

    model_config = SettingsConfigDict(env_prefix="DPSWEEP_", extra="ignore", env_ignore_empty=True)

    database_url: str | None = Field(default=None, description="default: sqlite:///dpsweep.db")
    auth: bool = Field(
        default=True,
        description="require bearer tokens; off only with `dpsweep serve --no-auth` on loopback",
    )
    data_dir: Path = Field(default=Path("dpsweep-data"), description="where uploads are kept")
    max_spec_bytes: int = Field(default=256 * 1024, ge=1024, description="largest sweep spec")
    max_trials_per_sweep: int = Field(
        default=5000, ge=1, description="most trials one sweep may plan"
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
    max_upload_bytes: int = Field(default=64 * 2**20, ge=1024, description="largest dataset upload")
    page_size: int = Field(default=50, ge=1, le=1000)
    max_page_size: int = Field(default=500, ge=1, le=10000)
    planner_processes: int = Field(
        default=0, ge=0, description="processes that plan sweeps (0: one per CPU, at most 4)"
    )
    sse_poll_seconds: float = Field(
        default=0.2,
        gt=0,
        description="SQLite: how often the API checks PRAGMA data_version for events written "
        "by other processes (a counter, no table read); PostgreSQL uses LISTEN/NOTIFY",
    )
    sse_fallback_seconds: float = Field(
        default=5.0,
        gt=0,
        description="a live stream re-reads its sweep's events at least this often, in case a "
        "notification was missed",
    )
    sse_keepalive_seconds: float = Field(default=10.0, gt=0)
    scheduler_stale_seconds: float = Field(
        default=20.0, gt=0, description="/ready wants a scheduler heartbeat this recent"
    )
    db_pool_size: int = Field(default=20, ge=1)
    # Blocking request work (database reads, summaries) runs in threads. Under the GIL more
    # threads add no CPU, only contention: with anyio's default of 40, fifty concurrent
    # clients made a p99 three times the median; with 8 the queue is served in order.
    threads: int = Field(
        default=8,
        ge=1,
        description="threads that run blocking request work (database reads, summaries) at "
        "once; other requests queue in order",
    )
    warm_summaries: int = Field(
        default=8,
        ge=0,
        description="at start, build the cached summaries of this many most recently ended "
        "sweeps in the background (0: none)",
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description="a bootstrap admin token made valid at start (deployments without a shell)",
    )
    dev: bool = Field(
        default=False,
        description="dev mode: allows the example secrets of .env.example (never in production)",
    )
    idempotency_wait_seconds: float = Field(
        default=120.0,
        gt=0,
        description="how long a repeated request waits for the first one with its key",
    )
