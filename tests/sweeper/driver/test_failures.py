"""A failed run reaches its owner as a category and a fixed reason, never the exception's text.

Issue 36: an exception's text may hold values computed from the private records (an
out-of-memory message's sizes scale with the realised Poisson batch; a loading error names the
owner's file and its rows; the schedule's ConfigError names the record count). Whatever the
exception says, the public text must say none of it, and the full text must reach the log.
"""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from dpsweep.errors import (
    ConfigError,
    DatasetError,
    DatasetNotFound,
    PrivacyError,
    TrainingError,
)
from sweeper.driver import failures
from sweeper.driver.failures import (
    CANCELLED,
    DATA_ERROR,
    INTERNAL_ERROR,
    INVALID_CONFIGURATION,
    OUT_OF_MEMORY,
    PLAN_MISMATCH,
    PRIVACY_REFUSED,
    REASONS,
    TRAINING_ERROR,
    WORKER_LOST,
    classify,
    for_category,
    log_failure,
    public_failure,
)
from sweeper.driver.scheduler import MAX_CRASHES, Scheduler, _Drive
from sweeper.settings import SweeperSettings
from sweeper.store import Sweep, SweepState
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from tests.sweeper.sweeps.test_sweep import tiny_spec
from workers.plan_check import PlanMismatch

SECRET_PATH = "/srv/owner/private-records.csv"


def _caused(outer: BaseException, inner: BaseException) -> BaseException:
    """``outer`` raised from ``inner`` (its ``__cause__`` set, as ``raise ... from`` does)."""
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "category", "secrets"),
    [
        (
            RuntimeError(
                "CUDA out of memory. Tried to allocate 123.00 MiB (GPU 0; 79.15 GiB total "
                "capacity; 77.02 GiB already allocated)"
            ),
            OUT_OF_MEMORY,
            ["123", "79.15", "77.02", "MiB"],
        ),
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:83] . DefaultCPUAllocator: can't allocate "
                "memory: you tried to allocate 52428800000 bytes"
            ),
            OUT_OF_MEMORY,
            ["52428800000", "alloc_cpu"],
        ),
        (
            MemoryError("Unable to allocate 7.45 GiB for an array with shape (1000, 2000)"),
            OUT_OF_MEMORY,
            ["7.45", "(1000, 2000)", "shape"],
        ),
        (
            type("OutOfMemoryError", (RuntimeError,), {})("Tried to allocate 2.50 GiB"),
            OUT_OF_MEMORY,
            ["2.50"],
        ),
        (
            DatasetError(f"{SECRET_PATH}: line 17: 3 non-finite feature value(s) in 2 rows"),
            DATA_ERROR,
            [SECRET_PATH, "private-records", "line 17"],
        ),
        (
            ConfigError(
                "batch_size 512 exceeds the 301 training examples", field="training.batch_size"
            ),
            INVALID_CONFIGURATION,
            ["512", "301"],
        ),
        (
            PlanMismatch(
                "refused before touching the data: this run is not the one its privacy budget "
                "was reserved for (sample rate q = 0.0213 differs from the planned 0.02; "
                "470 steps differ from the planned 500)"
            ),
            PLAN_MISMATCH,
            ["0.0213", "470"],
        ),
        (
            PrivacyError(
                "release 'grad' of trial 3: a per-example contribution exceeds the strategy's "
                "claimed sensitivity (a strategy bug); refusing to release"
            ),
            PRIVACY_REFUSED,
            ["trial 3", "'grad'"],
        ),
        (TrainingError("loss became nan at step 41"), TRAINING_ERROR, ["41", "nan"]),
        (
            ValueError(f"zq-marker-5513: records {SECRET_PATH} hold 812 rows"),
            INTERNAL_ERROR,
            ["zq-marker-5513", SECRET_PATH, "812"],
        ),
        (KeyError("label_of_row_9"), INTERNAL_ERROR, ["label_of_row_9"]),
        (DatasetNotFound("no uploaded dataset 'ds_gone'"), DATA_ERROR, ["ds_gone"]),
        (KeyboardInterrupt(), CANCELLED, []),
    ],
)
def test_the_public_text_is_the_category_and_its_fixed_reason_only(
    exc: BaseException, category: str, secrets: list[str]
) -> None:
    failure = public_failure(exc)
    assert classify(exc) == failure.category == category
    assert failure.reason == REASONS[category]
    assert failure.text.startswith(f"{category}: {REASONS[category]}")
    for secret in secrets:
        assert secret not in failure.text
    # No number of any kind: sizes, counts, shapes, rates and line numbers are all digits.
    assert not re.search(r"\d", failure.text), failure.text
    assert "/" not in failure.text  # nor a path


