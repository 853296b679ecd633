"""Data owners and analysts: grants with ε allowances, and what binds an analyst's sweep.

A dataset's **owner** is the tenant that uploaded it (``Dataset.owner``; an admin acts as the
owner of registered names). The owner grants an **analyst** (another tenant) access with an ε
allowance (:func:`grant`); the analyst may then submit sweeps on the dataset and receives
only their DP outputs. Everything an analyst's sweeps hold on the records (what they reserved
less what they released unused) must fit the allowance: the ledger checks it under the same
lock as the lifetime cap (:meth:`sweeper.privacy.ledger.BudgetLedger.reserve`), so concurrent
submissions cannot pass it together, and the lifetime cap still bounds everyone together.

Revoking a grant (:func:`revoke`) stops new reservations and new trials; running trials finish
and stay charged (the driver checks before each charge: :func:`sweep_may_continue`). Grants
are never deleted: a new allowance is a new grant that replaces the old one.

The owner also chooses which evaluation modes analysts may use (:func:`set_policy`): an
unprotected carve-out releases raw metrics on private records, so by default analysts may use
only a public evaluation dataset or DP evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, DatasetNotFound, NotFound, PermissionDenied
from dpsweep.spec import EVAL_MODES

# dataset_row is re-exported: callers above this layer read the catalog row through here.
from sweeper.datasets.catalog import dataset_row as dataset_row
from sweeper.datasets.fixed_view import (
    checked_view,
    declare_counted,
    require_declared,
    view_of,
)
from sweeper.datasets.identity import view_key
from sweeper.datasets.viewer import Viewer
from sweeper.privacy.ledger.amounts import epsilon_amount
from sweeper.privacy.ledger.reservations import principal_usage
from sweeper.store import ApiToken, Dataset, DatasetGrant, iso

#: What analysts may use unless the owner says otherwise: never the unprotected carve-out.
DEFAULT_ANALYST_EVAL_MODES: tuple[str, ...] = ("public", "dp")


@dataclass(frozen=True)
class AnalystTerms:
    """What binds an analyst's sweep on a dataset: the grant, its allowance, the eval modes."""

    grant_id: str
    dataset: str
    analyst: str
    epsilon_allowance: Decimal
    eval_modes: tuple[str, ...]


def _now() -> datetime:
    return datetime.now(UTC)


def owns(viewer: Viewer, row: Dataset | None) -> bool:
    """Whether ``viewer`` owns the dataset of ``row``: its uploader, an admin, or local use."""
    if row is None:
        return False
    return (
        viewer.admin
        or viewer.owner is None
        or (row.owner is not None and row.owner == viewer.owner)
    )


def _owned_row(session: Session, name: str, viewer: Viewer) -> Dataset:
    """The dataset's row if ``viewer`` owns it.

    Raises:
        DatasetNotFound: no such dataset, or one the viewer has no part in.
        PermissionDenied: the viewer is an analyst of it (they may see it, not manage it).
    """
    row = dataset_row(session, name)
    if row is not None and owns(viewer, row):
        return row
    if row is not None and viewer.owner is not None and _active(session, name, viewer.owner):
        raise PermissionDenied(
            f"only the owner of dataset {name!r} manages its grants and policy; you are an "
            "analyst of it"
        )
    raise DatasetNotFound(f"no dataset {name!r}; GET /api/v1/datasets lists yours")


#: The dataset's row if the viewer owns it (:func:`_owned_row`), for the modules that change
#: what its owner alone sets (:mod:`sweeper.datasets.privacy_units`).
owned_row = _owned_row


def _active(session: Session, name: str, analyst: str) -> DatasetGrant | None:
    return session.scalars(
        select(DatasetGrant)
        .where(
            DatasetGrant.dataset == name,
            DatasetGrant.analyst == analyst,
            DatasetGrant.revoked_at.is_(None),
        )
        .order_by(DatasetGrant.created_at.desc())
    ).first()


