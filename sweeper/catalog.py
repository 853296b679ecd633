"""The dataset catalog: built-in sets, uploaded and registered files, and their budgets.

A sweep spec names its dataset by registry name (``digits``), by file (``csv`` with a
``path``, local use), by an upload's id (``ds_...``, through the API), or by a name an
operator registered (``dpsweep datasets register FILE --name NAME``).

**Identity.** Every name is bound (``datasets.content_sha256``) to the identity of the records
it reads (:func:`workers.datasets.content_sha256`), and the budget ledger is keyed by that
identity (``sha256:<hex>``), not by the name: the same records uploaded twice, registered
under two names, converted from CSV to NPZ or shuffled share one lifetime cap and one ledger.
Deleting or re-registering a name touches no ledger. A name first bound after ledgers were
keyed by name carries its old ledger row over (:func:`bind_name`). The identity is shown to
the operator (the CLI) only: it is a deterministic function of every record, so someone who
knows all records but one could test guesses of the last against it; the API and every
message name the dataset by its name.

What is shown of an upload is what the planner and the model need and treats as public: the
number of examples (it sets the sample rate and bounds δ), of features and of classes. Never
rows, labels or class names: those are the private data.

**Public datasets.** The owner of a registered file may declare its records public
(``dpsweep datasets register FILE --name NAME --public``, stored as ``public`` in the row's
``config``): such a name may then be a spec's public evaluation dataset (``eval: {mode:
public, dataset: NAME}``, :func:`resolve`), whose records no epsilon covers. Registering a
name again sets the flag to what is given then (without ``--public``: not public), so a
declaration never outlives the file it was made for. Loader names (``digits``...) and uploads
are never declared public.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dpsweep.errors import DatasetNotFound
from sweeper.charges import EXACT, exact_sum
from sweeper.ledger import (
    BudgetLedger,
    CarriedOver,
    EntryKind,
    identity_key,
    writable,
)
from sweeper.store import Dataset, Sweep, SweepState, iso
from workers.errors import ConfigError, DatasetError, DpsweepError, PermissionDenied

UPLOAD_PREFIX = "ds_"
UPLOAD_FORMATS = ("csv", "npz")
# Registry names that need no file: every user may run sweeps on them.
BUILTIN = ("digits", "breast_cancer", "wine", "synthetic")
_LABEL = re.compile(r"^[\w .()+-]{1,200}$")
# Names given with `dpsweep datasets register`: no ":" (file names in specs are "csv:PATH", and
# identity keys "sha256:HEX"), so a registered name can never be mistaken for either.
_REGISTERED = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,99}$")


def is_upload(name: str) -> bool:
    return name.startswith(UPLOAD_PREFIX)


def in_catalog(name: str) -> bool:
    """Whether a spec's dataset name is looked up in the catalog (an upload or a registered
    name) rather than being a loader of :mod:`workers.datasets` (``digits``, ``csv``...)."""
    from workers.datasets import DATASETS

    return is_upload(name) or name not in DATASETS


@dataclass(frozen=True)
class Viewer:
    """Who asks: an owner name (None: local use, sees everything) and whether an admin."""

    owner: str | None
    admin: bool = False

    def sees(self, owner: str | None) -> bool:
        return self.admin or self.owner is None or owner == self.owner


def _worker_spec(
    d: Any,
    *,
    path: str | None,
    name: str,
    label_column: str | None,
    labels_path: str | None = None,
) -> Any:
    from workers.datasets import DatasetSpec

    get = d.get if isinstance(d, dict) else lambda k, default=None: getattr(d, k, default)
    # The scaling settings travel with the dataset: every loader (planner, upload check,
    # workers) must bound the inputs the same way. JSON gives the bounds back as a list.
    bounds, feature_clip = get("input_bounds"), get("feature_clip")
    return DatasetSpec(
        name=name,
        path=path,
        labels_path=labels_path or get("labels_path"),
        label_column=label_column,
        test_fraction=float(get("test_fraction", 0.2)),
        split_seed=int(get("split_seed", 0)),
        options=dict(get("options", {}) or {}),
        input_bounds=None if bounds is None else (float(bounds[0]), float(bounds[1])),
        feature_clip=5.0 if feature_clip is None else float(feature_clip),
    )


def resolve(engine: Engine | None, dataset: Any, evaluation: Any = None) -> Any:
    """The worker-side :class:`workers.datasets.DatasetSpec` of a spec's dataset.

    Uploads (``ds_...``) and registered names are looked up in the catalog (their stored
    file, format and label column); loader names (``digits``, ``csv`` with a path) are
    passed through.

    Args:
        engine: The store's engine (None: local use without a database; catalog names then
            cannot be resolved).
        dataset: The spec's ``dataset`` section (a :class:`sweeper.spec.DatasetConfig` or a
            dict).
        evaluation: The spec's ``eval`` section (:class:`sweeper.spec.EvalConfig`, or a dict
            with ``mode`` and ``dataset``); None: mode ``carve-out``. Mode ``public`` resolves
            ``dataset`` to a registered name its owner declared public
            (:func:`public_eval_spec`).

    Returns:
        The worker spec with ``evaluation`` (and in mode ``public`` ``eval_dataset``) set.

    Raises:
        ConfigError: an upload id or name that does not exist, or a path given with a
            registered name (field ``dataset.*``); an evaluation dataset that is not a
            registered name declared public, or is the training dataset (``eval.dataset``).
    """
    spec = _resolve_training(engine, dataset)
    mode, eval_name = _eval_settings(evaluation)
    if mode == "carve-out":
        return spec
    if mode == "dp":
        return replace(spec, evaluation="dp")
    get = dataset.get if isinstance(dataset, dict) else lambda k, d=None: getattr(dataset, k, d)
    eval_spec = public_eval_spec(engine, eval_name, training=str(get("name")))
    return replace(spec, evaluation="public", eval_dataset=eval_spec)


def _eval_settings(evaluation: Any) -> tuple[str, str | None]:
    """``(mode, dataset)`` of a spec's ``eval`` section (an EvalConfig, a dict or None)."""
    if evaluation is None:
        return "carve-out", None
    get = (
        evaluation.get
        if isinstance(evaluation, dict)
        else lambda k, d=None: getattr(evaluation, k, d)
    )
    name = get("dataset")
    mode = get("mode") or ("public" if name is not None else "carve-out")
    if mode not in ("carve-out", "public", "dp"):
        raise ConfigError(
            f"unknown eval mode {mode!r}; choose one of: carve-out, public, dp", field="eval.mode"
        )
    return str(mode), None if name is None else str(name)


