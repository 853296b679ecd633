"""Migration 0010 rewrites the legacy accountant names of stored specs and plans once."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from dpsweep.spec import PrivacyConfig
from sweeper.store.schema import downgrade, upgrade


def _hash(spec: dict[str, Any]) -> str:
    kept = {k: v for k, v in spec.items() if k not in ("resources", "artifacts")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


SWEEPS = sa.table(
    "sweeps",
    sa.column("id", sa.String()),
    sa.column("name", sa.String()),
    sa.column("dataset", sa.String()),
    sa.column("spec", sa.JSON()),
    sa.column("plan", sa.JSON()),
    sa.column("state", sa.String()),
    sa.column("spec_hash", sa.String()),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("updated_at", sa.DateTime(timezone=True)),
)


def _spec(accountant: str) -> dict[str, Any]:
    return {"name": "s", "privacy": {"budgets": [1.0], "delta": 1e-5, "accountant": accountant}}


def test_legacy_names_become_canonical_and_hashes_follow(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url, "0009")
    engine = sa.create_engine(url)
    now = datetime.now(UTC)
    rows = {
        "a": (_spec("prv"), [{"accountant": "pld"}], True),
        "b": (_spec("rdp"), [{"accountant": "rdp"}, {"accountant": "rdp"}], True),
        "c": (_spec("pld"), [{"accountant": "rdp (RepeatAndSelect)"}], True),
        "d": (_spec("prv"), None, False),  # a hash of something else is left alone
    }
    with engine.begin() as conn:
        for sid, (spec, plan, hashed) in rows.items():
            conn.execute(
                SWEEPS.insert().values(
                    id=sid,
                    name="s",
                    dataset="digits",
                    spec=spec,
                    plan=plan,
                    state="pending",
                    spec_hash=_hash(spec) if hashed else "f" * 64,
                    created_at=now,
                    updated_at=now,
                )
            )
    upgrade(url, "0010")
    with engine.connect() as conn:
        got = {r.id: r for r in conn.execute(sa.select(SWEEPS)).all()}
    assert got["a"].spec["privacy"]["accountant"] == "pld"
    assert got["a"].plan == [{"accountant": "pld"}]
    assert got["a"].spec_hash == _hash(got["a"].spec) != _hash(rows["a"][0])
    assert got["b"].spec["privacy"]["accountant"] == "dp-rdp"
    assert got["b"].plan == [{"accountant": "dp-rdp"}] * 2
    assert got["b"].spec_hash == _hash(got["b"].spec)
    assert got["c"].spec == rows["c"][0] and got["c"].spec_hash == _hash(rows["c"][0])
    assert got["c"].plan == [{"accountant": "rdp (RepeatAndSelect)"}]
    assert got["d"].spec["privacy"]["accountant"] == "pld" and got["d"].spec_hash == "f" * 64
    # What the spec model now parses a legacy name to is what the migration stored.
    for sid in ("a", "b"):
        stored = got[sid].spec["privacy"]
        assert PrivacyConfig(**rows[sid][0]["privacy"]).accountant == stored["accountant"]
    downgrade(url, "0009")
    with engine.connect() as conn:
        back = {r.id: r for r in conn.execute(sa.select(SWEEPS)).all()}
    assert back["b"].spec["privacy"]["accountant"] == "rdp"
    assert back["b"].plan == [{"accountant": "rdp"}] * 2
    assert back["b"].spec_hash == _hash(rows["b"][0])
    assert back["a"].spec["privacy"]["accountant"] == "pld"  # pld parses before 0010 too
