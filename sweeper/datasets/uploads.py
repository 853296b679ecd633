"""Uploads: a user's file (CSV, NPZ, a plug-in's uploadable format), checked as a sweep will
load it and stored as ``ds_...``.

An upload is its owner's (and admins'); what may be shown of it is what
:func:`sweeper.datasets.files.load_file` returns. Its answer also says which ledger its records
joined (:func:`upload_ledger`): the owner's own earlier datasets of the same records and what
they spent, never anything of another tenant's.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, DpsweepError, IllegalState
from sweeper.datasets.access import Viewer
from sweeper.datasets.files import load_declared, worker_spec
from sweeper.datasets.fixed_view import declare_counted as declared_counts
from sweeper.datasets.identity import bind_name
from sweeper.datasets.names import (
    UPLOAD_FORMATS,
    UPLOAD_PREFIX,
    article,
    file_noun,
    upload_suffix,
)
from sweeper.datasets.privacy_units import checked_unit
from sweeper.datasets.registration import names_of, whose
from sweeper.datasets.views import describe
from sweeper.privacy.ledger.amounts import (
    ZERO,
    add_exact,
    delta_amount,
    epsilon_amount,
    show_amount,
)
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.keys import scoped_identity_key
from sweeper.privacy.ledger.records import BudgetSummary
from sweeper.store import Dataset

# What an upload's label may be (it is shown to its owner and admins).
_LABEL = re.compile(r"^[\w .()+-]{1,200}$")


@dataclass(frozen=True)
class _Records:
    """An uploaded file, read as a sweep will read it: its stored row and its identity."""

    row: dict[str, Any]
    content_sha256: str


def store_upload(
    engine: Engine,
    *,
    owner: str | None,
    content: bytes,
    fmt: str,
    data_dir: Path,
    filename: str = "upload",
    label: str | None = None,
    label_column: str | None = None,
    epsilon_cap: float | None = None,
    delta_cap: float | None = None,
    declare_counted: bool = False,
    admin: bool = False,
    privacy_unit: str | None = None,
) -> dict[str, Any]:
    """Validate and store an uploaded file of an uploadable format (CSV, NPZ, a plug-in's:
    :data:`~sweeper.datasets.names.UPLOAD_FORMATS`), optionally with lifetime caps.

    The file is parsed exactly as a sweep will load it, so a malformed file is refused now,
    not when trials start. Nothing is kept of a refused upload, and a refusal spends nothing.

    Its class list is declared now, from the file (the owner's action on the owner's file),
    and stored in the row's ``config["classes"]``: every later load encodes labels by it,
    never by the labels the records hold (:func:`sweeper.datasets.files.load_declared`).

    The upload is bound to the identity of its records in its owner's scope
    (:func:`bind_name`): records the same owner uploaded or registered before (under any
    id, label or format) keep their ledger and cap, and the answer's ``ledger`` says so, with
    what they spent. A cap given here applies to that ledger: below what it has committed it
    is refused (422), above its cap it is refused (409: an upload never raises a cap, or
    uploading the same records again would buy budget; the owner raises it with ``PUT
    .../budget``), otherwise it tightens it. Records another tenant uploaded are another
    ledger: nothing here reads, caps or says anything of it (equal records are a fact about
    private data).

    The same file with the same settings uploaded again by its owner is not stored twice:
    the earlier upload is returned (``ledger.existing``). An ``admin`` (who sees every
    owner's datasets) is also told of other owners' names of the same records
    (``ledger.held_elsewhere``): other ledgers, whose spending does not count on this one.

    With ``declare_counted``, the counted number of records, class list and feature shape
    are declared public at once (:mod:`sweeper.datasets.fixed_view`): the owner's choice,
    needed before any analyst is granted.

    ``privacy_unit``: the column (CSV) or array (NPZ) saying whose each row is (e.g.
    ``patient_id``): stored in the row's ``config``, read by every load (never a feature),
    fixed for every spec; the number of units is counted now (``n_units``). The records'
    ledger is bound to the unit (None: ``example``) before the upload is kept: records whose
    ledger counts another unit are refused (409) and nothing is stored.

    Returns:
        The dataset's description (as :func:`sweeper.datasets.views.describe`) and its
        ``ledger`` (:func:`upload_ledger`).

    Raises:
        ConfigError / DatasetError: bad format, label column, label or caps.
        IllegalState: a cap above the one the records already have, or a ledger of the
            records that counts another privacy unit.
    """
    _check_request(fmt, label_column, label, epsilon_cap, delta_cap)
    unit = checked_unit(privacy_unit)
    uid = UPLOAD_PREFIX + secrets.token_hex(12)
    path = _write_file(data_dir, uid, fmt, content)
    try:
        records = _read_records(
            path, content, fmt, filename, label_column, declare_counted, owner, label, unit
        )
        key = scoped_identity_key(records.content_sha256, owner=owner)
        earlier = names_of(engine, records.content_sha256, owner=owner)
        before = BudgetLedger(engine).summary(key)
        # Before anything is stored: a cap this upload cannot apply refuses it whole.
        _check_caps(before, earlier, epsilon_cap, delta_cap)
        same = _keep_upload(
            engine, uid, path, owner, records, key, epsilon_cap=epsilon_cap, delta_cap=delta_cap
        )
    except (DpsweepError, IntegrityError):
        _discard(engine, uid, path)
        raise
    elsewhere = _held_elsewhere(engine, records.content_sha256, owner) if admin else None
    out = _answer(engine, owner, same or uid, key, earlier, before, existing=same is not None)
    if elsewhere:
        out["ledger"]["held_elsewhere"] = elsewhere
        out["ledger"]["message"] += (
            f"; other owners' datasets hold the same records ({', '.join(elsewhere)}): other "
            "ledgers, whose spending does not count on this one"
        )
    return out


def _keep_upload(
    engine: Engine,
    uid: str,
    path: Path,
    owner: str | None,
    records: _Records,
    key: str,
    *,
    epsilon_cap: float | None,
    delta_cap: float | None,
) -> str | None:
    """Keep a checked upload: bound to its records as ``uid`` or, if its owner uploaded the
    same file with the same settings before, not at all (its file goes); then its caps
    tighten the ledger ``key``. Returns the earlier upload's id, if any."""
    same = _same_upload(engine, owner, records.row)
    if same is None:
        unit = records.row["config"].get("privacy_unit")
        bind_name(
            engine,
            uid,
            records.content_sha256,
            new_row=records.row,
            privacy_unit=unit,
            bind_unit=True,
        )
    else:
        path.unlink(missing_ok=True)
    if epsilon_cap is not None or delta_cap is not None:
        BudgetLedger(engine).tighten_caps(key, epsilon_cap=epsilon_cap, delta_cap=delta_cap)
    return same


def _held_elsewhere(engine: Engine, content_sha256: str, owner: str | None) -> list[str]:
    """Other owners' names of the same records, for an admin's upload (admins see them all),
    each with whose it is."""
    other = Dataset.owner.is_not(None) if owner is None else Dataset.owner.is_distinct_from(owner)
    with Session(engine) as session:
        rows = session.execute(
            select(Dataset.name, Dataset.owner)
            .where(Dataset.content_sha256 == content_sha256, other)
            .order_by(Dataset.name)
        ).all()
    return [f"{name!r} ({whose(o)})" for name, o in rows]


def _answer(
    engine: Engine,
    owner: str | None,
    name: str,
    key: str,
    earlier: list[str],
    before: BudgetSummary,
    *,
    existing: bool,
) -> dict[str, Any]:
    """The upload's answer: its description, and the ledger its records joined."""
    out = describe(engine, name, Viewer(owner, admin=True))
    held = before.epsilon_cap is not None or before.delta_cap is not None
    held = held or max(before.epsilon_spent, before.epsilon_reserved) > ZERO
    others = [n for n in earlier if n != name]
    out["ledger"] = upload_ledger(
        engine, key, others, name=name, existing=existing, held_before=held
    )
    return out


def _check_request(
    fmt: str,
    label_column: str | None,
    label: str | None,
    epsilon_cap: float | None,
    delta_cap: float | None,
) -> None:
    """Refuse a request that names no usable format, label column, label or caps.

    Raises:
        ConfigError: naming the field.
    """
    if fmt not in UPLOAD_FORMATS:
        raise ConfigError(
            f"unknown upload format {fmt!r}; choose one of {', '.join(UPLOAD_FORMATS)}",
            field="format",
        )
    # deferred: workers.datasets pulls numpy and every loader
    from workers.datasets.descriptors import get_dataset_descriptor

    if "label_column" in get_dataset_descriptor(fmt).needs and not label_column:
        raise ConfigError(
            f"{article(file_noun(fmt))} {file_noun(fmt)} upload needs label_column (the header "
            "of the label column)",
            field="label_column",
        )
    if label is not None and not _LABEL.match(label):
        raise ConfigError(
            "label must be 1-200 letters, digits, spaces or . ( ) + - _", field="label"
        )
    for name, cap, upper in (("epsilon_cap", epsilon_cap, None), ("delta_cap", delta_cap, 1.0)):
        if cap is not None and not (cap >= 0 and (upper is None or cap < upper)):
            bound = "in [0, 1)" if upper else "finite and >= 0"
            raise ConfigError(f"{name} must be {bound}; got {cap}", field=name)


def _write_file(data_dir: Path, uid: str, fmt: str, content: bytes) -> Path:
    """Write the upload under ``data_dir/uploads`` (a temporary name, then renamed)."""
    folder = data_dir / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    suffix = upload_suffix(fmt)
    path = folder / f"{uid}{suffix}"
    tmp = folder / f".{uid}{suffix}.part"
    tmp.write_bytes(content)
    os.replace(tmp, path)
    return path


def _read_records(
    path: Path,
    content: bytes,
    fmt: str,
    filename: str,
    label_column: str | None,
    declare_counted: bool,
    owner: str | None,
    label: str | None,
    privacy_unit: str | None,
) -> _Records:
    """Load the stored file as a sweep will, and the ``datasets`` row it would get.

    Raises:
        DatasetError: the file cannot be read as ``fmt`` (or has no unit column
            ``privacy_unit``).
    """
    spec = worker_spec(
        {"test_fraction": 0.2, "split_seed": 0},
        path=str(path),
        name=fmt,
        label_column=label_column,
        privacy_unit=privacy_unit,
    )
    spec, info, identity = load_declared(spec, filename)
    config = {"label_column": label_column, **info, "classes": list(spec.classes)}
    if privacy_unit:
        config["privacy_unit"] = privacy_unit
    if declare_counted:
        config = declared_counts(config, info["n_examples"])
    row = {
        "owner": owner,
        "label": label or filename,
        "format": fmt,
        "size_bytes": len(content),
        "sha256": hashlib.sha256(content).hexdigest(),
        "storage_path": str(path.resolve()),
        "n_examples": info["n_examples"],
        "config": config,
    }
    return _Records(row=row, content_sha256=identity)


def _same_upload(engine: Engine, owner: str | None, row: dict[str, Any]) -> str | None:
    """The owner's earlier upload of the same file with the same settings (its id), if any:
    uploading it again returns it rather than storing a copy under another id."""
    same_owner = Dataset.owner.is_(None) if owner is None else Dataset.owner == owner
    with Session(engine) as session:
        found = session.execute(
            select(Dataset.name, Dataset.config)
            .where(
                same_owner,
                Dataset.name.like(f"{UPLOAD_PREFIX}%"),
                Dataset.sha256 == row["sha256"],
                Dataset.format == row["format"],
                Dataset.label == row["label"],
            )
            .order_by(Dataset.created_at)
        ).all()
    return next((name for name, config in found if config == row["config"]), None)


def _discard(engine: Engine, uid: str, path: Path) -> None:
    """Remove what a refused upload left: its file and, if it was bound, its row."""
    path.unlink(missing_ok=True)
    with Session(engine) as session, session.begin():
        session.execute(delete(Dataset).where(Dataset.name == uid))


def _names(earlier: list[str]) -> str:
    """The owner's datasets of the same records, as a message names them."""
    names = ", ".join(repr(n) for n in earlier[:5]) + (", ..." if len(earlier) > 5 else "")
    return f"your dataset{'s' if len(earlier) > 1 else ''} {names}"


def _holders(earlier: list[str]) -> str:
    """Whose ledger an upload joins, as a message names it."""
    if not earlier:
        return "your earlier upload of these records (deleted since: its ledger stays)"
    return f"{_names(earlier)} (the same records)"


def _check_caps(
    summary: BudgetSummary,
    earlier: list[str],
    epsilon_cap: float | None,
    delta_cap: float | None,
) -> None:
    """Refuse caps an upload cannot apply to the ledger its records join, naming why.

    Raises:
        ConfigError: a cap below what the ledger has committed (spent + reserved).
        IllegalState: a cap above the ledger's cap (an upload never raises one).
    """
    for field, given, cap, spent, reserved in (
        ("epsilon_cap", epsilon_cap, summary.epsilon_cap, summary.epsilon_spent,
         summary.epsilon_reserved),
        ("delta_cap", delta_cap, summary.delta_cap, summary.delta_spent, summary.delta_reserved),
    ):  # fmt: skip
        if given is None:
            continue
        amount = (
            epsilon_amount(given, field) if field == "epsilon_cap" else delta_amount(given, field)
        )
        committed = add_exact(spent, reserved)
        if amount < committed:
            raise ConfigError(
                f"{field}={show_amount(amount)} is below what {_holders(earlier)} already "
                f"committed ({show_amount(spent)} spent + {show_amount(reserved)} reserved): "
                "this upload shares their ledger, so its cap must be at least that. Nothing "
                "was stored",
                field=field,
            )
        if cap is not None and amount > cap:
            raise IllegalState(
                f"{field}={show_amount(amount)} would raise the lifetime cap "
                f"{show_amount(cap)} of {_holders(earlier)}, whose ledger this upload shares "
                f"({show_amount(spent)} spent); an upload never raises a cap. Upload without "
                f"{field}, or raise the cap with PUT /api/v1/datasets/ID/budget. Nothing was "
                "stored"
            )


def upload_ledger(
    engine: Engine,
    key: str,
    others: list[str],
    *,
    name: str,
    existing: bool,
    held_before: bool = False,
) -> dict[str, Any]:
    """What an upload's answer says of the ledger its records joined (the owner's own).

    Args:
        engine: The store's engine.
        key: The ledger's key (the records' identity in the owner's scope).
        others: The owner's other names of the same records.
        name: The upload's id.
        existing: Whether ``name`` is an earlier upload of the same file, returned.
        held_before: Whether the ledger had a cap or spending before this upload (a deleted
            upload's: deleting a name keeps its records' ledger).
    """
    s = BudgetLedger(engine).summary(key)
    spent = (
        f"ε {show_amount(s.epsilon_spent)} spent, {show_amount(s.epsilon_reserved)} reserved, "
        + ("no cap" if s.epsilon_cap is None else f"cap {show_amount(s.epsilon_cap)}")
    )
    again = "uploading records again never resets a budget"
    if existing:
        message = (
            f"the same file and settings as your upload {name!r}: it is returned and nothing "
            f"new was stored ({spent})"
        )
    elif others:
        shares = f"this upload shares their ledger ({spent})"
        message = f"the same records as {_names(others)}: {shares}; {again}"
    elif held_before:
        message = (
            "these records have a ledger from your earlier upload of them (deleted since): "
            f"this upload shares it ({spent}); {again}"
        )
    else:
        message = f"a ledger of its own ({spent})"
    remaining = s.remaining.epsilon
    return {
        "shared_with": others,
        "existing": existing,
        "epsilon_cap": None if s.epsilon_cap is None else float(s.epsilon_cap),
        "delta_cap": None if s.delta_cap is None else float(s.delta_cap),
        "epsilon_committed": float(s.epsilon_spent),
        "delta_committed": float(s.delta_spent),
        "epsilon_reserved": float(s.epsilon_reserved),
        "delta_reserved": float(s.delta_reserved),
        "epsilon_remaining": None if remaining is None else float(Decimal(remaining)),
        "message": message,
    }
