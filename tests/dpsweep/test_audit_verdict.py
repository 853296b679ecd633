"""The verdict's words (issue 49): one function says whether the bound exceeds the claim and
the chance of that for an honest run; older stored results read in today's terms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dpsweep.audit import AuditRequest, audit_verdict, result_view


@settings(max_examples=60, deadline=None)
@given(
    bound=st.floats(0.0, 20.0),
    claimed=st.floats(0.01, 20.0),
    confidence=st.floats(0.51, 0.999),
    estimate=st.none() | st.floats(0.0, 20.0),
)
def test_the_verdict_follows_the_bound_and_names_its_error_rate(
    bound: float, claimed: float, confidence: float, estimate: float | None
) -> None:
    v = audit_verdict(bound=bound, claimed=claimed, confidence=confidence, estimate=estimate)
    assert v["exceeds_claim"] == (bound > claimed)
    assert v["estimate_exceeds_claim"] == (estimate is not None and estimate > claimed)
    assert v["false_alarm_rate"] == pytest.approx(1.0 - confidence)
    text = v["verdict"]
    if bound > claimed:
        assert "exceeds the claimed epsilon" in text
        assert f"{100 * (1 - confidence):.3g} %" in text and "public data" in text
    elif v["estimate_exceeds_claim"]:
        assert "the Gaussian estimate does" in text and "no guarantee" in text
    else:
        assert "no evidence of a leak" in text and "proves nothing" in text


def test_a_result_stored_before_issue_49_reads_the_one_run_bound() -> None:
    old = {
        "epsilon_claimed": 4.0,
        "epsilon_lower_bound": 6.53,  # the Gaussian figure, unchecked
        "confidence": 0.95,
        "method": "gaussian",
        "epsilon_lower_bound_one_run": 2.3,
        "epsilon_lower_bound_gaussian": 6.53,
    }
    view = result_view(old)
    assert view is not None
    assert view["epsilon_lower_bound"] == 2.3 and view["method"] == "one-run"
    assert view["epsilon_estimate"] is None and "epsilon_lower_bound_gaussian" not in view
    assert view["exceeds_claim"] is False and "no evidence of a leak" in view["verdict"]
    assert old["epsilon_lower_bound"] == 6.53  # the stored row is not changed
    assert result_view(None) is None
    assert result_view(view) is view  # today's results pass as they are


def test_a_confidence_of_one_half_or_less_is_refused_at_the_edge() -> None:
    """The bound needs confidence > 1/2: refused before anything is charged, not after."""
    with pytest.raises(ValidationError):
        AuditRequest(epsilon=1.0, confidence=0.5)
    assert AuditRequest(epsilon=1.0, confidence=0.9).confidence == 0.9
