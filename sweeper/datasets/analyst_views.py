"""What a dataset's analysts see, and what its owner reads of their use: the analyst's
description and allowance, the owner's grants summary, the audit log and the policy.

An **analyst** of a dataset is a tenant that holds (or held) a grant from its owner
(:mod:`sweeper.datasets.grants`). They see only the dataset's public description: its shape,
number of records and classes (with a privacy unit: the unit column's name and the declared
number of units, never rows per unit), its format and label column, what its owner declared
public (``public_info``) and the evaluation modes they may use, with their own allowance and
spending.
Never the file's hash or size (the hash is a function of every record), the records' ledger
(other sweeps, other analysts' spending, the lifetime totals) or anything else about the data.

The audit log of a dataset (:func:`audit_page`) is that of the releases from sweeps that named
it: its owner reads every entry, an analyst their own, an admin (and local use) every entry on
the records under any name. Nothing here writes to the log. An entry's ``id`` is its number in
the log its reader reads (1, 2, ... in the order of the releases), never the table's id: that
one is global, and the gaps between an analyst's ids would count everyone else's releases.
An analyst reads each entry's time rounded down to 10 s.
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, DatasetNotFound
from dpsweep.spec import EVAL_MODES
from sweeper.datasets.access import Viewer
from sweeper.datasets.analyst_clock import coarse_time
from sweeper.datasets.fixed_view import checked_view, view_of
from sweeper.datasets.grants import (
    analyst_modes,
    dataset_row,
    owned_row,
    owns,
    policy_view,
    set_policy,
    usage,
)
from sweeper.datasets.identity import view_key
from sweeper.datasets.names import BUILTIN, is_upload
from sweeper.datasets.privacy_units import change_privacy_unit, unit_fields
from sweeper.privacy.ledger.amounts import ZERO, add_exact, sub_exact
from sweeper.privacy.release_log import entry_view
from sweeper.store import Dataset, DatasetGrant, ReleaseRecord
from sweeper.store.cursors import Page, decode_cursor, encode_cursor

OWNER, ANALYST = "owner", "analyst"


def _not_found(name: str) -> DatasetNotFound:
    return DatasetNotFound(f"no dataset {name!r}; GET /api/v1/datasets lists yours")


def latest_grant(session: Session, name: str, analyst: str) -> DatasetGrant | None:
    """The analyst's newest grant on ``name``, active or revoked (None: never granted)."""
    return session.scalars(
        select(DatasetGrant)
        .where(DatasetGrant.dataset == name, DatasetGrant.analyst == analyst)
        .order_by(DatasetGrant.created_at.desc(), DatasetGrant.id.desc())
    ).first()


def role_of(engine: Engine, name: str, viewer: Viewer) -> tuple[str, DatasetGrant | None]:
    """The viewer's part in dataset ``name``: ``owner`` (its uploader, an admin, local use) or
    ``analyst`` (a tenant holding or having held a grant on it), with the analyst's newest
    grant.

    Raises:
        DatasetNotFound: no such dataset, or one the viewer has no part in.
    """
    with Session(engine) as session:
        row = dataset_row(session, name)
        if row is None:
            if name in BUILTIN and (viewer.admin or viewer.owner is None):
                return OWNER, None
            raise _not_found(name)
        if owns(viewer, row):
            return OWNER, None
        g = latest_grant(session, name, viewer.owner) if viewer.owner is not None else None
        if g is None:
            raise _not_found(name)
        session.expunge(g)
        return ANALYST, g


def allowance_view(engine: Engine, g: DatasetGrant, ledger_key: str) -> dict[str, Any]:
    """An analyst's allowance on a dataset: what they may spend, hold, have left."""
    allowance = Decimal(g.epsilon_allowance)
    used = usage(engine, ledger_key, g.analyst)
    active = g.revoked_at is None
    left = sub_exact(allowance, used) if active and used < allowance else ZERO
    return {
        "epsilon_allowance": float(allowance),
        "epsilon_used": float(used),
        "epsilon_left": float(left),
        "active": active,
    }


