"""End to end: a trial that fails inside its Ray worker shows its owner a category, and the
operator's log the text (issue 36).

A real plug-in distribution registers a model that builds but whose forward pass raises an
out-of-memory-like error naming sizes, a path and a marker string (values of the kind that scale
with, or name, private records). The worker process finds the plug-in through its entry point
(the folder is on the ``PYTHONPATH`` Ray's workers inherit); this process registers the same
code, since admission builds the model to check its layers before anything is charged. After a
real sweep on a real local Ray, the marker must be nowhere in the database (every row of every
table), the API's pages, the summary or the export, and must be in the driver's log at ERROR.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sweeper.datasets.access import Viewer
from sweeper.driver import failures
from sweeper.driver.loop import run_sweep
from sweeper.driver.ray_backend import ray_session
from sweeper.settings import SweeperSettings
from sweeper.store import Sweep, SweepState, Trial, TrialState, metadata
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.export import export_sweep
from sweeper.sweeps.summary import summarize
from sweeper.sweeps.sweep_pages import page_sweeps
from sweeper.sweeps.trial_pages import page_trials
from tests.workers.test_plugins import write_distribution
from workers.models.descriptors import DESCRIPTORS
from workers.models.registry import MODELS

MARKER = "zq-private-marker-7731"
SECRET_PATH = "/srv/owner/private-records.csv"
MESSAGE = f"CUDA out of memory. Tried to allocate 123.45 MiB for {SECRET_PATH} ({MARKER})"

PLUGIN_CODE = '''
"""A test plug-in: a model that builds, and fails as an out-of-memory error would when run."""

import math

from torch import nn

from workers.models.descriptors import ModelDescriptor
from workers.models.registry import register_model


class Failing(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        raise RuntimeError({message!r})


def register():
    @register_model(
        ModelDescriptor(name="{name}", input_kind="any", description="fails when run")
    )
    def build(input_shape, num_classes):
        return Failing(math.prod(input_shape), num_classes)
'''


ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def failing_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The failing model's name: a plug-in for the Ray workers (on the PYTHONPATH they
    inherit), and the same code registered in this process, whose admission builds the model
    (on the meta device, to check its layers) before anything is charged; only running it
    fails, as an out-of-memory error does in a worker."""
    module = f"dpsweep_failing_model_{uuid.uuid4().hex[:8]}"
    name = module.replace("_", "-")
    site = tmp_path / "site"
    site.mkdir()
    write_distribution(
        site,
        module,
        f"[dpsweep.models]\nfailing = {module}:register\n",
        {"__init__.py": PLUGIN_CODE.format(name=name, message=MESSAGE)},
    )
    path = [str(site), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    namespace: dict[str, Any] = {}
    exec(compile(PLUGIN_CODE.format(name=name, message=MESSAGE), module, "exec"), namespace)
    namespace["register"]()
    try:
        yield name
    finally:
        DESCRIPTORS.pop(name, None)
        MODELS.pop(name, None)


@pytest.fixture
def own_ray(failing_model: str) -> Iterator[None]:
    """A local Ray started after the PYTHONPATH was set (so that its workers inherit it)."""
    import ray

    if ray.is_initialized():  # another module's Ray would not know the plug-in
        pytest.skip("a Ray is already running in this process")
    with ray_session(SweeperSettings(), workers=1):
        yield


def _all_rows(engine: Any) -> str:
    """Every row of every table, as text."""
    out = []
    with engine.connect() as conn:
        for table in metadata.sorted_tables:
            if sa.inspect(conn).has_table(table.name):
                out += [repr(tuple(row)) for row in conn.execute(sa.select(table))]
    return "\n".join(out)


def _leaks(text: str) -> list[str]:
    return [s for s in (MARKER, SECRET_PATH, "123.45", "MiB") if s in text]


def test_a_trial_failing_in_its_worker_shows_a_category_and_logs_the_text(
    tmp_path: Path, failing_model: str, own_ray: None, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'failure.db'}"
    upgrade(url)
    engine = make_engine(url)
    spec = {
        "name": "failing",
        "dataset": {"name": "digits"},
        "model": {"name": failing_model},
        "training": {"steps": 5, "batch_size": 64, "eval_every": 5},
        "privacy": {"budgets": [2], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1, 0.5], "clip": [1.0]}}],
    }
    sid = create_sweep(engine, spec)
    with caplog.at_level(logging.ERROR):
        outcome = run_sweep(engine, sid)
    assert outcome.state == SweepState.failed.value, outcome

    public = failures.for_category(failures.OUT_OF_MEMORY).text
    with Session(engine) as s:
        sweep = s.get(Sweep, sid)
        trials = list(s.scalars(sa.select(Trial).where(Trial.sweep_id == sid)))
    assert sweep is not None and trials
    assert all(t.state == TrialState.failed for t in trials)
    assert {t.error for t in trials} == {public}
    assert public.startswith("out-of-memory: the trial ran out of memory")
    assert not re.search(r"\d", public)

    # Nowhere for the owner: the database (trial and sweep rows, events, release log, ...),
    # the API's pages, the summary, the export.
    assert _leaks(_all_rows(engine)) == []
    viewer = Viewer(None)
    items = page_trials(engine, sid, viewer, limit=50).items
    assert {i["error"] for i in items} == {public}
    shown = [
        json.dumps(items, default=str),
        json.dumps(page_sweeps(engine, viewer).items, default=str),
        json.dumps(summarize(engine, sid), default=str),
        export_sweep(engine, sid, fmt="json"),
        export_sweep(engine, sid, fmt="csv"),
    ]
    assert _leaks("\n".join(shown)) == []

    # And in the operator's log (the driver's, which received the worker's report): at ERROR,
    # with the worker's traceback.
    reports = [
        r
        for r in caplog.records
        if r.name == "sweeper.driver.pack_events" and MARKER in r.getMessage()
    ]
    assert reports and all(r.levelno == logging.ERROR for r in reports)
    assert SECRET_PATH in reports[0].getMessage() and "Traceback" in reports[0].getMessage()
    assert sid in reports[0].getMessage()
    engine.dispose()