def grant(
    engine: Engine,
    name: str,
    analyst: str,
    *,
    epsilon_allowance: float | Decimal | str,
    viewer: Viewer,
    note: str = "",
    confirm: bool = False,
) -> dict[str, Any]:
    """Grant ``analyst`` access to dataset ``name`` with an ε allowance (owner or admin).

    A grant that already exists for the analyst is replaced (revoked, and the new one
    recorded): its spending carries over, since the allowance counts what the analyst's sweeps
    hold on the records, whatever grant they reserved under.

    An analyst is a token's name. A name that no API token has (revoked ones count) is
    refused unless ``confirm``: a typo would otherwise grant no one at once, and whoever later
    gets a token of that name the allowance.

    Raises:
        DatasetNotFound / PermissionDenied: as :func:`_owned_row`.
        ConfigError: an invalid analyst name or allowance, or a name no token has (field
            ``analyst``, saying how to go on).
    """
    analyst = analyst.strip()
    if not analyst or len(analyst) > 200:
        raise ConfigError("analyst must be a tenant name (1-200 characters)", field="analyst")
    allowance = epsilon_amount(epsilon_allowance, "epsilon_allowance")
    with Session(engine) as session, session.begin():
        row = _owned_row(session, name, viewer)
        if row.owner is not None and analyst == row.owner:
            raise ConfigError(
                f"{analyst!r} owns dataset {name!r}; grants are for analysts (other tenants)",
                field="analyst",
            )
        # Checked only for the dataset's owner (above): no one else learns which names exist.
        if not confirm:
            _check_tenant(session, analyst)
        # An analyst sees and plans with declared facts only: none declared, no analysts.
        require_declared(row)
        now = _now()
        old = _active(session, name, analyst)
        if old is not None:
            old.revoked_at = now
            old.revoked_by = viewer.owner
        g = DatasetGrant(
            dataset=name,
            analyst=analyst,
            epsilon_allowance=allowance,
            granted_by=viewer.owner,
            note=note[:2000],
            created_at=now,
        )
        session.add(g)
        session.flush()
        return grant_view(g)


def _check_tenant(session: Session, analyst: str) -> None:
    """Refuse a grant to a name that no API token has (revoked tokens count: their name is
    a tenant's).

    Raises:
        ConfigError: on field ``analyst``, saying how to go on.
    """
    if session.scalar(select(ApiToken.id).where(ApiToken.name == analyst).limit(1)):
        return
    create = f"`dpsweep token create --name {analyst}`"
    confirm = '"confirm": true in the request, confirm=True in the SDK, --confirm on the CLI'
    if session.scalar(select(ApiToken.id).limit(1)) is None:
        # Local use, or a server before its first token: say that no tenant exists yet.
        raise ConfigError(
            f"no API token exists yet, so {analyst!r} names no tenant: create the analyst's "
            f"token first ({create}), or confirm that {analyst!r} is the name their token "
            f"will have ({confirm})",
            field="analyst",
        )
    raise ConfigError(
        f"no API token has the name {analyst!r} (a typo?): create the analyst's token first "
        f"({create}), or confirm that {analyst!r} is the name their token will have "
        f"({confirm})",
        field="analyst",
    )


def revoke(engine: Engine, name: str, analyst: str, *, viewer: Viewer) -> dict[str, Any]:
    """Revoke ``analyst``'s grant on ``name``: no new reservation or trial from now on;
    running trials finish and stay charged; what was charged stays charged.

    Raises:
        DatasetNotFound / PermissionDenied: as :func:`_owned_row`.
        NotFound: the analyst holds no active grant on the dataset.
    """
    with Session(engine) as session, session.begin():
        _owned_row(session, name, viewer)
        g = _active(session, name, analyst)
        if g is None:
            raise NotFound(f"{analyst!r} holds no active grant on dataset {name!r}")
        g.revoked_at = _now()
        g.revoked_by = viewer.owner
        session.flush()
        return grant_view(g)


def grant_view(g: DatasetGrant) -> dict[str, Any]:
    """A grant as the API shows it."""
    return {
        "id": g.id,
        "dataset": g.dataset,
        "analyst": g.analyst,
        "epsilon_allowance": float(g.epsilon_allowance),
        "granted_by": g.granted_by,
        "note": g.note,
        "created_at": iso(g.created_at),
        "revoked_at": iso(g.revoked_at),
        "active": g.revoked_at is None,
    }