def analyst_description(engine: Engine, row: Dataset, g: DatasetGrant) -> dict[str, Any]:
    """A dataset as its analyst sees it: the public description and their allowance."""
    cfg = dict(row.config or {})
    # Sizes, classes and shape as the owner declared them (the view), never counted from the
    # records (an undeclared one is null): the training share is the one every plan with a
    # held-out split uses.
    view = view_of(row).public()
    n = view.n_examples
    n_train = None if n is None else max(1, n - max(1, round(n * view.test_fraction)))
    return {
        "id": row.name,
        "name": row.label or row.name,
        "kind": "upload" if is_upload(row.name) else "registered",
        "role": ANALYST,
        "format": row.format,
        "label_column": cfg.get("label_column"),
        "n_examples": n,
        "n_train": n_train,
        "input_shape": None if view.input_shape is None else list(view.input_shape),
        "num_classes": None if view.classes is None else len(view.classes),
        "kind_of_data": cfg.get("kind"),
        # The unit's name, and the number of units only once declared: a count of the
        # owner's people is theirs to publish. Never rows per unit.
        **unit_fields(view),
        **_policy_fields(row),
        "allowance": allowance_view(engine, g, view_key(engine, row.name)),
    }


def _policy_fields(row: Dataset) -> dict[str, Any]:
    return {
        "public_info": dict(row.public_info or {}),
        "analyst_eval_modes": list(analyst_modes(row)),
    }


def owner_fields(session: Session, rows: list[Dataset]) -> dict[str, dict[str, Any]]:
    """Per name of ``rows``: what the owner's view adds (policy and a summary of the active
    grants: how many, and their allowances together), in one query."""
    names = [r.name for r in rows]
    summary: dict[str, tuple[int, Decimal]] = {}
    if names:
        # Amounts are exact text on SQLite: summed here, exactly, not in SQL.
        for name, amount in session.execute(
            select(DatasetGrant.dataset, DatasetGrant.epsilon_allowance).where(
                DatasetGrant.dataset.in_(names), DatasetGrant.revoked_at.is_(None)
            )
        ):
            n, total = summary.get(name, (0, ZERO))
            summary[name] = (n + 1, add_exact(total, Decimal(amount)))
    out = {}
    for r in rows:
        n, total = summary.get(r.name, (0, ZERO))
        out[r.name] = {
            "role": OWNER,
            **_policy_fields(r),
            "grants": {"active": n, "epsilon_allowance": float(total)},
        }
    return out


def analyst_datasets(engine: Engine, viewer: Viewer) -> list[dict[str, Any]]:
    """The datasets of others on which the viewer holds an active grant, newest grant first,
    each as its analyst sees it."""
    if viewer.owner is None or viewer.admin:
        return []  # local use and admins see every dataset as its owner
    with Session(engine) as session:
        pairs = session.execute(
            select(Dataset, DatasetGrant)
            .join(DatasetGrant, DatasetGrant.dataset == Dataset.name)
            .where(
                DatasetGrant.analyst == viewer.owner,
                DatasetGrant.revoked_at.is_(None),
                Dataset.storage_path.is_not(None),
                (Dataset.owner.is_(None)) | (Dataset.owner != viewer.owner),
            )
            .order_by(DatasetGrant.created_at.desc())
        ).all()
        for row, g in pairs:
            session.expunge(row)
            session.expunge(g)
    return [analyst_description(engine, row, g) for row, g in pairs]


# -- the audit log ------------------------------------------------------------------------------


