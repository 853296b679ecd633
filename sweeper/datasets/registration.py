"""Registered names (`dpsweep datasets ...`, the operator's): register, list, delete.

An operator registers a data file on the server under a name (``dpsweep datasets register
FILE --name NAME``); a spec may then name it. Deleting a name never deletes its records'
ledger (:mod:`sweeper.datasets.identity`); it deletes the models its sweeps kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, or_, select
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, DatasetNotFound, IllegalState
from sweeper.datasets.files import load_declared, worker_spec
from sweeper.datasets.identity import Binding, bind_name
from sweeper.datasets.names import article, check_registered_name, file_noun, format_of
from sweeper.datasets.privacy_units import checked_unit
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.keys import scoped_identity_key
from sweeper.settings import SweeperSettings
from sweeper.store import Dataset, ModelArtifact, Sweep, SweepState
from sweeper.store.artifact_files import delete_sweep_artifacts, store_for
from sweeper.store.tokens import check_name


def register_file(
    engine: Engine,
    path: str | Path,
    *,
    name: str,
    fmt: str | None = None,
    label_column: str | None = None,
    labels_path: str | Path | None = None,
    public: bool = False,
    options: Mapping[str, Any] | None = None,
    owner: str | None = None,
    privacy_unit: str | None = None,
) -> tuple[Binding, dict[str, Any]]:
    """Load and check a data file and bind ``name`` to the identity of its records.

    The file is parsed exactly as a sweep will load it (NaN and inf refused). A spec may then
    name it (``dataset: {name: NAME}``). Registering a name again re-reads its file: the same
    records keep their ledger; other records (an edited file) get their own, which starts with
    the old one's caps (:func:`bind_name`).

    ``owner``: whose the name is: the operator's (None; admins see it through the API) or a
    tenant's (``--owner NAME``: as if NAME had uploaded it, on NAME's ledger of the records).
    A name keeps its owner: registering it again as another's is refused (another ledger).

    ``public``: the owner declares these records public, so the name may be a spec's public
    evaluation dataset (``eval.dataset``); no epsilon covers them. Stored in the row's
    ``config``; registering again sets it to what is given then (default: not public).

    ``options``: the format's options (:mod:`workers.datasets.descriptors`), e.g. an
    ``image_folder``'s ``size`` and ``mode`` or a ``text_csv``'s ``text_column`` and public
    ``vocab`` / ``tokenizer`` file; checked, used to load the file, and stored in the row's
    ``config`` (``options``) as given, except that an ``image_folder`` stores the ``size`` and
    ``mode`` its loader would otherwise derive from the records, resolved now
    (:func:`workers.datasets.images.registered_options`).

    The class list is declared now too, from the file, and stored in the row's ``config``
    (``classes``; :func:`sweeper.datasets.files.load_declared`). Both are the owner's action
    on the owner's file and become the registered description: the input shape and the class
    count and encoding are shown and shape the model, so no later load (planning, workers,
    descriptions) may compute them from the records. Registering again recomputes them.

    ``privacy_unit``: the column saying whose each row is (e.g. ``patient_id``; issue 54):
    every ε on these records then protects a unit, all its rows, and their ledger counts
    units. Stored in the row's ``config``; every load reads the file so (the column is never
    a feature), and no spec may change it. The number of units is counted now (``n_units``;
    shown to analysts once declared). The records' ledger is bound to the unit (None:
    ``example``) before the row is written: records whose ledger counts another unit are
    refused and nothing is stored (:func:`bind_name`).

    Returns:
        The binding (``shared_with``: other names of the same records and owner, which share
        its cap and ledger) and what may be shown of the data (N, shape, classes).

    Raises:
        ConfigError / DatasetError: a bad name, owner, format, file, label setting or unit
            column.
        IllegalState: the name is registered as someone else's, or its records' ledger counts
            another privacy unit.
    """
    check_registered_name(name)
    if owner is not None:
        check_name(owner)
    file = Path(path).expanduser().resolve()
    fmt = format_of(file, fmt)
    given = _checked_options(fmt, label_column, labels_path, options)
    labels = str(Path(labels_path).expanduser().resolve()) if labels_path else None
    unit = checked_unit(privacy_unit)
    view = _kept_view(engine, name, owner, unit)
    if fmt == "image_folder":
        from workers.datasets.images import registered_options  # deferred: numpy

        given = registered_options(file, given)
    spec = worker_spec(
        {"options": given},
        path=str(file),
        name=fmt,
        label_column=label_column,
        labels_path=labels,
        privacy_unit=unit,
    )
    spec, info, identity = load_declared(spec, str(file))
    config = {
        "label_column": label_column,
        "labels_path": labels,
        **({"options": given} if given else {}),
        **info,
        "classes": list(spec.classes),
        "public": bool(public),
        **({"privacy_unit": unit} if unit else {}),
        **({"view": view} if view else {}),
    }
    fields = _row_fields(file, name, fmt, config)
    binding = bind_name(
        engine,
        name,
        identity,
        new_row={**fields, "owner": owner},
        row_update=fields,
        privacy_unit=unit,
        bind_unit=True,
    )
    return binding, {**info, "public": bool(public), "privacy_unit": unit}


def _row_fields(file: Path, name: str, fmt: str, config: dict[str, Any]) -> dict[str, Any]:
    """The ``datasets`` row of a registered file, all but its owner."""
    return {
        "label": name,
        "format": fmt,
        "size_bytes": _size_bytes(file),
        "sha256": None,
        "storage_path": str(file),
        "n_examples": config["n_examples"],
        "config": config,
    }


def _checked_options(
    fmt: str,
    label_column: str | None,
    labels_path: str | Path | None,
    options: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The format's options, checked against its descriptor, and the settings it needs.

    Raises:
        ConfigError: a missing label setting or a bad option.
    """
    # deferred: workers.datasets pulls numpy and every loader; sweeper.datasets stays light
    from workers.datasets.descriptors import get_dataset_descriptor

    descriptor = get_dataset_descriptor(fmt)
    noun = file_noun(fmt)
    if "label_column" in descriptor.needs and not label_column:
        raise ConfigError(
            f"{article(noun)} {noun} file needs --label-column (its label column's header)"
        )
    if "labels_path" in descriptor.needs and not labels_path:
        raise ConfigError(
            f"{article(noun)} {noun} images file needs --labels-path (the {noun} labels file)"
        )
    given = dict(options or {})
    descriptor.validate(given)
    return given


