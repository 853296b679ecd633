"""A stored dataset's privacy unit (issue 54): its owner's declaration, and how it is shown.

A dataset's **privacy unit** is the column (CSV, text CSV) or array (NPZ) that says whose
each row is, e.g. ``patient_id``: every ε spent on the dataset then protects a whole unit
(all of a patient's rows), and its records' ledger counts units. Without one, each row is its
own unit (``example``).

* **The owner declares it**, at upload (``privacy_unit`` form field) or registration
  (``dpsweep datasets register FILE --name N --privacy-unit COLUMN``); it is stored in the
  row's ``config["privacy_unit"]`` and given to every load of the file
  (:func:`sweeper.datasets.files.file_spec`). A spec may leave it out or repeat it, nothing
  else (:func:`sweeper.datasets.fixed_view.check_privacy_unit`), so nobody's sweep changes
  what the ledger counts.
* **One ledger, one unit.** The records' ledger is bound to the unit before the row is
  written (:func:`sweeper.datasets.identity.bind_name`): the same records registered with
  another unit than their ledger's are refused (409) and nothing is stored.
* **The number of units is a declared fact**, like the number of records: counted once at
  upload or registration, shown to the owner, and to analysts only once the owner declares
  it (``view.n_units``, or ``declare_counted``); an analyst's grant or sweep waits for it
  (:func:`sweeper.datasets.fixed_view.require_declared`). How many rows a unit has is never
  counted nor shown, to anyone: it is private.
* **The owner may change it later** (:func:`change_privacy_unit`, ``PUT .../policy`` with
  ``privacy_unit``) only while the records' ledger has nothing spent or reserved: ε spent per
  row does not protect a person, nor the other way round.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, IllegalState
from sweeper.datasets.files import file_spec, load_file
from sweeper.datasets.fixed_view import DatasetView
from sweeper.datasets.grants import owned_row
from sweeper.datasets.identity import bind_name
from sweeper.datasets.viewer import Viewer
from sweeper.privacy.ledger.amounts import ZERO, show_amount
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.keys import scoped_identity_key
from sweeper.privacy.ledger.units import EXAMPLE_UNIT
from sweeper.store import Dataset

#: The longest unit column name (as :class:`dpsweep.spec.DatasetConfig` takes it).
UNIT_MAX_LENGTH = 200


def checked_unit(privacy_unit: str | None, field: str = "privacy_unit") -> str | None:
    """An owner's unit column as given (None or blank: none, each row its own unit).

    Raises:
        ConfigError: a name that is not text or is over-long (field ``field``).
    """
    if privacy_unit is None:
        return None
    if not isinstance(privacy_unit, str) or len(privacy_unit) > UNIT_MAX_LENGTH:
        raise ConfigError(
            f"{field} names the unit column (e.g. patient_id): text of at most "
            f"{UNIT_MAX_LENGTH} characters",
            field=field,
        )
    return privacy_unit if privacy_unit.strip() else None


def unit_fields(view: DatasetView) -> dict[str, Any]:
    """What a description shows of a dataset's unit: its name (``example`` without one) and
    the number of units as ``view`` holds it (an analyst's :meth:`DatasetView.public` view
    holds it only when declared). Never rows per unit."""
    return {
        "privacy_unit": view.privacy_unit or EXAMPLE_UNIT,
        "n_units": view.n_units if view.privacy_unit else None,
    }


def change_privacy_unit(engine: Engine, name: str, viewer: Viewer, privacy_unit: Any) -> None:
    """Set (or, with None, remove) a stored dataset's privacy unit: its owner only.

    The file is read again with the new unit (the column must be there; the old unit column,
    if any, becomes a feature again), its number of units counted and its row re-bound to
    the records so read (:func:`~sweeper.datasets.identity.bind_name`, whose ledger is bound
    to the new unit). The number of units is withdrawn from the declared facts (a new count
    is public only once the owner declares it), and so is a declared feature shape the new
    reading changed.

    Raises:
        DatasetNotFound / PermissionDenied: not the viewer's dataset.
        ConfigError: not a stored file, or a bad unit name (field ``privacy_unit``).
        DatasetError: the file has no such column.
        IllegalState: the records' ledger has ε or δ spent or reserved (at the old level), or
            the records read with the new unit have a ledger bound to another unit.
    """
    unit = checked_unit(privacy_unit)
    with Session(engine) as session:
        row = owned_row(session, name, viewer)
        session.expunge(row)
    if not row.storage_path or not row.format:
        raise ConfigError(
            f"dataset {name!r} is not a stored file; only uploads and registered names have "
            "a privacy unit of their owner's",
            field="privacy_unit",
        )
    cfg = dict(row.config or {})
    if cfg.get("privacy_unit") == unit:
        return
    _check_unspent(engine, row, unit)
    info, identity = load_file(replace(file_spec(row), privacy_unit=unit), row.label or name)
    fields = {"n_examples": info["n_examples"], "config": _unit_config(cfg, info, unit)}
    bind_name(engine, name, identity, row_update=fields, privacy_unit=unit, bind_unit=True)


def _check_unspent(engine: Engine, row: Dataset, unit: str | None) -> None:
    """Refuse a unit change on records whose ledger has anything committed.

    Raises:
        IllegalState: ε or δ spent or reserved on the records (409), saying why and what to do.
    """
    if not row.content_sha256:
        return
    s = BudgetLedger(engine).summary(scoped_identity_key(row.content_sha256, owner=row.owner))
    committed = (s.epsilon_spent, s.delta_spent, s.epsilon_reserved, s.delta_reserved)
    if all(v == ZERO for v in committed):
        return
    old = dict(row.config or {}).get("privacy_unit")
    level = "per row (no privacy unit)" if old is None else f"per {old!r}"
    asked = "no privacy unit" if unit is None else f"privacy unit {unit!r}"
    raise IllegalState(
        f"the privacy unit of dataset {row.name!r} was not changed: its records have ε "
        f"{show_amount(s.epsilon_spent)} spent and {show_amount(s.epsilon_reserved)} reserved "
        f"{level}, and ε spent at one level does not protect the other, so one ledger keeps "
        f"one unit. It stays as it is; for {asked}, upload or register the data as a new "
        "dataset whose records have not been spent on"
    )


def _unit_config(cfg: dict[str, Any], info: dict[str, Any], unit: str | None) -> dict[str, Any]:
    """The row's config once the file is read with ``unit``: the new counts (``info``), the
    unit, and the view with the facts the change made stale withdrawn."""
    old_shape = cfg.get("input_shape")
    out = {k: v for k, v in cfg.items() if k not in ("privacy_unit", "n_units")}
    # The loader's counts of the new reading, but never its class list: that is declared.
    out.update({k: v for k, v in info.items() if k not in ("classes", "num_classes")})
    if unit is None:
        out.pop("privacy_unit", None)
        out.pop("n_units", None)
    else:
        out["privacy_unit"] = unit
    view = dict(cfg.get("view") or {})
    view.pop("n_units", None)
    view.pop("privacy_unit", None)
    stale = {"n_units"}
    if list(info.get("input_shape") or ()) != list(old_shape or ()):
        # The old unit column is a feature again, or the new one no longer is.
        view.pop("input_shape", None)
        stale.add("input_shape")
    view["declared"] = [f for f in view.get("declared") or () if f not in stale]
    out["view"] = view
    return out