def audit_page(
    engine: Engine,
    name: str,
    viewer: Viewer,
    *,
    analyst: str | None = None,
    after: int | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> Page:
    """A page of the audit log of dataset ``name``, oldest first.

    Its owner reads the releases of every sweep that named it, an analyst their own; an admin
    and local use read every release from the records, under any name.

    Each entry's ``id`` is its number in that log (the reader's: an analyst's first entry is 1
    whatever others released before it), in the order of the releases; ``analyst=`` keeps the
    numbers of the unfiltered log. The table's own ids are global and never shown.

    Args:
        analyst: Only this principal's entries (the owner's filter).
        after: Only entries after the one with this id (number).
        cursor: The ``next_cursor`` of the previous page.
        limit: At most this many entries.

    Raises:
        DatasetNotFound: no such dataset, or one the viewer has no part in.
        ConfigError: an invalid cursor, or both a cursor and ``after``.
    """
    role, _ = role_of(engine, name, viewer)
    if cursor and after is not None:
        raise ConfigError("give either cursor or after, not both", field="after")
    key = decode_cursor(cursor, length=1)
    start = after if key is None else key[0]
    if start is not None and (
        not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < 2**63
    ):
        raise ConfigError("invalid cursor", field="cursor" if key is not None else "after")
    # The reader's log, numbered in the order of the releases (the table's ids grow in that
    # order within a sweep, and one driver holds a sweep at a time).
    scope = [ReleaseRecord.dataset == view_key(engine, name)]
    if not (viewer.admin or viewer.owner is None):
        # Tenants read the releases of sweeps on this name: the same records under another
        # tenant's name are that tenant's business.
        scope.append(ReleaseRecord.dataset_name == name)
    if role == ANALYST:
        scope.append(ReleaseRecord.principal == viewer.owner)
    numbered = (
        select(
            ReleaseRecord.id.label("row_id"),
            func.row_number().over(order_by=ReleaseRecord.id).label("number"),
        )
        .where(*scope)
        .subquery()
    )
    stmt = select(ReleaseRecord, numbered.c.number).join(
        numbered, numbered.c.row_id == ReleaseRecord.id
    )
    if analyst is not None:
        stmt = stmt.where(ReleaseRecord.principal == analyst)
    if start is not None:
        stmt = stmt.where(numbered.c.number > start)
    with Session(engine) as session:
        rows = list(session.execute(stmt.order_by(numbered.c.number).limit(limit + 1)))
        items = [entry_view(r) | {"id": int(n)} for r, n in rows[:limit]]
    if role == ANALYST:
        # A release's time is its trial's end: the gaps between them would time the trials
        # (sweeper.datasets.analyst_clock).
        items = [i | {"at": coarse_time(i["at"])} for i in items]
    more = len(rows) > limit
    return Page(items, encode_cursor([items[-1]["id"]]) if more else None)


# -- the analysts' policy -----------------------------------------------------------------------


def dataset_policy(engine: Engine, name: str, viewer: Viewer) -> dict[str, Any]:
    """What analysts may use and see of dataset ``name`` (its owner and its analysts read it).

    Raises:
        DatasetNotFound: no such dataset, or one the viewer has no part in.
    """
    role, _ = role_of(engine, name, viewer)
    with Session(engine) as session:
        row = dataset_row(session, name)
        if row is None:
            raise _not_found(name)
        return policy_view(row, analyst=role == ANALYST)


def update_policy(
    engine: Engine,
    name: str,
    viewer: Viewer,
    *,
    analyst_eval_modes: list[str] | None = None,
    public_info: dict[str, Any] | None = None,
    view: dict[str, Any] | None = None,
    declare_counted: bool = False,
    set_unit: bool = False,
    privacy_unit: str | None = None,
) -> dict[str, Any]:
    """Change the policy (owner or admin): the evaluation modes when given, each
    ``public_info`` field given (a field set to None is withdrawn; one left out is kept), and
    each setting of the dataset's ``view`` given (:mod:`sweeper.datasets.fixed_view`).

    With ``set_unit`` (or ``privacy_unit`` inside ``view``), the dataset's privacy unit is
    set to ``privacy_unit`` (None: none) first, if its records' ledger allows it
    (:func:`sweeper.datasets.privacy_units.change_privacy_unit`); the rest is checked before
    anything changes, so a refused request changes nothing.

    Raises:
        DatasetNotFound / PermissionDenied: not the viewer's dataset (403 for its analysts).
        ConfigError: an unknown mode, a malformed description or view setting.
        IllegalState: a unit change the records' ledger refuses (409).
    """
    view = dict(view) if view else view
    if view and "privacy_unit" in view:
        inside = view.pop("privacy_unit")
        if set_unit and inside != privacy_unit:
            raise ConfigError(
                "privacy_unit is given twice, with two values: give it once",
                field="view.privacy_unit",
            )
        set_unit, privacy_unit = True, inside
    if set_unit:
        _precheck(engine, name, viewer, view, analyst_eval_modes, privacy_unit)
        change_privacy_unit(engine, name, viewer, privacy_unit)
    info = None
    if public_info is not None:
        with Session(engine) as session:
            row = dataset_row(session, name)
            current = dict(row.public_info or {}) if row is not None else {}
        merged = current | public_info
        info = {k: v for k, v in merged.items() if v is not None}
    return set_policy(
        engine,
        name,
        viewer,
        analyst_eval_modes=analyst_eval_modes,
        public_info=info,
        view=view,
        declare_counted_facts=declare_counted,
    )


def _precheck(
    engine: Engine,
    name: str,
    viewer: Viewer,
    view: dict[str, Any] | None,
    modes: list[str] | None,
    unit: str | None,
) -> None:
    """Check a policy's view and modes as they will apply after a unit change, before the
    unit changes (so that a request refused for them changes nothing).

    Raises:
        DatasetNotFound / PermissionDenied: not the viewer's dataset.
        ConfigError: as :func:`update_policy`.
    """
    with Session(engine) as session:
        row = owned_row(session, name, viewer)
        after = replace(view_of(row), privacy_unit=unit or None, n_units=None)
    if view:
        checked_view(after, view)
    bad = [m for m in modes or () if m not in EVAL_MODES]
    if bad:
        raise ConfigError(
            f"unknown evaluation mode(s) {bad}; allowed: {sorted(EVAL_MODES)}",
            field="analyst_eval_modes",
        )
