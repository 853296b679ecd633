"""The in-process side of :mod:`sweeper.store.notify`: subscribers hear of a sweep's events
after the commit that writes them, once per sweep, and never of a rolled-back transaction."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from api.testing.server import SMALL_SPEC
from sweeper.store import notify
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps import events
from sweeper.sweeps.create import create_sweep


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path}/n.db"
    upgrade(url)
    e = make_engine(url)
    yield e
    e.dispose()


def test_subscribers_hear_after_commit_only(engine: Engine) -> None:
    heard: list[list[str]] = []

    def hear(ids: Iterable[str]) -> None:
        heard.append(sorted(ids))

    unsubscribe = notify.subscribe(hear)
    try:
        sid = create_sweep(engine, yaml.safe_load(SMALL_SPEC), owner="ada")
        assert heard == [[sid]]  # create's "pending" event
        heard.clear()

        data = {"trial": "t", "step": 1, "values": {}}
        with Session(engine) as session:
            with session.begin():
                events.lock_sweep(session, sid)
                events.emit(session, sid, events.METRIC, data)
                with session.begin_nested():  # a savepoint's release is not the commit
                    events.emit(session, sid, events.METRIC, data)
                assert heard == []
            assert heard == [[sid]]  # once per sweep and transaction
            heard.clear()
            # Rolled back: nothing; and the session's next transaction notifies again.
            with pytest.raises(RuntimeError), session.begin():
                events.emit(session, sid, events.METRIC, data)
                raise RuntimeError("roll back")
            assert heard == []
            with session.begin():
                events.emit(session, sid, events.METRIC, data)
            assert heard == [[sid]]
    finally:
        unsubscribe()
    heard.clear()
    with Session(engine) as session, session.begin():
        events.emit(session, sid, events.METRIC, data)
    assert heard == []
