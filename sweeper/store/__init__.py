"""The store: the project's declarative base, column types, engines, schema and rows.

Modules:

* :mod:`sweeper.store.base` — the one declarative base and its metadata;
* :mod:`sweeper.store.types` — column types (exact decimals, UTC timestamps), which frozen
  migrations import;
* :mod:`sweeper.store.engine` — database URLs and engines (the SQLite locking set-up);
* :mod:`sweeper.store.schema` — Alembic migrations, driven programmatically;
* :mod:`sweeper.store.rows` — the rows of datasets, sweeps, trials, results, events, tokens;
* :mod:`sweeper.store.tokens` — the API-token repository;
* :mod:`sweeper.store.artifact_files` — the artifact store (kept models' bytes), and the deletion
  of a sweep's model rows with their files;
* :mod:`sweeper.store.model_refs` — what a trial listing says about its kept model;
* :mod:`sweeper.store.cursors` — the page cursors of the API's listings.

The rows and helpers below are importable from ``sweeper.store`` itself, as they always were.
The budget ledger's tables (:mod:`sweeper.privacy.ledger`) share :data:`metadata`; they join it
when that package is imported (``migrations/env.py`` imports both).
"""

from __future__ import annotations

from sweeper.store.base import Base, LedgerBase, metadata
from sweeper.store.rows import (
    ApiToken,
    Audit,
    AuditState,
    Dataset,
    DatasetGrant,
    IdempotencyRecord,
    MetricPoint,
    ModelArtifact,
    ReleaseRecord,
    ServiceHeartbeat,
    StagedModel,
    Sweep,
    SweepEvent,
    SweepState,
    Trial,
    TrialResultRow,
    TrialState,
    iso,
    new_id,
    sweep_ledger_key,
)

__all__ = [
    "ApiToken",
    "Audit",
    "AuditState",
    "Base",
    "Dataset",
    "DatasetGrant",
    "IdempotencyRecord",
    "LedgerBase",
    "MetricPoint",
    "ModelArtifact",
    "ReleaseRecord",
    "ServiceHeartbeat",
    "StagedModel",
    "Sweep",
    "SweepEvent",
    "SweepState",
    "Trial",
    "TrialResultRow",
    "TrialState",
    "iso",
    "metadata",
    "new_id",
    "sweep_ledger_key",
]
