"""Identity: every dataset name bound to the content of the records it reads.

Every name is bound (``datasets.content_sha256``) to the identity of the records it reads
(:func:`workers.datasets.content_sha256`), and the budget ledger is keyed by that identity and
the name's owner (:func:`~sweeper.privacy.ledger.keys.scoped_identity_key`), not by the name:
the same records uploaded twice by one tenant, registered under two names, converted from CSV
to NPZ or shuffled share one lifetime cap and one ledger. The same records uploaded by another
tenant get a ledger of that tenant's own: one tenant's upload never opens, reads or caps
another's ledger, and nothing in any answer says whether two tenants' records are equal.
Deleting or re-registering a name touches no ledger. A name first bound after ledgers were keyed by
name carries its old ledger row over (:func:`bind_name`). The identity is shown to the
operator (the CLI) only: it is a deterministic function of every record, so someone who knows
all records but one could test guesses of the last against it; the API and every message
name the dataset by its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from sqlalchemy import Engine, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, DatasetNotFound, IllegalState
from sweeper.datasets.files import builtin_description, file_spec, worker_spec
from sweeper.datasets.names import BUILTIN
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.keys import scoped_identity_key
from sweeper.privacy.ledger.records import CarriedOver
from sweeper.privacy.ledger.units import EXAMPLE_UNIT, bind_privacy_unit, ledger_unit, unit_label
from sweeper.store import Dataset, Sweep
from sweeper.store.engine import writable


@dataclass(frozen=True)
class Binding:
    """A name bound to the identity of its records (see :func:`bind_name`)."""

    name: str
    content_sha256: str
    owner: str | None
    """The name's owner (None: built-ins, the operator's names, local use): the ledger's scope."""
    previous_sha256: str | None
    """The identity the name was bound to before, when it was another (the file changed)."""
    carried: CarriedOver | None
    """The name's ledger row from before ledgers were keyed by content, now the identity's."""
    inherited_caps: bool
    """The new identity had no ledger and took the caps of the name's previous identity."""
    shared_with: tuple[str, ...]
    """Other names of the same owner bound to the same identity (they share its cap and
    ledger). Never another owner's: that would say whose records equal whose."""
    privacy_unit: str | None = None
    """The unit the ledger was bound to by this binding (``example``, or a unit column's
    name); None when the binding named none (built-ins, names stored by sweeps)."""

    @property
    def ledger_key(self) -> str:
        return scoped_identity_key(self.content_sha256, owner=self.owner)