_HOW_TO_PUBLISH = (
    "its owner registers public records with `dpsweep datasets register FILE --name NAME --public`"
)


def public_eval_spec(engine: Engine | None, name: str | None, *, training: str) -> Any:
    """The worker spec of a public evaluation dataset: a registered name whose owner declared
    its records public (``register_file(..., public=True)``).

    Raises:
        ConfigError (field ``eval.dataset``): no name; an upload id or a loader name (never
            declared public); the training dataset's own name or records; a name that is not
            registered or not declared public; no database.
    """
    from workers.datasets import DATASETS

    field = "eval.dataset"
    if not name:
        raise ConfigError(
            "eval mode public needs eval.dataset: a registered name declared public "
            f"({_HOW_TO_PUBLISH})",
            field=field,
        )
    if name == training:
        raise ConfigError(
            f"eval.dataset {name!r} is the training dataset: evaluation records are never "
            f"trained on; {_HOW_TO_PUBLISH} under a name of their own",
            field=field,
        )
    if is_upload(name):
        raise ConfigError(
            f"eval.dataset {name!r} is an upload: uploads are never declared public; "
            f"{_HOW_TO_PUBLISH}",
            field=field,
        )
    if name in DATASETS:
        raise ConfigError(
            f"eval.dataset {name!r} is a loader of dpsweep, not a dataset declared public by its "
            f"owner; {_HOW_TO_PUBLISH}",
            field=field,
        )
    if engine is None:
        raise ConfigError(
            f"eval.dataset {name!r} is in the catalog and needs the service's database",
            field=field,
        )
    with Session(engine) as session:
        row = session.scalars(select(Dataset).where(Dataset.name == name)).first()
        trained = (
            session.scalars(select(Dataset.content_sha256).where(Dataset.name == training)).first()
            if in_catalog(training)
            else None
        )
    if row is None or row.storage_path is None or row.format is None:
        raise ConfigError(
            f"no registered dataset {name!r} for eval.dataset (`dpsweep datasets list` lists "
            f"them); {_HOW_TO_PUBLISH}",
            field=field,
        )
    if not _public_flag(row):
        raise ConfigError(
            f"eval.dataset {name!r} is not declared public by its owner; register it with "
            f"`dpsweep datasets register FILE --name {name} --public`",
            field=field,
        )
    if trained and row.content_sha256 == trained:
        raise ConfigError(
            f"eval.dataset {name!r} reads the same records as the training dataset: "
            "evaluation records are never trained on; evaluate on other records",
            field=field,
        )
    return _file_spec(row)