def whose(owner: str | None) -> str:
    """How messages name a dataset's owner (None: the operator, who registered it on the
    command line without ``--owner``)."""
    return "the operator's" if owner is None else f"{owner}'s"


def _kept_view(
    engine: Engine, name: str, owner: str | None, privacy_unit: str | None
) -> dict[str, Any]:
    """The owner's split and scaling settings of a name registered before, which outlive a
    re-registration (:mod:`sweeper.datasets.fixed_view`; the declared size and number of
    units are declared anew from the file; a number of another unit than ``privacy_unit``'s
    is withdrawn, so the new unit's count is public only once the owner declares it); empty
    for a new name.

    Raises:
        ConfigError: the name is one sweeps used without registering it.
        IllegalState: the name is someone else's.
    """
    with Session(engine) as session:
        existing = session.scalars(select(Dataset).where(Dataset.name == name)).first()
    if existing is None:
        return {}
    if not existing.storage_path:
        raise ConfigError(
            f"{name!r} is already the name of a dataset sweeps used without registering "
            "it; choose another name",
            field="name",
        )
    if existing.owner != owner:
        # Another owner is another ledger of the records: a re-registration must not move
        # a name (and its spending) there.
        raise IllegalState(
            f"{name!r} is {whose(existing.owner)} dataset; registering it again as "
            f"{whose(owner)} would move it to another ledger of its records: choose another name"
        )
    view = dict(dict(existing.config or {}).get("view") or {})
    view.pop("n_examples", None)
    view.pop("n_units", None)
    view.pop("privacy_unit", None)
    if dict(existing.config or {}).get("privacy_unit") != privacy_unit:
        view["declared"] = [f for f in view.get("declared") or () if f != "n_units"]
    return view


def _size_bytes(file: Path) -> int:
    """A file's size, or a folder's (an image folder): the sum of the files in it."""
    if not file.is_dir():
        return file.stat().st_size
    return sum(f.stat().st_size for f in file.rglob("*") if f.is_file())