def list_grants(engine: Engine, name: str, viewer: Viewer) -> list[dict[str, Any]]:
    """Every grant of ``name`` with each analyst's spending (the owner), or the viewer's own
    (an analyst), newest first.

    Raises:
        DatasetNotFound: no such dataset, or the viewer has no part in it.
    """
    with Session(engine) as session:
        row = dataset_row(session, name)
        stmt = select(DatasetGrant).where(DatasetGrant.dataset == name)
        if row is None or not owns(viewer, row):
            if row is None or viewer.owner is None:
                raise DatasetNotFound(f"no dataset {name!r}; GET /api/v1/datasets lists yours")
            stmt = stmt.where(DatasetGrant.analyst == viewer.owner)
        grants = list(session.scalars(stmt.order_by(DatasetGrant.created_at.desc())))
        if not grants and not owns(viewer, row):
            raise DatasetNotFound(f"no dataset {name!r}; GET /api/v1/datasets lists yours")
    key = view_key(engine, name)
    out = []
    for g in grants:
        v = grant_view(g)
        v["epsilon_used"] = float(usage(engine, key, g.analyst))
        out.append(v)
    return out


def usage(engine: Engine, ledger_key: str, analyst: str) -> Decimal:
    """ε the analyst's sweeps hold on the records of ``ledger_key`` (reserved less released)."""
    with Session(engine) as session:
        return principal_usage(session, ledger_key, analyst)


def analyst_terms(engine: Engine, name: str, tenant: str | None) -> AnalystTerms | None:
    """What binds ``tenant``'s sweeps on dataset ``name``, if they are its analyst (an active
    grant on someone else's dataset); None for the owner, local use, built-in and registered
    names without a grant."""
    if tenant is None:
        return None
    with Session(engine) as session:
        row = dataset_row(session, name)
        if row is None or row.owner == tenant:
            return None
        g = _active(session, name, tenant)
        if g is None:
            return None
        modes = tuple(analyst_modes(row))
        return AnalystTerms(g.id, name, tenant, Decimal(g.epsilon_allowance), modes)


def has_active_grant(engine: Engine, name: str, tenant: str) -> bool:
    """Whether ``tenant`` holds an active grant on dataset ``name``."""
    with Session(engine) as session:
        return _active(session, name, tenant) is not None


def sweep_may_continue(engine: Engine, *, dataset: str, owner: str | None) -> bool:
    """Whether a sweep of ``owner`` on ``dataset`` may start new trials: always for the
    dataset's owner (and local use); for an analyst, only while their grant is active."""
    if owner is None:
        return True
    with Session(engine) as session:
        row = dataset_row(session, dataset)
        if row is None or row.owner is None or row.owner == owner:
            return True
        return _active(session, dataset, owner) is not None


def sees_sweep(session: Session, viewer: Viewer, *, owner: str | None, dataset: str) -> bool:
    """Whether ``viewer`` sees a sweep of ``owner`` on ``dataset``: its owner (an analyst sees
    their own sweeps only), an admin, local use, or the dataset's owner (who sees every sweep
    on their data)."""
    if viewer.sees(owner):
        return True
    if viewer.owner is None:
        return False
    row = dataset_row(session, dataset)
    return row is not None and row.owner is not None and row.owner == viewer.owner


def owned_dataset_names(viewer: Viewer) -> Any:
    """A subquery of the names of the datasets ``viewer`` uploaded (for sweep listings)."""
    return select(Dataset.name).where(Dataset.owner == viewer.owner).scalar_subquery()


def check_eval_mode(terms: AnalystTerms, mode: str) -> None:
    """Refuse an evaluation mode the data owner does not let analysts use.

    Raises:
        ConfigError: field ``eval.mode``.
    """
    if mode not in terms.eval_modes:
        allowed = ", ".join(terms.eval_modes) or "none"
        why = (
            " (a carve-out releases raw metrics on private records)" if mode == "carve-out" else ""
        )
        raise ConfigError(
            f"the owner of dataset {terms.dataset!r} lets analysts evaluate with: {allowed}; "
            f"not {mode!r}{why}. Set eval.mode to one of those (eval: {{mode: dp}} needs no "
            "other data)",
            field="eval.mode",
        )