def _public_flag(row: Dataset) -> bool:
    return bool(dict(row.config or {}).get("public", False))


def is_public(engine: Engine, name: str) -> bool:
    """Whether ``name`` is a registered file whose owner declared its records public."""
    if is_upload(name) or not in_catalog(name):
        return False
    with Session(engine) as session:
        row = session.scalars(select(Dataset).where(Dataset.name == name)).first()
    return row is not None and bool(row.storage_path) and _public_flag(row)


def _resolve_training(engine: Engine | None, dataset: Any) -> Any:
    """:func:`resolve` of the training dataset alone (mode ``carve-out``)."""
    get = dataset.get if isinstance(dataset, dict) else lambda k, d=None: getattr(dataset, k, d)
    name = str(get("name"))
    if not in_catalog(name):
        return _worker_spec(dataset, path=get("path"), name=name, label_column=get("label_column"))
    upload = is_upload(name)
    if not upload and (get("path") or get("labels_path")):
        raise ConfigError(
            f"dataset {name!r} is a registered name: it reads the file it was registered with; "
            "leave out path and labels_path",
            field="dataset.path",
        )
    if engine is None:
        raise ConfigError(f"dataset {name!r} is in the catalog and needs the service's database")
    with Session(engine) as session:
        row = session.scalars(select(Dataset).where(Dataset.name == name)).first()
    if row is None or row.storage_path is None or row.format is None:
        raise ConfigError(_unknown(name), field="dataset.name")
    return _file_spec(row, dataset)


def _unknown(name: str) -> str:
    if is_upload(name):
        return f"no uploaded dataset {name!r}; GET /api/v1/datasets lists yours"
    from workers.datasets import dataset_names

    return (
        f"unknown dataset {name!r}: neither a loader ({', '.join(dataset_names())}) nor a name "
        "registered with `dpsweep datasets register` (`dpsweep datasets list` lists them)"
    )


