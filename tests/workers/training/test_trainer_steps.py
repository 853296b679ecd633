"""The pack trainer's step loop (issue 50): its progress reports, step times and cleanup."""

from __future__ import annotations

import pytest

from tests.workers.training.test_dp_evaluation import _pack
from workers.training.loop import _run_steps
from workers.training.measure import PackMeasure
from workers.training.prepare import prepare_pack
from workers.training.records import PackRecords
from workers.training.specs import Progress


def test_every_step_is_reported_and_evaluated_on_schedule() -> None:
    """Progress after each step; evaluations at multiples of eval_every and at the last step."""
    pack = prepare_pack(_pack(steps=12, eval_every=5), dataset=None, canaries=None)
    records = PackRecords(pack.k, objective="accuracy", maximise=True, flat=pack.model.flat)
    reports: list[Progress] = []
    step_times = _run_steps(pack, PackMeasure(pack, records), reports.append)
    assert [p.step for p in reports] == list(range(1, 13))
    assert all(p.total_steps == 12 for p in reports)
    assert [p.step for p in reports if p.evals is not None] == [5, 10, 12]
    assert all(len(p.evals or []) == pack.k for p in reports if p.evals is not None)
    assert len(step_times) == 12 and all(t >= 0.0 for t in step_times)
    assert [h["step"] for h in records.history[0]] == [5, 10, 12]


def test_the_noise_source_is_closed_when_a_progress_callback_raises() -> None:
    """A failing callback stops the run, and the noise source is still released (finally)."""
    pack = prepare_pack(_pack(steps=6, eval_every=3), dataset=None, canaries=None)
    records = PackRecords(pack.k, objective="accuracy", maximise=True, flat=pack.model.flat)
    noise = pack.engine.noise
    closed: list[bool] = []
    real_close = noise.close

    def close() -> None:  # records the call, then releases the source for real
        closed.append(True)
        real_close()

    noise.close = close  # type: ignore[method-assign]

    def stop(p: Progress) -> None:
        if p.step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run_steps(pack, PackMeasure(pack, records), stop)
    assert closed == [True]
    assert records.history[0] == []  # stopped before the first evaluation
