"""The dataset catalog: built-in sets, uploaded files, and their lifetime budgets.

A sweep spec names its dataset by registry name (``digits``), by file (``csv`` with a
``path``, local use), or by an upload's id (``ds_...``, through the API). The id is also the
upload's key in the budget ledger, so every sweep on an uploaded file spends from one
lifetime budget, whoever runs it.

What is shown of an upload is what the planner and the model need and treats as public: the
number of examples (it sets the sample rate and bounds δ), of features and of classes. Never
rows, labels or class names: those are the private data.
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

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sweeper.ledger import BudgetLedger, EntryKind
from sweeper.store import Dataset, Sweep, iso
from workers.errors import ConfigError, DatasetError, DpsweepError, NotFound, PermissionDenied

UPLOAD_PREFIX = "ds_"
UPLOAD_FORMATS = ("csv", "npz")
# Registry names that need no file: every user may run sweeps on them.
BUILTIN = ("digits", "breast_cancer", "wine", "synthetic")
_LABEL = re.compile(r"^[\w .()+-]{1,200}$")


class DatasetNotFound(NotFound):
    """No dataset with that id that the caller may see."""


def is_upload(name: str) -> bool:
    return name.startswith(UPLOAD_PREFIX)


@dataclass(frozen=True)
class Viewer:
    """Who asks: an owner name (None: local use, sees everything) and whether an admin."""

    owner: str | None
    admin: bool = False

    def sees(self, owner: str | None) -> bool:
        return self.admin or self.owner is None or owner == self.owner


def _worker_spec(d: Any, *, path: str | None, name: str, label_column: str | None) -> Any:
    from workers.datasets import DatasetSpec

    get = d.get if isinstance(d, dict) else lambda k, default=None: getattr(d, k, default)
    # The scaling settings travel with the dataset: every loader (planner, upload check,
    # workers) must bound the inputs the same way. JSON gives the bounds back as a list.
    bounds, feature_clip = get("input_bounds"), get("feature_clip")
    return DatasetSpec(
        name=name,
        path=path,
        labels_path=get("labels_path"),
        label_column=label_column,
        test_fraction=float(get("test_fraction", 0.2)),
        split_seed=int(get("split_seed", 0)),
        options=dict(get("options", {}) or {}),
        input_bounds=None if bounds is None else (float(bounds[0]), float(bounds[1])),
        feature_clip=5.0 if feature_clip is None else float(feature_clip),
    )


def resolve(engine: Engine | None, dataset: Any) -> Any:
    """The worker-side :class:`workers.datasets.DatasetSpec` of a spec's dataset.

    Uploads (``ds_...``) are looked up in the catalog; anything else is passed through.

    Raises:
        ConfigError: an upload id that does not exist.
    """
    get = dataset.get if isinstance(dataset, dict) else lambda k, d=None: getattr(dataset, k, d)
    name = str(get("name"))
    if not is_upload(name):
        return _worker_spec(dataset, path=get("path"), name=name, label_column=get("label_column"))
    if engine is None:
        raise ConfigError(f"dataset {name!r} is an upload and needs the service's database")
    with Session(engine) as session:
        row = session.scalars(select(Dataset).where(Dataset.name == name)).first()
        if row is None or row.storage_path is None or row.format is None:
            raise ConfigError(
                f"no uploaded dataset {name!r}; GET /api/v1/datasets lists yours",
                field="dataset.name",
            )
        return _worker_spec(
            dataset,
            path=row.storage_path,
            name=row.format,
            label_column=(row.config or {}).get("label_column"),
        )


def check_access(engine: Engine, dataset: Any, viewer: Viewer) -> None:
    """Refuse a spec's dataset the viewer may not use: someone else's upload, or (for
    non-admins of the API) a file path on the server.

    Raises:
        ConfigError: with the field to fix.
    """
    get = dataset.get if isinstance(dataset, dict) else lambda k, d=None: getattr(dataset, k, d)
    name = str(get("name"))
    if viewer.owner is not None and not viewer.admin and (get("path") or get("labels_path")):
        raise ConfigError(
            "datasets given by a file path on the server are for admins; upload the file "
            "with POST /api/v1/datasets and name the returned id (ds_...) as dataset.name",
            field="dataset.path",
        )
    if is_upload(name):
        with Session(engine) as session:
            owner = session.scalars(select(Dataset.owner).where(Dataset.name == name)).first()
            exists = session.scalars(select(Dataset.id).where(Dataset.name == name)).first()
        if exists is None or not viewer.sees(owner):
            raise ConfigError(
                f"no uploaded dataset {name!r}; GET /api/v1/datasets lists yours",
                field="dataset.name",
            )


# ---------------------------------------------------------------------------------------------
# Uploads


def _describe_file(spec: Any, shown_as: str) -> dict[str, Any]:
    from workers.datasets import load_dataset

    try:
        data = load_dataset(spec)
    except (DatasetError, ConfigError) as exc:
        # Say what is wrong with the file without naming where the server keeps it.
        raise DatasetError(str(exc).replace(str(spec.path), shown_as)) from None
    return {
        "n_examples": int(data.n_train + data.x_test.shape[0]),
        "n_train": int(data.n_train),
        "input_shape": list(data.input_shape),
        "num_classes": int(data.num_classes),
        "kind": data.kind,
    }


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
) -> dict[str, Any]:
    """Validate and store an uploaded CSV or NPZ file, optionally with lifetime caps.

    The file is parsed exactly as a sweep will load it, so a malformed file is refused now,
    not when trials start. Nothing is kept of a refused upload.

    Returns:
        The dataset's description (as :func:`describe`).

    Raises:
        ConfigError / DatasetError: bad format, label column, label or caps.
    """
    if fmt not in UPLOAD_FORMATS:
        raise ConfigError(
            f"unknown upload format {fmt!r}; choose one of {', '.join(UPLOAD_FORMATS)}",
            field="format",
        )
    if fmt == "csv" and not label_column:
        raise ConfigError(
            "a CSV upload needs label_column (the header of the label column)",
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
    path = folder / f"{uid}.{fmt}"
    tmp = folder / f".{uid}.{fmt}.part"
    tmp.write_bytes(content)
    os.replace(tmp, path)
    try:
        spec = _worker_spec(
            {"test_fraction": 0.2, "split_seed": 0},
            path=str(path),
            name=fmt,
            label_column=label_column,
        )
        info = _describe_file(spec, filename)
        row = Dataset(
            name=uid,
            owner=owner,
            label=label or filename,
            format=fmt,
            size_bytes=len(content),
            sha256=hashlib.sha256(content).hexdigest(),
            storage_path=str(path.resolve()),
            n_examples=info["n_examples"],
            config={"label_column": label_column, **info},
        )
        with Session(engine) as session, session.begin():
            session.add(row)
        if epsilon_cap is not None or delta_cap is not None:
            BudgetLedger(engine).set_cap(uid, epsilon_cap=epsilon_cap, delta_cap=delta_cap)
    except (DpsweepError, IntegrityError):
        path.unlink(missing_ok=True)
        with Session(engine) as session, session.begin():
            stored = session.scalars(select(Dataset).where(Dataset.name == uid)).first()
            if stored is not None:
                session.delete(stored)
        raise
    return describe(engine, uid, Viewer(owner, admin=True))


# ---------------------------------------------------------------------------------------------
# Reading


_BUILTIN_CACHE: dict[str, dict[str, Any]] = {}


def _builtin(name: str) -> dict[str, Any]:
    if name not in _BUILTIN_CACHE:
        _BUILTIN_CACHE[name] = {
            "id": name,
            "name": name,
            "kind": "builtin",
            "format": None,
            "owner": None,
            "size_bytes": None,
            "created_at": None,
            **_describe_file(_worker_spec({}, path=None, name=name, label_column=None), name),
        }
    return dict(_BUILTIN_CACHE[name])


def _upload(row: Dataset) -> dict[str, Any]:
    cfg = dict(row.config or {})
    return {
        "id": row.name,
        "name": row.label or row.name,
        "kind": "upload",
        "format": row.format,
        "owner": row.owner,
        "size_bytes": row.size_bytes,
        "sha256": row.sha256,
        "label_column": cfg.get("label_column"),
        "created_at": iso(row.created_at),
        "n_examples": row.n_examples,
        "n_train": cfg.get("n_train"),
        "input_shape": cfg.get("input_shape"),
        "num_classes": cfg.get("num_classes"),
        "kind_of_data": cfg.get("kind"),
    }


def describe(engine: Engine, dataset_id: str, viewer: Viewer) -> dict[str, Any]:
    """One dataset as the API shows it.

    Raises:
        DatasetNotFound: no such dataset, or one the viewer may not see.
    """
    if dataset_id in BUILTIN:
        return _builtin(dataset_id)
    if is_upload(dataset_id):
        with Session(engine) as session:
            row = session.scalars(select(Dataset).where(Dataset.name == dataset_id)).first()
            if row is not None and viewer.sees(row.owner):
                return _upload(row)
    raise DatasetNotFound(f"no dataset {dataset_id!r}; GET /api/v1/datasets lists yours")


def list_datasets(engine: Engine, viewer: Viewer) -> list[dict[str, Any]]:
    """The built-in sets, then the viewer's uploads (everyone's for admins), newest first."""
    out = [_builtin(n) for n in BUILTIN]
    with Session(engine) as session:
        stmt = select(Dataset).where(Dataset.name.like(f"{UPLOAD_PREFIX}%"))
        if not (viewer.admin or viewer.owner is None):
            stmt = stmt.where(Dataset.owner == viewer.owner)
        out.extend(_upload(r) for r in session.scalars(stmt.order_by(Dataset.created_at.desc())))
    ledger = BudgetLedger(engine)
    for d in out:
        # One small read per dataset: the dashboard shows every set's budget bar.
        s = ledger.summary(d["id"])
        d["budget"] = {
            "epsilon_cap": _num(s.epsilon_cap),
            "delta_cap": _num(s.delta_cap),
            "epsilon_committed": float(s.epsilon_spent),
            "epsilon_reserved": float(s.epsilon_reserved),
            "epsilon_remaining": _num(s.remaining.epsilon),
        }
    return out


def _num(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def budget(engine: Engine, dataset_id: str, viewer: Viewer) -> dict[str, Any]:
    """A dataset's lifetime budget: caps, committed (charged), reserved, remaining, and the
    sweeps that spent or reserved it (only the viewer's own, unless an admin).

    Raises:
        DatasetNotFound: no such dataset, or one the viewer may not see.
    """
    describe(engine, dataset_id, viewer)  # existence and visibility
    ledger = BudgetLedger(engine)
    s = ledger.summary(dataset_id)
    rem = s.remaining
    per_sweep: dict[str, dict[str, Decimal]] = {}
    for e in ledger.entries(dataset_id):
        acc = per_sweep.setdefault(
            e.sweep_id,
            {k: Decimal(0) for k in ("er", "ec", "erel", "dr", "dc", "drel")},
        )
        if e.kind == EntryKind.RESERVE:
            acc["er"] += e.epsilon
            acc["dr"] += e.delta
        elif e.kind == EntryKind.CHARGE:
            acc["ec"] += e.epsilon
            acc["dc"] += e.delta
        else:
            acc["erel"] += e.epsilon
            acc["drel"] += e.delta
    sweeps = []
    with Session(engine) as session:
        rows = {
            r.id: r for r in session.scalars(select(Sweep).where(Sweep.id.in_(list(per_sweep))))
        }
    for sid, acc in per_sweep.items():
        row = rows.get(sid)
        if row is None or not viewer.sees(row.owner):
            continue
        sweeps.append(
            {
                "sweep": sid,
                "name": row.name,
                "state": row.state.value,
                "epsilon_charged": float(acc["ec"]),
                "epsilon_reserved": float(acc["er"] - acc["ec"] - acc["erel"]),
                "delta_charged": float(acc["dc"]),
                "delta_reserved": float(acc["dr"] - acc["dc"] - acc["drel"]),
            }
        )
    return {
        "dataset": dataset_id,
        "epsilon_cap": _num(s.epsilon_cap),
        "delta_cap": _num(s.delta_cap),
        "epsilon_committed": float(s.epsilon_spent),
        "delta_committed": float(s.delta_spent),
        "epsilon_reserved": float(s.epsilon_reserved),
        "delta_reserved": float(s.delta_reserved),
        "epsilon_remaining": _num(rem.epsilon),
        "delta_remaining": _num(rem.delta),
        "sweeps": sweeps,
    }


def set_caps(
    engine: Engine,
    dataset_id: str,
    viewer: Viewer,
    *,
    epsilon_cap: float | None,
    delta_cap: float | None,
) -> dict[str, Any]:
    """Set an upload's lifetime caps (its owner or an admin), or a built-in's (admins only).

    Raises:
        DatasetNotFound: not visible to the viewer.
        ConfigError: a cap below what is committed, or a built-in set by a non-admin.
    """
    describe(engine, dataset_id, viewer)
    if dataset_id in BUILTIN and not (viewer.admin or viewer.owner is None):
        raise PermissionDenied(
            f"the budget of the shared dataset {dataset_id!r} is set by an admin"
        )
    BudgetLedger(engine).set_cap(dataset_id, epsilon_cap=epsilon_cap, delta_cap=delta_cap)
    return budget(engine, dataset_id, viewer)