def test_an_allocation_failure_under_a_wrapper_is_out_of_memory() -> None:
    # A loader or a read-ahead thread may re-raise it as its own error.
    wrapped = _caused(
        RuntimeError("read-ahead failed"), RuntimeError("CUDA out of memory. Tried 9 GiB")
    )
    assert classify(wrapped) == OUT_OF_MEMORY
    loading = _caused(DatasetError(f"{SECRET_PATH}: could not load"), MemoryError("4 GiB"))
    assert classify(loading) == OUT_OF_MEMORY
    # A privacy refusal stays one whatever it was raised while handling.
    refused = _caused(PrivacyError("refused"), MemoryError("4 GiB"))
    assert classify(refused) == PRIVACY_REFUSED


def test_rays_own_errors_are_a_lost_worker_and_a_tasks_error_keeps_its_own_category() -> None:
    ray_exceptions = pytest.importorskip("ray.exceptions")
    assert classify(ray_exceptions.WorkerCrashedError()) == WORKER_LOST
    assert classify(ray_exceptions.NodeDiedError("node 7f3a died")) == WORKER_LOST
    assert classify(ray_exceptions.TaskCancelledError()) == CANCELLED
    assert (
        classify(ray_exceptions.OutOfMemoryError("Memory on the node was 31.2GB / 32GB"))
        == OUT_OF_MEMORY
    )
    # A task's own exception, re-raised by Ray: its class decides (the task's, not Ray's).
    cause = DatasetError(f"{SECRET_PATH}: bad")
    wrapped = ray_exceptions.RayTaskError("f", "Traceback ...", cause).as_instanceof_cause()
    assert classify(wrapped) == DATA_ERROR
    plain = ray_exceptions.RayTaskError("f", "Traceback ...", ValueError("x")).as_instanceof_cause()
    assert classify(plain) == INTERNAL_ERROR


def test_every_reason_is_fixed_text_without_numbers_or_paths() -> None:
    for category, reason in REASONS.items():
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", category)
        assert not re.search(r"\d", reason) and "/" not in reason, (category, reason)
        assert for_category(category).text.endswith(f"({failures.DETAILS})")


@pytest.mark.parametrize("category", [None, "", "CUDA out of memory: 5 GiB", 7, "unknown"])
def test_an_unknown_category_fails_closed_as_internal_error(category: Any) -> None:
    failure = for_category(category)
    assert failure.category == INTERNAL_ERROR
    assert failure.text == for_category(INTERNAL_ERROR).text


def test_the_full_text_and_traceback_go_to_the_log_at_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("tests.failures")
    try:
        raise RuntimeError("CUDA out of memory. Tried to allocate 123 MiB; zq-marker-8841")
    except RuntimeError as exc:
        with caplog.at_level(logging.ERROR, logger="tests.failures"):
            failure = log_failure(logger, exc, "sweep %s: trial(s) %s failed", "s1", "t1")
    assert failure.category == OUT_OF_MEMORY and "zq-marker-8841" not in failure.text
    (record,) = [r for r in caplog.records if r.name == "tests.failures"]
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "sweep s1: trial(s) t1 failed (out-of-memory)"
    assert record.exc_info is not None
    assert "zq-marker-8841" in caplog.text and "Traceback" in caplog.text


