"""Charging a one-off run (``dpsweep train``, a canary audit) to its dataset's ledger, like a
one-trial grid.

The run reserves and is charged, before it touches the data, the epsilon of its own noise,
rate and steps; a cap that cannot cover it refuses the run (BudgetExhausted). The charge is in
the release log (kind ``train`` or ``audit``) before anything of the run is shown. A
non-private run has no finite epsilon to record, so it is refused on a dataset with an epsilon
cap and, elsewhere, runs uncharged (the summary says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy.engine import Engine

from dpsweep.errors import PrivacyError
from dpsweep.plan_fields import unit_suffix
from sweeper.datasets.identity import bind_name, ledger_key_of
from sweeper.datasets.names import BUILTIN
from sweeper.datasets.resolution import is_public
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.keys import scoped_identity_key
from sweeper.privacy.release_log import record_run
from sweeper.runs.one_off_cost import OneOffCost, read_cost
from sweeper.runs.single_run import PreparedRun
from sweeper.store import new_id


@dataclass(frozen=True)
class OneOffCharge:
    """What a one-off run is charged, and on which dataset's ledger.

    ``stored``: the dataset is a registered name or an upload, charged on the ledger its name
    was bound to when it was registered (:func:`sweeper.datasets.identity.ledger_key_of`), as a
    sweep is; otherwise ``dataset`` (a loader name, or ``loader:path``) is bound here to the
    records the run read (``content_sha256``, ``config``).
    """

    dataset: str
    stored: bool
    content_sha256: str
    config: dict[str, Any]
    epsilon: float
    delta: float
    kind: str  # the release log's kind: train, audit
    run_id: str  # the run's own id (the ledger's entries are keyed ``<kind>_<run_id>``)
    note: str
    principal: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    # What one unit of the charged ε protects: None or ``example`` (a row), else the data's
    # unit (a person); the ledger refuses a charge at another unit than its own.
    privacy_unit: str | None = None


def ledger_key_for(engine: Engine, charge: OneOffCharge) -> str:
    """The ledger ``charge`` goes to: a stored dataset's bound one, else the name bound here."""
    if charge.stored:
        return ledger_key_of(engine, charge.dataset)
    # A name bound here is the run's principal's (None: the operator's), as a sweep's is.
    new_row = {"config": charge.config, "owner": charge.principal}
    return bind_name(engine, charge.dataset, charge.content_sha256, new_row=new_row).ledger_key


def charge_one_off(engine: Engine, charge: OneOffCharge, *, ledger_key: str | None = None) -> str:
    """Reserve and charge ``charge`` on its dataset's ledger, and log it in the release log.

    Args:
        engine: The store.
        charge: What is charged.
        ledger_key: The ledger, when the caller resolved it already (default:
            :func:`ledger_key_for`).

    Returns:
        The ledger's key.

    Raises:
        BudgetExhausted: the dataset's cap cannot cover the run (nothing is charged).
    """
    key = ledger_key or ledger_key_for(engine, charge)
    entry = f"{charge.kind}_{charge.run_id}"
    ledger = BudgetLedger(engine)
    eps, delta = charge.epsilon, charge.delta
    ledger.reserve(
        key,
        sweep_id=entry,
        epsilon=eps,
        delta=delta,
        note=charge.note,
        principal=charge.principal,
        privacy_unit=charge.privacy_unit,
    )
    ledger.charge(key, sweep_id=entry, trial_id=entry, epsilon=eps, delta=delta, note=charge.note)
    # Attributable: the charge is in the release log before anything of the run is shown.
    record_run(
        engine,
        ledger_key=key,
        dataset_name=charge.dataset,
        principal=charge.principal,
        run_id=charge.run_id,
        kind=charge.kind,
        epsilon=eps,
        delta=delta,
        detail=charge.detail,
    )
    return key


def is_public_dataset(engine: Engine, name: str) -> bool:
    """Whether ``name`` reads public records: a shared set bundled with dpsweep or a plug-in
    (``digits``, ``synthetic``, ...), or a registered name its owner declared public."""
    return name in BUILTIN or is_public(engine, name)


def quote_training_run(
    engine: Engine, prepared: PreparedRun, *, dataset: str, principal: str | None = None
) -> OneOffCost:
    """What :func:`charge_training_run` will charge ``prepared``, read-only (nothing is bound,
    reserved or charged)."""
    from workers.accounting import epsilon_for  # deferred: scipy

    if prepared.stored:
        key = ledger_key_of(engine, dataset)
    else:
        # A loader name is bound to its records when charged; its ledger is the records'.
        key = scoped_identity_key(str(prepared.data.content_sha256), owner=principal)
    epsilon = epsilon_for(prepared.inputs()) if prepared.noise_multiplier is not None else None
    # A file read by a loader is never public; a name is when its records are.
    name = dataset if prepared.stored else prepared.run.dataset.name
    public = prepared.run.dataset.path is None and is_public_dataset(engine, name)
    return read_cost(
        engine,
        what="this run",
        dataset=dataset,
        public=public,
        epsilon=epsilon,
        delta=prepared.run.delta,
        ledger=key,
        privacy_unit=prepared.privacy_unit,
    )


def charge_training_run(
    engine: Engine,
    prepared: PreparedRun,
    *,
    dataset: str,
    quote: OneOffCost | None = None,
    principal: str | None = None,
) -> dict[str, Any] | None:
    """Charge a ``dpsweep train`` run; what was charged (None: a non-private run).

    Args:
        engine: The store.
        prepared: The run, checked and planned (:func:`sweeper.runs.single_run.prepare_single_run`).
        dataset: The dataset's name as the user gave it (``loader:path`` for a file).
        quote: The quote shown to the user (:func:`quote_training_run`): its epsilon is the
            one charged (default: computed here the same way).
        principal: Who runs it (``dpsweep train --owner``; None: the operator).

    Raises:
        BudgetExhausted: the dataset's cap cannot cover the run (nothing is charged).
        PrivacyError: a non-private run on a dataset with an epsilon cap.
    """
    run = prepared.run
    quote = quote or quote_training_run(engine, prepared, dataset=dataset, principal=principal)
    charge = OneOffCharge(
        dataset=dataset,
        stored=prepared.stored,
        content_sha256=str(prepared.data.content_sha256),
        config={"name": prepared.dataset.name, "path": prepared.dataset.path},
        epsilon=0.0,
        delta=run.delta,
        kind="train",
        run_id=new_id(),
        note=f"dpsweep train: one {run.strategy} run on {dataset!r}",
        principal=principal,
        detail={"released": ["model", "metrics"], "strategy": run.strategy},
        privacy_unit=prepared.privacy_unit,
    )
    if quote.epsilon is None:
        key = ledger_key_for(engine, charge)
        if BudgetLedger(engine).summary(key).epsilon_cap is not None:
            raise PrivacyError(
                f"dataset {dataset!r} has a lifetime epsilon cap, and a non-private run would "
                "spend without bound; train it with a private strategy"
            )
        return None
    charge = replace(charge, epsilon=quote.epsilon)
    charge_one_off(engine, charge)
    return {
        "run": f"train_{charge.run_id}",
        "dataset": dataset,
        "epsilon_charged": quote.epsilon,
        "delta_charged": run.delta,
        "privacy_unit": prepared.privacy_unit,
        "covers": "this one training run (a one-trial grid), charged to the dataset's "
        f"lifetime budget{unit_suffix(prepared.privacy_unit)}",
    }
