"""Charging a one-off training run (``dpsweep train``) to its dataset's ledger, like a one-trial
grid.

The run reserves and is charged, before it touches the data, the epsilon of its own noise,
rate and steps; a cap that cannot cover it refuses the run (BudgetExhausted). A non-private
run has no finite epsilon to record, so it is refused on a dataset with an epsilon cap and,
elsewhere, runs uncharged (the summary says so). The charge is in the release log (kind
``train``) before anything of the run is shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine

from dpsweep.errors import PrivacyError
from sweeper.datasets.identity import bind_name, ledger_key_of
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.release_log import record_run
from sweeper.store import new_id


@dataclass(frozen=True)
class TrainingRun:
    """What a one-off run is charged for: its dataset and the noise, rate and steps it uses.

    ``stored``: the dataset is a registered name or an upload, charged on the ledger its name
    was bound to when it was registered (:func:`sweeper.datasets.identity.ledger_key_of`), as a
    sweep is; otherwise ``name`` (a loader name, or ``loader:path``) is bound here to the
    records the run read (``content_sha256``, ``config``).
    """

    name: str
    stored: bool
    content_sha256: str
    config: dict[str, Any]
    strategy: str
    noise_multiplier: float | None  # None: a non-private run
    sample_rate: float
    steps: int
    delta: float
    accountant: str


def charge_training_run(engine: Engine, run: TrainingRun) -> dict[str, Any] | None:
    """Reserve and charge ``run`` on its dataset's ledger; what was charged (None: non-private).

    Raises:
        BudgetExhausted: the dataset's cap cannot cover the run (nothing is charged).
        PrivacyError: a non-private run on a dataset with an epsilon cap.
    """
    from workers.accounting import compute_epsilon  # deferred: scipy

    if run.stored:
        key = ledger_key_of(engine, run.name)
    else:
        key = bind_name(
            engine, run.name, run.content_sha256, new_row={"config": run.config}
        ).ledger_key
    ledger = BudgetLedger(engine)
    if run.noise_multiplier is None:
        if ledger.summary(key).epsilon_cap is not None:
            raise PrivacyError(
                f"dataset {run.name!r} has a lifetime epsilon cap, and a non-private run would "
                "spend without bound; train it with a private strategy"
            )
        return None
    epsilon = compute_epsilon(
        noise_multiplier=run.noise_multiplier,
        sample_rate=run.sample_rate,
        steps=run.steps,
        target_delta=run.delta,
        accountant=run.accountant,
    )
    run_id = f"train_{new_id()}"
    note = f"dpsweep train: one {run.strategy} run on {run.name!r}"
    ledger.reserve(key, sweep_id=run_id, epsilon=epsilon, delta=run.delta, note=note)
    ledger.charge(
        key, sweep_id=run_id, trial_id=run_id, epsilon=epsilon, delta=run.delta, note=note
    )
    # Attributable: the charge is in the release log (kind train) before anything of the run
    # is shown.
    record_run(
        engine,
        ledger_key=key,
        dataset_name=run.name,
        principal=None,
        run_id=run_id.removeprefix("train_"),
        kind="train",
        epsilon=epsilon,
        delta=run.delta,
        detail={"released": ["model", "metrics"], "strategy": run.strategy},
    )
    return {
        "run": run_id,
        "dataset": run.name,
        "epsilon_charged": epsilon,
        "delta_charged": run.delta,
        "covers": "this one training run (a one-trial grid), charged to the dataset's "
        "lifetime budget",
    }