def test_the_pack_task_reports_a_category_and_logs_the_text(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The Ray task, called directly: its ``error`` event carries the category, the detail
    for the driver's log, and no public text built from the exception."""
    import workers.training.loop as loop
    from sweeper.driver.ray_backend import _pack_task

    def fail(spec: Any, progress: Any = None) -> Any:
        raise DatasetError(f"{SECRET_PATH}: 3 non-finite value(s); zq-marker-2209")

    monkeypatch.setattr(loop, "train_pack", fail)
    # Not under Ray: asking Ray for the node would start one in this process.
    monkeypatch.setattr("sweeper.driver.ray_backend._node_id", lambda: "local")
    spec = type("Spec", (), {"trials": [object(), object()], "strategy": "fixed"})()
    with caplog.at_level(logging.ERROR, logger="sweeper.driver.ray_backend"):
        events = list(_pack_task(spec))
    assert [e["type"] for e in events] == ["started", "error"]
    error = events[-1]
    assert error["category"] == DATA_ERROR and error["privacy"] is False
    assert "error" not in error  # no ready-made text: the driver builds it from the category
    assert "zq-marker-2209" in error["detail"] and "Traceback" in error["detail"]
    assert "zq-marker-2209" in caplog.text
    (record,) = [r for r in caplog.records if r.name == "sweeper.driver.ray_backend"]
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "a pack of 2 fixed trial(s) failed (data-error)"


def test_a_sweep_whose_driver_keeps_crashing_says_the_category_of_the_last_crash(
    tmp_path: Path,
) -> None:
    """The scheduler's give-up message names the crash's category, never its text."""
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    upgrade(url)
    engine = make_engine(url)
    sid = create_sweep(engine, tiny_spec(privacy={"budgets": [2], "delta": 1e-5}))
    sched = Scheduler(engine, SweeperSettings())
    sched._crashes[sid] = MAX_CRASHES - 1
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    error = DatasetError(f"{SECRET_PATH}: 17 rows; zq-marker-6120")
    sched._drives[sid] = _Drive(dead, threading.Event(), error=error)
    sched._reap()
    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        assert sweep is not None and sweep.state == SweepState.failed
        assert sweep.error == (
            f"its driver crashed {MAX_CRASHES} times; last: {for_category(DATA_ERROR).text}"
        )
        assert "zq-marker-6120" not in sweep.error and SECRET_PATH not in sweep.error
    engine.dispose()


class _Claims:
    """Records the trials a crash policy ends (no database)."""

    def __init__(self) -> None:
        self.ended: list[tuple[str, str]] = []

    def end(self, t: Any, state: Any, error: str, **_: Any) -> None:
        self.ended.append((t.id, error))


@pytest.mark.parametrize(
    ("exc", "category"),
    [
        (RuntimeError("node 10.0.0.7 died; worker pid 4711; zq-marker-3391"), WORKER_LOST),
        (
            type("OutOfMemoryError", (Exception,), {})(
                "Task was killed due to the node running low on memory. Memory on the node "
                "(IP: 10.0.0.7) was 30.61GB / 32.00GB; zq-marker-3391"
            ),
            OUT_OF_MEMORY,
        ),
        (DatasetError("zq-marker-3391"), WORKER_LOST),  # raised by Ray, not by the task
    ],
)
def test_a_lost_worker_says_its_category_and_logs_the_text(
    exc: Exception, category: str, caplog: pytest.LogCaptureFixture
) -> None:
    from types import SimpleNamespace

    from sweeper.driver.crash import CrashPolicy
    from sweeper.driver.held_sweep import InFlight, PendingTrial

    trial = PendingTrial("t1", "a", "fixed", 2.0, {}, 0, 1, 0, 1.0, 1e-5)
    # A papernot-steinke grid never re-runs: the trial fails at once, through Claims.
    held = SimpleNamespace(
        sweep_id="s1",
        pending=[],
        schedules={trial.grid: SimpleNamespace(whole_grid=True, runs=1)},
        runs_used={},
    )
    claims = _Claims()
    policy = CrashPolicy(held, SimpleNamespace(), claims)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="sweeper.driver.crash"):
        policy.lost(InFlight(None, "p1", [trial], 0.0), exc)
    ((tid, error),) = claims.ended
    assert tid == "t1"
    assert error.startswith(f"interrupted: its worker was lost ({category}; {failures.DETAILS})")
    assert "zq-marker-3391" not in error and not re.search(r"\d", error)
    assert "zq-marker-3391" in caplog.text
    assert [r.levelno for r in caplog.records if r.name == "sweeper.driver.crash"] == [
        logging.ERROR
    ]
