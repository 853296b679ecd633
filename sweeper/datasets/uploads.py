"""Uploads: a user's file (CSV, NPZ, a plug-in's uploadable format), checked as a sweep will
load it and stored as ``ds_...``.

An upload is its owner's (and admins'); what may be shown of it is what
:func:`sweeper.datasets.files.load_file` returns.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, DpsweepError
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
from sweeper.datasets.views import describe
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.store import Dataset

# What an upload's label may be (it is shown to its owner and admins).
_LABEL = re.compile(r"^[\w .()+-]{1,200}$")


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
) -> dict[str, Any]:
    """Validate and store an uploaded file of an uploadable format (CSV, NPZ, a plug-in's:
    :data:`~sweeper.datasets.names.UPLOAD_FORMATS`), optionally with lifetime caps.

    The file is parsed exactly as a sweep will load it, so a malformed file is refused now,
    not when trials start. Nothing is kept of a refused upload.

    Its class list is declared now, from the file (the owner's action on the owner's file),
    and stored in the row's ``config["classes"]``: every later load encodes labels by it,
    never by the labels the records hold (:func:`sweeper.datasets.files.load_declared`).

    The upload is bound to the identity of its records in its owner's scope
    (:func:`bind_name`): records the same owner uploaded before (under any id, label or
    format) keep their ledger and cap. Caps given here can only tighten that cap, never lift
    it: otherwise uploading the same records again with a larger cap would buy a fresh
    budget. Records another tenant uploaded are another ledger: nothing here reads, caps or
    says anything of it (equal records are a fact about private data).

    With ``declare_counted``, the counted number of records, class list and feature shape
    are declared public at once (:mod:`sweeper.datasets.fixed_view`): the owner's choice,
    needed before any analyst is granted.

    Returns:
        The dataset's description (as :func:`sweeper.datasets.views.describe`).

    Raises:
        ConfigError / DatasetError: bad format, label column, label or caps.
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
    uid = UPLOAD_PREFIX + secrets.token_hex(12)
    folder = data_dir / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    suffix = upload_suffix(fmt)
    path = folder / f"{uid}{suffix}"
    tmp = folder / f".{uid}{suffix}.part"
    tmp.write_bytes(content)
    os.replace(tmp, path)
    try:
        spec = worker_spec(
            {"test_fraction": 0.2, "split_seed": 0},
            path=str(path),
            name=fmt,
            label_column=label_column,
        )
        spec, info, identity = load_declared(spec, filename)
        config = {"label_column": label_column, **info, "classes": list(spec.classes)}
        if declare_counted:
            config = declared_counts(config, info["n_examples"])
        binding = bind_name(
            engine,
            uid,
            identity,
            new_row={
                "owner": owner,
                "label": label or filename,
                "format": fmt,
                "size_bytes": len(content),
                "sha256": hashlib.sha256(content).hexdigest(),
                "storage_path": str(path.resolve()),
                "n_examples": info["n_examples"],
                "config": config,
            },
        )
        if epsilon_cap is not None or delta_cap is not None:
            BudgetLedger(engine).tighten_caps(
                binding.ledger_key, epsilon_cap=epsilon_cap, delta_cap=delta_cap
            )
    except (DpsweepError, IntegrityError):
        path.unlink(missing_ok=True)
        with Session(engine) as session, session.begin():
            stored = session.scalars(select(Dataset).where(Dataset.name == uid)).first()
            if stored is not None:
                session.delete(stored)
        raise
    return describe(engine, uid, Viewer(owner, admin=True))
