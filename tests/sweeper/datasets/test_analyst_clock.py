"""What an analyst receives of the clock (:mod:`sweeper.datasets.analyst_clock`): who is an
analyst of which dataset, on real databases, and the rounding of times and durations."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy.orm import Session

from sweeper.datasets.analyst_clock import (
    CLOCK_SECONDS,
    analyst_names,
    coarse_seconds,
    coarse_span,
    coarse_time,
    for_analyst,
    reads_as_analyst,
)
from sweeper.datasets.viewer import Viewer
from sweeper.store import Dataset, DatasetGrant

T0 = datetime(2025, 3, 4, 12, 0, 7, 250_000, tzinfo=UTC)


def test_durations_round_down_to_ten_seconds() -> None:
    assert CLOCK_SECONDS == 10
    assert [coarse_seconds(s) for s in (0.0, 0.2, 9.999, 10.0, 19.5, 123.4)] == [
        0.0,
        0.0,
        0.0,
        10.0,
        10.0,
        120.0,
    ]
    assert coarse_seconds(None) is None
    assert coarse_seconds(float("nan")) is None
    assert coarse_seconds(-3.0) == 0.0  # a clock stepped back is not a negative duration


def test_times_round_down_and_a_span_never_tells_a_finer_duration() -> None:
    assert coarse_time(T0) == "2025-03-04T12:00:00+00:00"
    # ISO text (as records hold it), and a naive datetime (SQLite's, stored as UTC).
    assert coarse_time(T0.isoformat()) == coarse_time(T0.replace(tzinfo=None))
    assert coarse_time(None) is None
    # Two runs that start in the same 10 s slot and differ by 50 ms: one's end crosses a
    # slot boundary. Rounded on their own, their ends would differ; as spans they are the same.
    starts = [T0, T0 + timedelta(seconds=2.5)]
    spans = [coarse_span(s, s + timedelta(seconds=0.2 + 0.05 * i)) for i, s in enumerate(starts)]
    assert spans[0] == spans[1] == ("2025-03-04T12:00:00+00:00", "2025-03-04T12:00:00+00:00")
    s, f = coarse_span(T0, T0 + timedelta(seconds=27.9))
    assert (datetime.fromisoformat(f) - datetime.fromisoformat(s)).total_seconds() == 20.0
    assert coarse_span(None, None) == (None, None)
    assert coarse_span(T0, None) == ("2025-03-04T12:00:00+00:00", None)
    # Cancelled before it started: only the (coarse) time of the cancel.
    assert coarse_span(None, T0) == (None, "2025-03-04T12:00:00+00:00")


def test_an_analysts_record_has_the_same_keys_with_nothing_finer() -> None:
    record = {
        "id": "t",
        "worker": "vm:4242@host",
        "step_time_ms_median": 3.25,
        "train_seconds": 14.7,
        "started_at": T0.isoformat(),
        "finished_at": (T0 + timedelta(seconds=31.2)).isoformat(),
        "metrics": {"accuracy": 0.5},
    }
    shown = for_analyst(record)
    assert set(shown) == set(record)
    assert shown["worker"] is None and shown["step_time_ms_median"] is None
    assert shown["train_seconds"] == 10.0
    assert shown["started_at"] == "2025-03-04T12:00:00+00:00"
    assert shown["finished_at"] == "2025-03-04T12:00:30+00:00"
    assert shown["metrics"] == record["metrics"] and shown["id"] == "t"
    assert record["worker"] == "vm:4242@host"  # the record itself is not changed
    # A sweep's record has no worker: none is added.
    assert set(for_analyst({"started_at": None, "finished_at": None})) == {
        "started_at",
        "finished_at",
    }


@pytest.fixture
def engine(both_engines: Any) -> Any:
    return both_engines


def test_who_reads_a_dataset_as_its_analyst(engine: Any) -> None:
    with Session(engine) as session, session.begin():
        session.add_all(
            [
                Dataset(name="ds_olga", owner="olga", format="csv"),
                Dataset(name="scans", owner=None, format="folder"),
                Dataset(name="digits", owner=None),
                DatasetGrant(
                    dataset="scans",
                    analyst="ana",
                    epsilon_allowance=Decimal(1),
                    granted_by="root",
                    created_at=T0,
                ),
            ]
        )
    names = ["ds_olga", "scans", "digits", "unknown"]
    with Session(engine) as session:
        assert analyst_names(session, "ana", names) == {"ds_olga", "scans"}
        # The owner of an upload; a tenant without a grant on a registered name; built-ins.
        assert analyst_names(session, "olga", names) == set()
        assert analyst_names(session, None, names) == set()
        assert reads_as_analyst(session, Viewer("ana"), "ds_olga")
        assert not reads_as_analyst(session, Viewer("olga"), "ds_olga")
        assert not reads_as_analyst(session, Viewer("ana", admin=True), "ds_olga")
        assert not reads_as_analyst(session, Viewer(None), "ds_olga")
        assert not reads_as_analyst(session, Viewer("ana"), "digits")
