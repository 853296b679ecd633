"""Reserving a sweep's cost: what a submission checks on the ledger, and the reservation.

Split from :mod:`sweeper.sweeps.create` (which plans and stores the sweep): the read-only
checks a dry run shares with a submission (:func:`check_before_reserving`), the ledger's
privacy unit checked before anything is written (:func:`check_ledger_unit`), and the
reservation itself (:func:`reserve_sweep`), which carries the plan's unit so that a
dataset's ledger is never charged at another level than the one it is bound to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine

from dpsweep.errors import IllegalState, PermissionDenied
from dpsweep.plan import EXAMPLE_UNIT
from dpsweep.spec import SweepSpec
from sweeper.datasets.fixed_view import stored_row
from sweeper.datasets.grants import has_active_grant, usage
from sweeper.datasets.identity import ledger_key_of
from sweeper.privacy.charges import ChargeSchedule, exact_sum
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.cap_check import check_allowance, check_caps
from sweeper.privacy.ledger.errors import AllowanceExhausted, BudgetExhausted
from sweeper.privacy.ledger.units import ledger_unit
from sweeper.store import Sweep
from sweeper.sweeps.quota import check_quota, configured_quota_bytes

__all__ = ["check_before_reserving", "check_ledger_unit", "reserve_sweep"]


def _level(unit: str) -> str:
    return "per row (example level)" if unit == EXAMPLE_UNIT else f"per {unit!r}"


def check_ledger_unit(engine: Engine, key: str, privacy_unit: str, *, dataset: str) -> None:
    """Refuse, read-only and before anything is reserved, a plan at another privacy unit
    than the one the dataset's ledger is bound to (an unbound ledger takes the plan's at
    reservation). The reservation checks it again under the ledger's lock.

    Args:
        engine: The store.
        key: The dataset's ledger key.
        privacy_unit: The plan's unit (``example`` or the unit's name).
        dataset: The dataset's name as the user gave it (the ledger key is never shown).

    Raises:
        IllegalState: the ledger is bound to another unit (HTTP 409).
    """
    bound = ledger_unit(engine, key)
    if bound is None or bound == privacy_unit:
        return
    raise IllegalState(
        f"dataset {dataset!r} is budgeted {_level(bound)}; this sweep is planned "
        f"{_level(privacy_unit)}. One ledger has one privacy unit, so the same people's "
        "budget is never spent at two levels: plan it at the ledger's unit (its owner's "
        "declaration, dataset.privacy_unit), nothing was reserved"
    )


def check_before_reserving(
    engine: Engine,
    spec: SweepSpec,
    prepared: Any,
    admission: Any,
    *,
    owner: str | None,
    artifact_quota_mb: float | None = None,
) -> None:
    """What a submission refuses after planning, checked read-only for a dry run.

    The tenant's quota of kept models, the ledger's privacy unit against the plan's
    (:func:`check_ledger_unit`), and whether the sweep's cost fits an analyst's allowance
    (their own use) and what remains of the records' lifetime cap (an analyst is told only
    that it does not fit, as at submission: the figures would say what others spent). A
    submission checks the same again, atomically, when it reserves.

    Args:
        engine: The store.
        spec: The admitted spec.
        prepared: Its :class:`sweeper.sweeps.create.PreparedSweep` (plan and schedules).
        admission: Its admission (an analyst's ``terms``).
        owner: Who submits it.
        artifact_quota_mb: The tenant's quota of kept models (default: the settings').

    Raises:
        QuotaExceeded, AllowanceExhausted, BudgetExhausted: as
            :func:`sweeper.sweeps.create.create_sweep` would.
        IllegalState: the ledger is bound to another privacy unit.
    """
    check_quota(
        engine,
        owner,
        spec,
        configured_quota_bytes(artifact_quota_mb),
        model_bytes=prepared.model_bytes,
    )

    if stored_row(engine, spec.dataset.name) is None:
        return  # loader names and paths: bound, and capped, when the sweep is created

    name = spec.dataset.name
    key = ledger_key_of(engine, name)
    check_ledger_unit(engine, key, prepared.plan.privacy_unit, dataset=name)
    eps = exact_sum([s.reserved_epsilon for s in prepared.schedules])
    dlt = exact_sum([s.reserved_delta for s in prepared.schedules])
    terms = admission.terms
    budget = BudgetLedger(engine).summary(key)
    # The ledger's own check (it runs again, under the ledger's lock, when the sweep reserves).
    check_caps(
        budget,
        epsilon=eps,
        delta=dlt,
        dataset=name,
        who=f"dataset {name!r}: the sweep",
        asks="asks for",
        analyst=terms is not None,
    )
    if terms is not None:
        check_allowance(
            epsilon=eps,
            used=usage(engine, key, terms.analyst),
            allowance=terms.epsilon_allowance,
            analyst=terms.analyst,
            dataset=name,
            who=f"dataset {name!r}: the sweep",
            asks="asks for",
        )


def reserve_sweep(
    engine: Engine, spec: SweepSpec, sweep: Sweep, prepared: Any, *, terms: Any, grids: int
) -> None:
    """Reserve the sweep's whole cost (``prepared``'s charge schedules: a
    :class:`sweeper.sweeps.create.PreparedSweep`) on its ledger at the plan's privacy unit (an
    analyst's allowance checked under the ledger's lock); a refusal names the dataset as the
    user did, never its identity.

    Raises:
        AllowanceExhausted, BudgetExhausted: the reservation does not fit (nothing reserved).
        IllegalState: the ledger is bound to another privacy unit (nothing reserved).
        PermissionDenied: the analyst's grant was revoked while the sweep was planned (the
            reservation goes back).
    """
    schedules: Sequence[ChargeSchedule] = prepared.schedules
    total_e = exact_sum([s.reserved_epsilon for s in schedules])
    total_d = exact_sum([s.reserved_delta for s in schedules])
    name, key = sweep.dataset, str(sweep.ledger_key)
    ledger = BudgetLedger(engine)
    try:
        ledger.reserve(
            key,
            sweep_id=sweep.id,
            epsilon=total_e,
            delta=total_d,
            note=f"sweep {spec.name!r} on {name!r}: {grids} grid(s)",
            principal=sweep.owner,
            allowance=terms.epsilon_allowance if terms is not None else None,
            privacy_unit=prepared.plan.privacy_unit,  # example: each row its own unit
        )
    except AllowanceExhausted as exc:
        raise AllowanceExhausted(
            f"dataset {name!r}: {str(exc).removeprefix('the dataset: ')}",
            dataset=name,
            quantity=exc.quantity,
            requested=exc.requested,
            remaining=exc.remaining,
        ) from None
    except BudgetExhausted as exc:
        raise BudgetExhausted(
            f"dataset {name!r}: {str(exc).removeprefix('the dataset: ')} (the lifetime cap "
            "is that of its records, shared by every name of the same records)",
            dataset=name,
            quantity=exc.quantity,
            requested=exc.requested,
            remaining=exc.remaining,
        ) from None
    # Revoked while this sweep was planned: its reservation goes back, nothing is stored.
    if terms is not None and not has_active_grant(engine, spec.dataset.name, terms.analyst):
        ledger.release(key, sweep_id=sweep.id, note="the analyst's grant was revoked")
        raise PermissionDenied(
            f"your grant on dataset {spec.dataset.name!r} was revoked; ask its owner"
        )
