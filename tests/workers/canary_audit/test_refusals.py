"""What cannot be audited is refused (issue 49): a strategy whose releases white-box canaries
cannot enter, before anything trains or is charged; and an audit whose canaries never entered
a release fails instead of passing with a bound of 0."""

from __future__ import annotations

from typing import Any

import pytest

from dpsweep.errors import ConfigError
from tests.workers.canary_audit.normless import normless
from workers.canary_audit.canaries import GradientCanaries
from workers.canary_audit.run import check_audit_pack, run_audit
from workers.datasets.records import DatasetSpec
from workers.models.descriptors import ModelSpec
from workers.training.specs import PackSpec, TrialSpec

__all__ = ["normless"]  # the fixture, used by name


def _spec(strategy: str, **params: Any) -> PackSpec:
    return PackSpec(
        dataset=DatasetSpec(name="digits"),
        model=ModelSpec("mlp", {}),
        strategy=strategy,
        trials=[TrialSpec(lr=0.3, seed=0, noise_multiplier=1.0, target_delta=1e-5, params=params)],
        batch_size=256,
        steps=10,
        accountant="rdp",
    )


def test_a_strategy_that_reads_no_norms_is_refused_white_box(normless: str) -> None:
    with pytest.raises(ConfigError) as exc:
        check_audit_pack(_spec(normless), setting="white-box", canaries=1000)
    assert exc.value.field == "strategy"
    assert "cannot enter its releases" in str(exc.value)
    assert "black-box" in str(exc.value)  # what to do instead
    # Input canaries are records, which every strategy weighs: black-box may audit it.
    check_audit_pack(_spec(normless), setting="black-box", canaries=1000)


def test_an_audit_whose_canaries_never_entered_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine bug (here: the canaries' gradients dropped) fails the audit; it does not pass
    it with a bound of 0."""
    monkeypatch.setattr(GradientCanaries, "add_into", lambda self, *a, **k: None)
    with pytest.raises(ConfigError) as exc:
        run_audit(_spec("fixed", clip=1.0), canaries=200, public_data=True)
    assert "never entered a release" in str(exc.value)