def set_policy(
    engine: Engine,
    name: str,
    viewer: Viewer,
    *,
    analyst_eval_modes: list[str] | None = None,
    public_info: dict[str, Any] | None = None,
    view: dict[str, Any] | None = None,
    declare_counted_facts: bool = False,
) -> dict[str, Any]:
    """Set what analysts may use and see of a dataset (owner or admin).

    Args:
        analyst_eval_modes: The evaluation modes analysts may use (``public``, ``dp``,
            ``carve-out``); None leaves them as they are.
        public_info: What the owner declares public: ``label_names`` (a list of strings) and
            ``description`` (text). Never computed from the records.
        view: Settings of the dataset's view to change (``test_fraction``, ``split_seed``,
            ``input_bounds``, ``feature_clip``: :mod:`sweeper.datasets.fixed_view`); the
            others stay. Every later sweep on the dataset reads it this way. ``n_examples``,
            ``classes`` and ``input_shape`` given declare those facts public (None withdraws
            the declaration).
        declare_counted_facts: Declare the counted number of records, class list and
            feature shape public as they are (after ``view``).

    Raises:
        DatasetNotFound / PermissionDenied: as :func:`_owned_row`.
        ConfigError: an unknown mode, a malformed description, or a view setting out of
            range, or a view on a dataset that is not a stored file.
    """
    with Session(engine) as session, session.begin():
        row = _owned_row(session, name, viewer)
        if view or declare_counted_facts:
            if not row.storage_path:
                raise ConfigError(
                    f"dataset {name!r} is not a stored file; only uploads and registered "
                    "names have a view",
                    field="view",
                )
            config = _with_view(row, view or {})
            if declare_counted_facts:
                config = declare_counted(config, row.n_examples)
            # A new dict: SQLAlchemy's JSON column notices a replaced value, not a mutation.
            row.config = config
        if analyst_eval_modes is not None:
            bad = [m for m in analyst_eval_modes if m not in EVAL_MODES]
            if bad:
                raise ConfigError(
                    f"unknown evaluation mode(s) {bad}; allowed: {sorted(EVAL_MODES)}",
                    field="analyst_eval_modes",
                )
            row.analyst_eval_modes = sorted(set(analyst_eval_modes))
        if public_info is not None:
            row.public_info = _checked_info(public_info)
        return policy_view(row)


def _with_view(row: Dataset, view: dict[str, Any]) -> dict[str, Any]:
    """``row``'s config with the view changes applied (checked).

    Raises:
        ConfigError: a setting out of range, or a declared feature shape that is not the
            records' (the model is built from the records' shape: the owner learns it here).
    """
    new_view = checked_view(view_of(row), view)
    counted = dict(row.config or {}).get("input_shape")
    if (
        view.get("input_shape") is not None
        and counted is not None
        and list(new_view.input_shape or ()) != [int(v) for v in counted]
    ):
        raise ConfigError(
            f"view.input_shape {list(view['input_shape'])} is not the shape of the records' "
            f"features, {list(counted)}; declare that shape",
            field="view.input_shape",
        )
    stored = new_view.to_json()
    # The unit is the row's config["privacy_unit"] (sweeper.datasets.privacy_units), not the view's.
    stored.pop("privacy_unit", None)
    classes = stored.pop("classes")
    config = {**dict(row.config or {}), "view": stored}
    if classes is not None:
        # Where every load reads the class list (sweeper.datasets.files.file_spec).
        config["classes"] = classes
        config["num_classes"] = len(classes)
    return config


def analyst_modes(row: Dataset) -> tuple[str, ...]:
    """The evaluation modes analysts may use on ``row``'s dataset (an empty list: none)."""
    modes = row.analyst_eval_modes
    return DEFAULT_ANALYST_EVAL_MODES if modes is None else tuple(modes)


def policy_view(row: Dataset, *, analyst: bool = False) -> dict[str, Any]:
    """A dataset's analyst policy as the API shows it: to an analyst, the view's declared
    facts only (an undeclared one is null, never the count)."""
    view = view_of(row)
    return {
        "dataset": row.name,
        "analyst_eval_modes": list(analyst_modes(row)),
        "public_info": dict(row.public_info or {}),
        "view": (view.public() if analyst else view).to_json() if row.storage_path else None,
    }


def _checked_info(info: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    labels = info.get("label_names")
    if labels is not None:
        if not isinstance(labels, list) or not all(
            isinstance(x, str) and 0 < len(x) <= 200 for x in labels
        ):
            raise ConfigError(
                "public_info.label_names must be a list of names (strings of 1-200 characters)",
                field="public_info.label_names",
            )
        out["label_names"] = labels[:10000]
    description = info.get("description")
    if description is not None:
        if not isinstance(description, str) or len(description) > 10000:
            raise ConfigError(
                "public_info.description must be text of at most 10000 characters",
                field="public_info.description",
            )
        out["description"] = description
    unknown = set(info) - {"label_names", "description"}
    if unknown:
        raise ConfigError(
            f"unknown public_info key(s) {sorted(unknown)}; allowed: label_names, description",
            field=f"public_info.{sorted(unknown)[0]}",
        )
    return out
