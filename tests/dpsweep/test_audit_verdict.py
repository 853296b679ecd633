"""The verdict's words (issue 49): one function says whether the bound exceeds the claim and
the chance of that for an honest run; older stored results read in today's terms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dpsweep.audit import AuditRequest, audit_summary, audit_verdict, result_view


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
    assert result_view(view) == view  # today's results read the same again


def test_a_confidence_of_one_half_or_less_is_refused_at_the_edge() -> None:
    """The bound needs confidence > 1/2: refused before anything is charged, not after."""
    with pytest.raises(ValidationError):
        AuditRequest(epsilon=1.0, confidence=0.5)
    assert AuditRequest(epsilon=1.0, confidence=0.9).confidence == 0.9


def test_the_one_line_verdict_says_what_the_bound_shows() -> None:
    """Issue 51: a bound of 0 at a claim of 2 proves nothing, and the line says so; a bound
    above the claim names its false-alarm rate; the estimate only as evidence under its
    model; a bound below the claim never confirms it."""
    zero = audit_summary(bound=0.0, claimed=2.004, confidence=0.95)
    assert zero.startswith("95 % lower bound 0.00 ≤ claimed ε 2.00: consistent"), zero
    assert "too weak to show much" in zero and "a bound near 0 proves nothing" in zero
    above = audit_summary(bound=2.43, claimed=0.99, confidence=0.95)
    assert above.startswith("95 % lower bound 2.43 > claimed ε 0.99"), above
    assert "at most 5 %" in above and "public data" in above
    suspect = audit_summary(bound=2.3, claimed=4.0, confidence=0.95, estimate=6.6)
    assert "≤ claimed ε 4.00, but the Gaussian estimate 6.60 exceeds it" in suspect
    assert "no guarantee" in suspect
    fair = audit_summary(bound=2.28, claimed=7.99, confidence=0.95)
    assert "consistent, no evidence of a leak" in fair and "never confirms the claim" in fair
    # Two figures that read alike at 2 decimals are shown with more.
    assert "2.0041 > claimed ε 2.004" in audit_summary(bound=2.0041, claimed=2.004, confidence=0.9)
    assert "no bound" in audit_summary(bound=None, claimed=2.0, confidence=0.95)
    for line in (zero, above, suspect, fair):
        assert "\n" not in line


def test_every_result_read_carries_the_one_line_verdict() -> None:
    """Stored results hold no summary (the worker stores the long verdict): it is added on
    reading, from the stored figures, estimate included."""
    stored = {"epsilon_claimed": 2.004, "epsilon_lower_bound": 0.0, "confidence": 0.95,
              **audit_verdict(bound=0.0, claimed=2.004, confidence=0.95)}  # fmt: skip
    stored.pop("summary")
    view = result_view(stored)
    assert view is not None and "summary" not in stored
    assert view["summary"] == audit_summary(bound=0.0, claimed=2.004, confidence=0.95)
    suspect = {**stored, "epsilon_lower_bound": 2.3, "epsilon_claimed": 4.0,
               "epsilon_estimate": 6.6}  # fmt: skip
    assert "Gaussian estimate 6.60" in (result_view(suspect) or {})["summary"]
