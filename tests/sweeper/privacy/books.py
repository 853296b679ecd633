"""The ledger's books check, shared by the ledger tests."""

from __future__ import annotations

from sweeper.privacy.ledger import BudgetLedger, summed_entries

DS = "digits"


def assert_books(ledger: BudgetLedger, dataset: str = DS) -> None:
    """Every running total (the dataset's, each sweep's) equals the sum of the entries."""
    summary = ledger.summary(dataset)
    entries = ledger.entries(dataset)
    assert summed_entries(entries) == {
        "epsilon_spent": summary.epsilon_spent,
        "delta_spent": summary.delta_spent,
        "epsilon_reserved": summary.epsilon_reserved,
        "delta_reserved": summary.delta_reserved,
    }
    with ledger.engine.connect() as conn:
        for sweep_id in {e.sweep_id for e in entries}:
            cached = ledger._balance(conn, dataset, sweep_id)
            assert cached == ledger._balance_from_entries(conn, dataset, sweep_id)