def bind_name(
    engine: Engine,
    name: str,
    content_sha256: str,
    *,
    new_row: dict[str, Any] | None = None,
    row_update: dict[str, Any] | None = None,
    privacy_unit: str | None = None,
    bind_unit: bool = False,
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
        privacy_unit: With ``bind_unit``: the records' unit column (None: each row is its
            own unit, ``example``).
        bind_unit: Bind the identity's ledger to ``privacy_unit``
            (:func:`~sweeper.privacy.ledger.units.bind_privacy_unit`) before the row is
            written (an upload's, a registration's): a ledger bound to another unit refuses
            the binding and nothing is stored.

    Returns:
        The binding.

    Raises:
        IllegalState: with ``bind_unit``, the records' ledger counts another unit.
    """
    engine = writable(engine)
    ledger = BudgetLedger(engine)
    with Session(engine) as session:
        found = session.execute(
            select(Dataset.content_sha256, Dataset.owner).where(Dataset.name == name)
        ).first()
    previous, owner = (found[0], found[1]) if found is not None else (None, None)
    if found is None:
        owner = (new_row or {}).get("owner")
    key = scoped_identity_key(content_sha256, owner=owner)
    if bind_unit:
        # Before anything is written: a refused unit leaves the ledger and the row as they were.
        _check_unit(engine, key, name, privacy_unit)
    inherited = False
    if previous and previous != content_sha256:
        old_key = scoped_identity_key(previous, owner=owner)
        inherited = ledger.inherit_caps(old_key, key) is not None
    # After the caps are inherited (binding creates the ledger's row, and a row that exists
    # inherits nothing), before the row is written: under the ledger's lock, so two units
    # racing for one unbound ledger cannot both bind.
    unit = bind_privacy_unit(engine, key, privacy_unit) if bind_unit else None

    bind = partial(
        _bind_row,
        name=name,
        content_sha256=content_sha256,
        key=key,
        new_row=new_row,
        row_update=row_update,
    )
    note = f" [carried over from the ledger of name {name!r}]"
    try:
        carried = ledger.carry_over(name, key, note=note, within=bind)
    except IntegrityError:
        # Another process added the same name at the same moment (PostgreSQL): once more,
        # now updating its row.
        carried = ledger.carry_over(name, key, note=note, within=bind)
    with Session(engine) as session:
        same_owner = Dataset.owner.is_(None) if owner is None else Dataset.owner == owner
        shared = session.scalars(
            select(Dataset.name)
            .where(Dataset.content_sha256 == content_sha256, Dataset.name != name, same_owner)
            .order_by(Dataset.name)
        ).all()
    return Binding(
        name=name,
        content_sha256=content_sha256,
        owner=owner,
        previous_sha256=previous if previous and previous != content_sha256 else None,
        carried=carried,
        inherited_caps=inherited,
        shared_with=tuple(shared),
        privacy_unit=unit,
    )


def _level(unit: str) -> str:
    return "per row (no privacy unit)" if unit == EXAMPLE_UNIT else f"per {unit!r}"


def _check_unit(engine: Engine, key: str, name: str, privacy_unit: str | None) -> None:
    """Refuse to bind ``name`` to records whose ledger counts another unit (read only).

    Raises:
        IllegalState: naming the ledger's unit and how to register the records at it.
    """
    bound, asked = ledger_unit(engine, key), unit_label(privacy_unit)
    if bound is None or bound == asked:
        return
    again = "without a privacy unit" if bound == EXAMPLE_UNIT else f"with privacy unit {bound!r}"
    raise IllegalState(
        f"{name!r} was not stored: these records' ledger is budgeted {_level(bound)}, and this "
        f"asks for {_level(asked)}. One ledger has one privacy unit, so the same people's "
        f"budget is never spent at two levels: register or upload the records {again}. "
        "Nothing stored before changed"
    )


def _bind_row(
    session: Session,
    *,
    name: str,
    content_sha256: str,
    key: str,
    new_row: dict[str, Any] | None,
    row_update: dict[str, Any] | None,
) -> None:
    """Within the ledger's carry-over transaction (``session``): the sweeps stored under
    ``name`` re-pointed at the ledger ``key``, and ``name``'s row added or bound to
    ``content_sha256`` (:func:`bind_name`)."""
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


_BUILTIN_IDENTITY: dict[str, str] = {}


def _spec_of_name(name: str, row: Dataset | None) -> Any:
    """The worker spec of what a stored name reads.

    Raises:
        DatasetNotFound: a name that reads nothing known.
    """
    if row is not None and row.storage_path and row.format:
        return file_spec(row)
    cfg = dict(row.config or {}) if row is not None else {}
    if cfg.get("name"):  # a name stored by a sweep: its spec's dataset
        return worker_spec(
            cfg, path=cfg.get("path"), name=str(cfg["name"]), label_column=cfg.get("label_column")
        )
    if name in BUILTIN:
        return worker_spec({}, path=None, name=name, label_column=None)
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
        # deferred: workers.datasets pulls numpy and every loader
        from workers.datasets.loading import dataset_content_sha256

        sha = dataset_content_sha256(spec)
        if builtin:
            _BUILTIN_IDENTITY[name] = sha  # bundled with scikit-learn: the same all process long
    new_row = {"config": {"name": name}, "n_examples": builtin_description(name)["n_examples"]}
    bind_name(engine, name, sha, new_row=new_row if builtin else None)
    return sha


def ledger_key_of(engine: Engine, name: str) -> str:
    """The ledger key of the records a name reads, in its owner's scope (``sha256:<hex>``,
    or ``sha256:<hex>/<owner>`` for a tenant's upload; see :func:`content_identity` and
    :func:`~sweeper.privacy.ledger.keys.scoped_identity_key`)."""
    content = content_identity(engine, name)
    return scoped_identity_key(content, owner=owner_of(engine, name))


def owner_of(engine: Engine, name: str) -> str | None:
    """The owner of a stored name (None: built-ins, the operator's names, local use)."""
    with Session(engine) as session:
        return session.scalars(select(Dataset.owner).where(Dataset.name == name)).first()


def view_key(engine: Engine, name: str) -> str:
    """The ledger key to *show* for a name: its identity's, or, for a name stored before
    identities whose file can no longer be loaded, the name itself (its old ledger)."""
    try:
        return ledger_key_of(engine, name)
    except (ConfigError, OSError):  # DatasetError included: a file gone or now invalid
        return name