def _file_spec(row: Dataset, dataset: Any = None) -> Any:
    """The worker spec of a stored file (an upload or a registered name); split and scaling
    settings from ``dataset`` (a spec's), the file's own settings from the row."""
    cfg = dict(row.config or {})
    assert row.storage_path is not None and row.format is not None
    return _worker_spec(
        dataset if dataset is not None else {},
        path=row.storage_path,
        name=row.format,
        label_column=cfg.get("label_column"),
        labels_path=cfg.get("labels_path"),
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
    if in_catalog(name):
        # Registered names have no owner: they are files on the server, for admins (and local
        # use), like a path; uploads are their owner's.
        with Session(engine) as session:
            owner = session.scalars(select(Dataset.owner).where(Dataset.name == name)).first()
            exists = session.scalars(select(Dataset.id).where(Dataset.name == name)).first()
        if exists is None or not viewer.sees(owner):
            raise ConfigError(_unknown(name), field="dataset.name")


# ---------------------------------------------------------------------------------------------
# Identity: names bound to the content of their records


@dataclass(frozen=True)
class Binding:
    """A name bound to the identity of its records (see :func:`bind_name`)."""

    name: str
    content_sha256: str
    previous_sha256: str | None
    """The identity the name was bound to before, when it was another (the file changed)."""
    carried: CarriedOver | None
    """The name's ledger row from before ledgers were keyed by content, now the identity's."""
    inherited_caps: bool
    """The new identity had no ledger and took the caps of the name's previous identity."""
    shared_with: tuple[str, ...]
    """Other names bound to the same identity (they share its cap and ledger)."""

    @property
    def ledger_key(self) -> str:
        return identity_key(self.content_sha256)


def bind_name(
    engine: Engine,
    name: str,
    content_sha256: str,
    *,
    new_row: dict[str, Any] | None = None,
    row_update: dict[str, Any] | None = None,
) -> Binding:
    """Record that ``name`` now reads the records whose identity is ``content_sha256``.

    * A name not in the ``datasets`` table gets a row (with ``new_row``'s fields).
    * A name bound to another identity before (its file was edited) is re-bound. The new
      records get a ledger of their own (nothing spent on the old ones moves, they are other
      data), but if that ledger is new it takes the old identity's caps: an edit must not lift
      the cap its data owner set.
    * A ledger row still keyed by the name (from before ledgers were keyed by content) is
      carried over to the identity's: spent and reserved add up, every entry moves, and the
      stricter cap applies (:meth:`BudgetLedger.carry_over`). Sweeps stored under the name
      are re-pointed at the identity in the same transaction, so their charges and releases
      find their reservation. Nothing spent is lost. This runs on every bind, so a row that
      old code wrote under the name later is carried over too.

    Args:
        engine: The store's engine (a read-only one is used for writing all the same).
        name: The name (``digits``, ``csv:PATH``, ``ds_...``, a registered name).
        content_sha256: The identity (:func:`workers.datasets.content_sha256`).
        new_row: Fields of a new ``datasets`` row (config, n_examples, format, ...).
        row_update: Fields to set on an existing row (a re-registration's file).

    Returns:
        The binding.
    """
    key = identity_key(content_sha256)
    engine = writable(engine)
    ledger = BudgetLedger(engine)
    with Session(engine) as session:
        previous = session.scalars(
            select(Dataset.content_sha256).where(Dataset.name == name)
        ).first()
    inherited = False
    if previous and previous != content_sha256:
        inherited = ledger.inherit_caps(identity_key(previous), key) is not None

    def bind(session: Session) -> None:
        # Sweeps stored before ledgers were keyed by content reserved under the name; their
        # entries move to the identity in this same transaction, so they follow.
        session.execute(
            update(Sweep)
            .where(Sweep.ledger_key.is_(None), Sweep.dataset == name)
            .values(ledger_key=key)
            .execution_options(synchronize_session=False)
        )
        row = session.scalars(select(Dataset).where(Dataset.name == name)).first()
        if row is None:
            session.add(Dataset(name=name, content_sha256=content_sha256, **(new_row or {})))
        else:
            row.content_sha256 = content_sha256
            for field, value in (row_update or {}).items():
                setattr(row, field, value)
        session.flush()

    note = f" [carried over from the ledger of name {name!r}]"
    try:
        carried = ledger.carry_over(name, key, note=note, within=bind)
    except IntegrityError:
        # Another process added the same name at the same moment (PostgreSQL): once more,
        # now updating its row.
        carried = ledger.carry_over(name, key, note=note, within=bind)
    with Session(engine) as session:
        shared = session.scalars(
            select(Dataset.name)
            .where(Dataset.content_sha256 == content_sha256, Dataset.name != name)
            .order_by(Dataset.name)
        ).all()
    return Binding(
        name=name,
        content_sha256=content_sha256,
        previous_sha256=previous if previous and previous != content_sha256 else None,
        carried=carried,
        inherited_caps=inherited,
        shared_with=tuple(shared),
    )


_BUILTIN_IDENTITY: dict[str, str] = {}


def _spec_of_name(name: str, row: Dataset | None) -> Any:
    """The worker spec of what a stored name reads.

    Raises:
        DatasetNotFound: a name that reads nothing known.
    """
    if row is not None and row.storage_path and row.format:
        return _file_spec(row)
    cfg = dict(row.config or {}) if row is not None else {}
    if cfg.get("name"):  # a name stored by a sweep: its spec's dataset
        return _worker_spec(
            cfg, path=cfg.get("path"), name=str(cfg["name"]), label_column=cfg.get("label_column")
        )
    if name in BUILTIN:
        return _worker_spec({}, path=None, name=name, label_column=None)
    raise DatasetNotFound(f"no dataset {name!r}; `dpsweep datasets list` lists them")


def content_identity(engine: Engine, name: str) -> str:
    """The identity (hex) a name is bound to; a name not bound yet (stored before identities
    existed, or a built-in never used) is loaded and bound now (:func:`bind_name`).

    Raises:
        DatasetNotFound: no such name.
        DatasetError: its file cannot be loaded (moved, edited into something invalid).
    """
    with Session(engine) as session:
        row = session.scalars(select(Dataset).where(Dataset.name == name)).first()
        if row is not None:
            session.expunge(row)
    if row is not None and row.content_sha256:
        return row.content_sha256
    spec = _spec_of_name(name, row)
    builtin = row is None and name in BUILTIN
    if builtin and name in _BUILTIN_IDENTITY:
        sha = _BUILTIN_IDENTITY[name]
    else:
        from workers.datasets import dataset_content_sha256

        sha = dataset_content_sha256(spec)
        if builtin:
            _BUILTIN_IDENTITY[name] = sha  # bundled with scikit-learn: the same all process long
    new_row = {"config": {"name": name}, "n_examples": _builtin(name)["n_examples"]}
    bind_name(engine, name, sha, new_row=new_row if builtin else None)
    return sha


def ledger_key_of(engine: Engine, name: str) -> str:
    """The ledger key (``sha256:<hex>``) of the records a name reads (see
    :func:`content_identity`)."""
    return identity_key(content_identity(engine, name))


def _view_key(engine: Engine, name: str) -> str:
    """The ledger key to *show* for a name: its identity's, or, for a name stored before
    identities whose file can no longer be loaded, the name itself (its old ledger)."""
    try:
        return ledger_key_of(engine, name)
    except (ConfigError, OSError):  # DatasetError included: a file gone or now invalid
        return name


# ---------------------------------------------------------------------------------------------
# Registered names (`dpsweep datasets ...`, the operator's)

REGISTER_FORMATS = ("csv", "npz", "idx")


def _format_of(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in REGISTER_FORMATS:
            raise ConfigError(
                f"unknown format {fmt!r}; choose one of {', '.join(REGISTER_FORMATS)}",
                field="format",
            )
        return fmt
    suffixes = [x.lower() for x in path.suffixes]
    if suffixes[-1:] == [".csv"]:
        return "csv"
    if suffixes[-1:] == [".npz"]:
        return "npz"
    if ".idx" in suffixes or "ubyte" in path.name.lower():
        return "idx"
    raise ConfigError(
        f"cannot tell the format of {path.name!r} from its name; give --format "
        f"({', '.join(REGISTER_FORMATS)})",
        field="format",
    )


def check_registered_name(name: str) -> None:
    """Refuse a name that could be mistaken for another kind of dataset name.

    Raises:
        ConfigError: naming the rule.
    """
    from workers.datasets import DATASETS

    if not _REGISTERED.match(name) or is_upload(name):
        raise ConfigError(
            f"dataset name {name!r}: use 1-100 letters, digits and . _ - starting with a "
            f"letter, not starting with {UPLOAD_PREFIX!r} (upload ids)",
            field="name",
        )
    if name in DATASETS:
        raise ConfigError(
            f"{name!r} is a loader of dpsweep ({', '.join(sorted(DATASETS))}); choose another name",
            field="name",
        )


def register_file(
    engine: Engine,
    path: str | Path,
    *,
    name: str,
    fmt: str | None = None,
    label_column: str | None = None,
    labels_path: str | Path | None = None,
    public: bool = False,
) -> tuple[Binding, dict[str, Any]]:
    """Load and check a data file and bind ``name`` to the identity of its records.

    The file is parsed exactly as a sweep will load it (NaN and inf refused). A spec may then
    name it (``dataset: {name: NAME}``). Registering a name again re-reads its file: the same
    records keep their ledger; other records (an edited file) get their own, which starts with
    the old one's caps (:func:`bind_name`).

    ``public``: the owner declares these records public, so the name may be a spec's public
    evaluation dataset (``eval.dataset``); no epsilon covers them. Stored in the row's
    ``config``; registering again sets it to what is given then (default: not public).

    Returns:
        The binding (``shared_with``: other names of the same records, which share its cap
        and ledger) and what may be shown of the data (N, shape, classes).

    Raises:
        ConfigError / DatasetError: a bad name, format, file or label setting.
    """
    check_registered_name(name)
    file = Path(path).expanduser().resolve()
    fmt = _format_of(file, fmt)
    if fmt == "csv" and not label_column:
        raise ConfigError("a CSV file needs --label-column (its label column's header)")
    if fmt == "idx" and not labels_path:
        raise ConfigError("an IDX images file needs --labels-path (the IDX labels file)")
    labels = str(Path(labels_path).expanduser().resolve()) if labels_path else None
    with Session(engine) as session:
        existing = session.scalars(select(Dataset).where(Dataset.name == name)).first()
        if existing is not None and not existing.storage_path:
            raise ConfigError(
                f"{name!r} is already the name of a dataset sweeps used without registering "
                "it; choose another name",
                field="name",
            )
    spec = _worker_spec({}, path=str(file), name=fmt, label_column=label_column, labels_path=labels)
    info, identity = _load_file(spec, str(file))
    fields: dict[str, Any] = {
        "label": name,
        "format": fmt,
        "size_bytes": file.stat().st_size,
        "sha256": None,
        "storage_path": str(file),
        "n_examples": info["n_examples"],
        "config": {
            "label_column": label_column,
            "labels_path": labels,
            **info,
            "public": bool(public),
        },
    }
    binding = bind_name(engine, name, identity, new_row=fields, row_update=fields)
    return binding, {**info, "public": bool(public)}


def names_of(engine: Engine, content_sha256: str) -> list[str]:
    """Every name bound to an identity, sorted."""
    with Session(engine) as session:
        return list(
            session.scalars(
                select(Dataset.name)
                .where(Dataset.content_sha256 == content_sha256)
                .order_by(Dataset.name)
            )
        )


def holding_sweeps(engine: Engine, name: str, content_sha256: str | None) -> list[str]:
    """Ids of unfinished sweeps on a name's records (under any name), oldest first: each
    holds (or is about to hold) a reservation on them."""
    terms: list[Any] = [(Sweep.ledger_key.is_(None)) & (Sweep.dataset == name)]
    if content_sha256:
        terms.append(Sweep.ledger_key == identity_key(content_sha256))
    with Session(engine) as session:
        return list(
            session.scalars(
                select(Sweep.id)
                .where(or_(*terms), Sweep.state.in_([SweepState.pending, SweepState.running]))
                .order_by(Sweep.created_at)
            )
        )


def delete_name(engine: Engine, name: str) -> list[str]:
    """Delete a name (its ``datasets`` row); never a ledger, never a file.

    The identity's cap, spend and entries stay: the same records registered or uploaded again
    find them. Refused while any sweep holds a reservation on the records (under any name):
    its trials still need to resolve their data, and an operator who deletes a name in use
    most likely meant something else.

    Returns:
        The names that still read the same records.

    Raises:
        DatasetNotFound: no such name.
        IllegalState: a sweep holds a reservation on the name's records.
    """
    from dpsweep.errors import IllegalState

    with Session(engine) as session:
        row = session.scalars(select(Dataset).where(Dataset.name == name)).first()
    if row is None:
        raise DatasetNotFound(f"no dataset named {name!r}; `dpsweep datasets list` lists them")
    content = row.content_sha256
    holders = holding_sweeps(engine, name, content)
    key = identity_key(content) if content else name
    summary = BudgetLedger(engine).summary(key)
    if holders or summary.epsilon_reserved > 0 or summary.delta_reserved > 0:
        which = (
            f"sweep(s) {', '.join(holders)} hold"
            if holders
            else f"ε {float(summary.epsilon_reserved):g} / δ {float(summary.delta_reserved):g} "
            "is still"
        )
        raise IllegalState(
            f"dataset {name!r} is not deleted: {which} reserved on its records; let them "
            "finish or cancel them (`dpsweep cancel SWEEP_ID`) first. Deleting a name never "
            "deletes its records' ledger."
        )
    with Session(engine) as session, session.begin():
        stored = session.scalars(select(Dataset).where(Dataset.name == name)).first()
        if stored is not None:
            session.delete(stored)
    return [n for n in names_of(engine, content) if n != name] if content else []


# ---------------------------------------------------------------------------------------------
# Uploads


def _load_file(spec: Any, shown_as: str) -> tuple[dict[str, Any], str]:
    """What may be shown of a dataset file (see the module docstring), and its identity."""
    from workers.datasets import load_dataset

    try:
        data = load_dataset(spec)
    except (DatasetError, ConfigError) as exc:
        # Say what is wrong with the file without naming where the server keeps it.
        raise DatasetError(str(exc).replace(str(spec.path), shown_as)) from None
    info = {
        "n_examples": int(data.n_train + data.x_test.shape[0]),
        "n_train": int(data.n_train),
        "input_shape": list(data.input_shape),
        "num_classes": int(data.num_classes),
        "kind": data.kind,
    }
    return info, data.content_sha256


def _describe_file(spec: Any, shown_as: str) -> dict[str, Any]:
    return _load_file(spec, shown_as)[0]


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

    The upload is bound to the identity of its records (:func:`bind_name`): records uploaded
    before (under any id, name or format) keep their ledger and cap. Caps given here can only
    tighten that cap, never lift it: otherwise uploading the same records again with a larger
    cap would buy a fresh budget.

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
        info, identity = _load_file(spec, filename)
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
                "config": {"label_column": label_column, **info},
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
        "kind": "upload" if is_upload(row.name) else "registered",
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
    if in_catalog(dataset_id):
        # Uploads, and names registered by the operator (no owner: admins see them).
        with Session(engine) as session:
            row = session.scalars(select(Dataset).where(Dataset.name == dataset_id)).first()
            if row is not None and row.storage_path and viewer.sees(row.owner):
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
        # One small read per dataset: the dashboard shows every set's budget bar. The bar is
        # the identity's: names of the same records show the same bar.
        s = ledger.summary(_view_key(engine, d["id"]))
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


def _left_of(acc: dict[str, Decimal], reserved: str, charged: str, released: str) -> Decimal:
    """What a sweep still holds: reserved - charged - released, exactly."""
    return EXACT.subtract(acc[reserved], exact_sum((acc[charged], acc[released])))


def budget(engine: Engine, dataset_id: str, viewer: Viewer) -> dict[str, Any]:
    """A dataset's lifetime budget: caps, committed (charged), reserved, remaining, and the
    sweeps that spent or reserved it (only the viewer's own, unless an admin).

    The budget is that of the dataset's records (its identity): every name of the same
    records shows the same totals, and the sweeps of all of them.

    Raises:
        DatasetNotFound: no such dataset, or one the viewer may not see.
    """
    describe(engine, dataset_id, viewer)  # existence and visibility
    key = _view_key(engine, dataset_id)
    ledger = BudgetLedger(engine)
    s = ledger.summary(key)
    rem = s.remaining
    per_sweep: dict[str, dict[str, Decimal]] = {}
    for e in ledger.entries(key):
        acc = per_sweep.setdefault(
            e.sweep_id,
            {k: Decimal(0) for k in ("er", "ec", "erel", "dr", "dc", "drel")},
        )
        # Exact sums (the ledger's own context): Decimal's default 28 digits would round, and
        # a fully released sweep would show -7e-26 reserved.
        e_key, d_key = {
            EntryKind.RESERVE: ("er", "dr"),
            EntryKind.CHARGE: ("ec", "dc"),
        }.get(e.kind, ("erel", "drel"))
        acc[e_key] = exact_sum((acc[e_key], e.epsilon))
        acc[d_key] = exact_sum((acc[d_key], e.delta))
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
                "epsilon_reserved": float(
                    EXACT.subtract(acc["er"], exact_sum((acc["ec"], acc["erel"])))
                ),
                "delta_charged": float(acc["dc"]),
                "delta_reserved": float(
                    EXACT.subtract(acc["dr"], exact_sum((acc["dc"], acc["drel"])))
                ),
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

    The caps are those of the dataset's records: they apply to every name of the same
    records. So a user may set them only if every such name is an upload of their own; the
    records of anyone else's dataset are capped by an admin (a re-upload must not be a way
    to lift someone else's cap).

    Raises:
        DatasetNotFound: not visible to the viewer.
        PermissionDenied: a built-in, or records that other datasets share, set by a non-admin.
        ConfigError: a cap below what is committed.
    """
    describe(engine, dataset_id, viewer)
    admin = viewer.admin or viewer.owner is None
    if dataset_id in BUILTIN and not admin:
        raise PermissionDenied(
            f"the budget of the shared dataset {dataset_id!r} is set by an admin"
        )
    content = content_identity(engine, dataset_id)
    if not admin:
        with Session(engine) as session:
            owners = set(
                session.scalars(select(Dataset.owner).where(Dataset.content_sha256 == content))
            )
        if owners != {viewer.owner}:
            raise PermissionDenied(
                f"the records of dataset {dataset_id!r} are also another dataset's; their "
                "lifetime budget is set by an admin"
            )
    try:
        BudgetLedger(engine).set_cap(
            identity_key(content), epsilon_cap=epsilon_cap, delta_cap=delta_cap
        )
    except ConfigError as exc:
        raise ConfigError(f"{dataset_id}: {exc}", field=exc.field) from None
    return budget(engine, dataset_id, viewer)