def names_of(engine: Engine, content_sha256: str, *, owner: str | None = None) -> list[str]:
    """Every name of ``owner`` (None: the operator's names, built-ins, local use) bound to an
    identity, sorted: the names that share one ledger."""
    same_owner = Dataset.owner.is_(None) if owner is None else Dataset.owner == owner
    with Session(engine) as session:
        return list(
            session.scalars(
                select(Dataset.name)
                .where(Dataset.content_sha256 == content_sha256, same_owner)
                .order_by(Dataset.name)
            )
        )


def holding_sweeps(
    engine: Engine, name: str, content_sha256: str | None, *, owner: str | None = None
) -> list[str]:
    """Ids of unfinished sweeps on a name's records (under any name of its ledger), oldest
    first: each holds (or is about to hold) a reservation on them."""
    terms: list[Any] = [(Sweep.ledger_key.is_(None)) & (Sweep.dataset == name)]
    if content_sha256:
        terms.append(Sweep.ledger_key == scoped_identity_key(content_sha256, owner=owner))
    with Session(engine) as session:
        return list(
            session.scalars(
                select(Sweep.id)
                .where(or_(*terms), Sweep.state.in_([SweepState.pending, SweepState.running]))
                .order_by(Sweep.created_at)
            )
        )


@dataclass(frozen=True)
class NameDeletion:
    """What deleting a name did: the names that still read the same records, and how many
    kept models of the name's sweeps were deleted with it."""

    others: list[str]
    models_deleted: int


def delete_name(engine: Engine, name: str, *, store: Any = None) -> list[str]:
    """Delete a name and its sweeps' kept models (:func:`delete_name_and_models`).

    Returns:
        The names that still read the same records.
    """
    return delete_name_and_models(engine, name, store=store).others


def delete_name_and_models(engine: Engine, name: str, *, store: Any = None) -> NameDeletion:
    """Delete a name (its ``datasets`` row) and the trained models kept by the sweeps on it;
    never a ledger, never a data file.

    The identity's cap, spend and entries stay: the same records registered or uploaded again
    find them. Refused while any sweep holds a reservation on the records (under any name):
    its trials still need to resolve their data, and an operator who deletes a name in use
    most likely meant something else. The sweeps themselves (their results and privacy
    accounting) stay; their models go, rows first, then files
    (:func:`sweeper.store.artifact_files.delete_sweep_artifacts`).

    Args:
        engine: The store's engine.
        name: The name.
        store: The :class:`~sweeper.store.artifact_files.ArtifactStore` (default: the settings').

    Raises:
        DatasetNotFound: no such name.
        IllegalState: a sweep holds a reservation on the name's records.
    """

    with Session(engine) as session:
        row = session.scalars(select(Dataset).where(Dataset.name == name)).first()
    if row is None:
        raise DatasetNotFound(f"no dataset named {name!r}; `dpsweep datasets list` lists them")
    content = row.content_sha256
    holders = holding_sweeps(engine, name, content, owner=row.owner)
    key = scoped_identity_key(content, owner=row.owner) if content else name
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
    # The models first: a store that fails leaves the name, so the deletion can be retried.
    models = _delete_models(engine, name, store)
    with Session(engine) as session, session.begin():
        stored = session.scalars(select(Dataset).where(Dataset.name == name)).first()
        if stored is not None:
            session.delete(stored)
    others = [n for n in names_of(engine, content, owner=row.owner) if n != name] if content else []
    return NameDeletion(others=others, models_deleted=models)


def _delete_models(engine: Engine, name: str, store: Any) -> int:
    """Delete the kept models of the sweeps on ``name``; how many rows there were."""
    with Session(engine) as session:
        sweeps = list(session.scalars(select(Sweep.id).where(Sweep.dataset == name)))
        if not sweeps:
            return 0
        count = int(
            session.scalar(
                select(func.count())
                .select_from(ModelArtifact)
                .where(ModelArtifact.sweep_id.in_(sweeps))
            )
            or 0
        )
    store = store or store_for(engine, SweeperSettings())
    for sweep_id in sweeps:
        delete_sweep_artifacts(engine, sweep_id, store=store)
    return count
