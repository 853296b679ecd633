"""canonical accountant names: legacy names in sweeps' specs and plans rewritten once

Specs said ``privacy.accountant: prv`` (the default; it always meant dp_accounting's PLD) or
``rdp`` (dp_accounting's RDP); grid plans said ``rdp``. They become the registry's names
(``pld``, ``dp-rdp``; :data:`dpsweep.accountants.LEGACY_ACCOUNTANTS`). Papernot-steinke plans'
``rdp (RepeatAndSelect)`` is what the planner still writes and is kept. A sweep's
``spec_hash`` is recomputed where it was the hash of the stored spec, so that ``dpsweep run
SPEC`` still resumes it (the spec now parses to the canonical name). Nothing is recomputed:
the same accountants, the same numbers.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# Frozen copies: a migration does not follow later edits of the application's tables.
SPEC_UP = {"prv": "pld", "rdp": "dp-rdp"}
PLAN_UP = {"rdp": "dp-rdp"}
# Downgrade: the names the code before 0010 parses (its spec Literal had pld, prv, rdp).
SPEC_DOWN = {"dp-rdp": "rdp"}
PLAN_DOWN = {"dp-rdp": "rdp"}

_sweeps = sa.table(
    "sweeps",
    sa.column("id", sa.String()),
    sa.column("spec", sa.JSON()),
    sa.column("plan", sa.JSON()),
    sa.column("spec_hash", sa.String()),
)


def _hash(spec: dict[str, Any]) -> str:
    # sweeper.sweeps.create.spec_hash over the stored dump.
    kept = {k: v for k, v in spec.items() if k not in ("resources", "artifacts")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def _rewrite(spec_names: dict[str, str], plan_names: dict[str, str]) -> None:
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(_sweeps.c.id, _sweeps.c.spec, _sweeps.c.plan, _sweeps.c.spec_hash)
    ).all()
    for sweep_id, spec, plan, old_hash in rows:
        values: dict[str, Any] = {}
        privacy = spec.get("privacy") if isinstance(spec, dict) else None
        name = privacy.get("accountant") if isinstance(privacy, dict) else None
        if isinstance(name, str) and name in spec_names:
            new_spec = {**spec, "privacy": {**privacy, "accountant": spec_names[name]}}
            values["spec"] = new_spec
            if old_hash is not None and old_hash == _hash(spec):
                values["spec_hash"] = _hash(new_spec)
        if isinstance(plan, list) and any(
            isinstance(g, dict) and g.get("accountant") in plan_names for g in plan
        ):
            values["plan"] = [
                {**g, "accountant": plan_names[g["accountant"]]}
                if isinstance(g, dict) and g.get("accountant") in plan_names
                else g
                for g in plan
            ]
        if values:
            conn.execute(_sweeps.update().where(_sweeps.c.id == sweep_id).values(**values))


def upgrade() -> None:
    _rewrite(SPEC_UP, PLAN_UP)


def downgrade() -> None:
    # "pld" parses before 0010 too; which specs said "prv" is not kept (the same accountant).
    _rewrite(SPEC_DOWN, PLAN_DOWN)
