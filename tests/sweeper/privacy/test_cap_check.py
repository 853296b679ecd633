"""One cap check (issue 50): a sweep's pre-check and the ledger's reservation agree, exactly."""

from __future__ import annotations

import tempfile
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sweeper.privacy.ledger import BudgetLedger, create_ledger_tables
from sweeper.privacy.ledger.cap_check import check_caps
from sweeper.privacy.ledger.errors import BudgetExhausted
from sweeper.store.engine import create_ledger_engine

amounts = st.floats(0, 10, allow_nan=False).map(lambda v: round(v, 3))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cap=amounts, spent=amounts, reserved=amounts, asked=amounts)
def test_the_pre_check_refuses_exactly_what_the_ledger_refuses(
    cap: float, spent: float, reserved: float, asked: float
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        engine = create_ledger_engine(f"sqlite:///{Path(tmp) / 'ledger.db'}")
        try:
            create_ledger_tables(engine)
            ledger = BudgetLedger(engine)
            ds = "digits"
            # Spent and reserved by other sweeps, under no cap; then the cap (it may not be
            # lowered below what is used, so it is at least that).
            if spent:
                ledger.reserve(ds, sweep_id="s1", epsilon=spent, delta=0.0)
                ledger.charge(ds, sweep_id="s1", trial_id="t1", epsilon=spent, delta=0.0)
            if reserved:
                ledger.reserve(ds, sweep_id="s2", epsilon=reserved, delta=0.0)
            ledger.set_cap(ds, epsilon_cap=max(cap, spent + reserved + 0.001))
            summary = ledger.summary(ds)
            try:
                check_caps(
                    summary, epsilon=Decimal(asked), delta=Decimal(0), dataset=ds,
                    who="the sweep", asks="asks for", analyst=False,
                )  # fmt: skip
                pre_check = "fits"
            except BudgetExhausted:
                pre_check = "refused"
            try:
                ledger.reserve(ds, sweep_id="s3", epsilon=asked, delta=0.0)
                reserved_ok = "fits"
            except BudgetExhausted:
                reserved_ok = "refused"
            assert pre_check == reserved_ok
        finally:
            engine.dispose()


def test_an_analysts_refusal_shows_no_figure() -> None:
    budget = type(
        "B",
        (),
        {
            "epsilon_cap": Decimal(5), "epsilon_spent": Decimal(4), "epsilon_reserved": Decimal(0),
            "delta_cap": None, "delta_spent": Decimal(0), "delta_reserved": Decimal(0),
        },
    )()  # fmt: skip
    with pytest.raises(BudgetExhausted) as err:
        check_caps(budget, epsilon=Decimal(2), delta=Decimal(0), dataset="d",
                   who="dataset 'd': the sweep", asks="asks for", analyst=True)  # fmt: skip
    assert str(err.value).startswith("dataset 'd': the sweep does not fit")
    assert not any(ch.isdigit() for ch in str(err.value))
    with pytest.raises(BudgetExhausted) as err:
        check_caps(budget, epsilon=Decimal(2), delta=Decimal(0), dataset="d",
                   who="dataset 'd': the sweep", asks="asks for", analyst=False)  # fmt: skip
    assert "asks for epsilon=2.0 but only 1.0 remains of the lifetime cap 5.0" in str(err.value)
