"""A run's accounting inputs (one checked value) and the one table of accountant names."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsweep.accountants import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    DEFAULT_RUN_ACCOUNTANT,
    LEGACY_ACCOUNTANTS,
    LEGACY_NAMES,
    PLAN,
    WORKER,
    WORKER_ALIASES,
    resolve,
)
from dpsweep.accounting_inputs import AccountingInputs
from dpsweep.errors import ConfigError, PrivacyError
from dpsweep.plan import GridPlan

positive = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)
names = st.sampled_from(sorted(ACCOUNTANTS)) | st.text(min_size=1, max_size=12).filter(
    lambda s: s.strip() and s not in LEGACY_NAMES
)


@st.composite
def inputs(draw: st.DrawFn) -> AccountingInputs:
    evaluations = draw(st.integers(0, 50))
    return AccountingInputs(
        noise_multiplier=draw(st.none() | positive),
        sample_rate=draw(st.floats(min_value=1e-9, max_value=1.0, exclude_min=True)),
        steps=draw(st.integers(0, 10**6)),
        delta=draw(st.floats(min_value=1e-15, max_value=0.5)),
        eval_noise_multiplier=draw(positive) if evaluations else draw(st.none() | positive),
        evaluations=evaluations,
        accountant=draw(names),
    )


@settings(max_examples=200, deadline=None)
@given(value=inputs())
def test_the_value_round_trips_through_json(value: AccountingInputs) -> None:
    back = AccountingInputs.from_json(value.to_json())
    assert back == value and hash(back) == hash(value)
    # Without releases, an evaluation multiplier protects nothing: it is dropped.
    if not value.evaluations:
        assert value.eval_noise_multiplier is None and value.composed_eval_noise is None


@settings(max_examples=100, deadline=None)
@given(value=inputs(), runs=st.integers(1, 20), sigma=positive)
def test_repeated_runs_and_another_sigma_keep_the_rest(
    value: AccountingInputs, runs: int, sigma: float
) -> None:
    many = value.repeated(runs)
    assert (many.steps, many.evaluations) == (runs * value.steps, runs * value.evaluations)
    assert (many.sample_rate, many.delta, many.accountant) == (
        value.sample_rate,
        value.delta,
        value.accountant,
    )
    assert value.with_noise(sigma).sigma == sigma
    if value.evaluations:
        assert value.composed_eval_noise == pytest.approx(
            value.eval_noise_multiplier / math.sqrt(value.evaluations)  # type: ignore[operator]
        )


def _value(**change: Any) -> AccountingInputs:
    base: dict[str, Any] = dict(noise_multiplier=1.0, sample_rate=0.01, steps=100, delta=1e-5)
    return AccountingInputs(**(base | change))


@pytest.mark.parametrize(
    ("change", "error", "field", "message"),
    [
        ({"sample_rate": 0.0}, ConfigError, "sample_rate", "sample rate must be in"),
        ({"sample_rate": 1.5}, ConfigError, "sample_rate", "sample rate must be in"),
        ({"delta": 1.0}, ConfigError, "privacy.delta", "delta must be in"),
        ({"delta": math.nan}, ConfigError, "privacy.delta", "delta must be in"),
        ({"steps": -1}, ConfigError, "steps", "steps must be"),
        ({"steps": "10"}, ConfigError, "steps", "steps must be a number"),
        ({"delta": True}, ConfigError, "privacy.delta", "delta must be a number"),
        ({"noise_multiplier": "1"}, ConfigError, "noise_multiplier", "must be a number or None"),
        ({"evaluations": -2}, ConfigError, "eval", "eval_releases must be"),
        ({"accountant": ""}, ConfigError, "privacy.accountant", "accountant name is required"),
        ({"accountant": "rdp"}, ConfigError, "privacy.accountant", "legacy accountant name"),
        ({"noise_multiplier": 0.0}, PrivacyError, None, "no finite privacy guarantee"),
        ({"noise_multiplier": math.inf}, PrivacyError, None, "no finite privacy guarantee"),
        ({"evaluations": 3}, PrivacyError, None, "evaluation noise multiplier"),
    ],
)
def test_bad_inputs_are_refused_when_built(
    change: dict[str, Any], error: type[Exception], field: str | None, message: str
) -> None:
    with pytest.raises(error, match=message) as exc:
        _value(**change)
    if field is not None:
        assert getattr(exc.value, "field", None) == field


def test_an_epsilon_needs_the_noise_multiplier() -> None:
    asked = _value(noise_multiplier=None)
    with pytest.raises(ConfigError, match="needs the noise multiplier"):
        asked.library_keywords()
    # No steps: nothing to protect, whatever the multiplier.
    assert _value(steps=0, noise_multiplier=0.0).steps == 0
    with pytest.raises(ConfigError, match="unknown accounting input"):
        AccountingInputs.from_json(_value().to_json() | {"q": 0.1})


# -- the one table of names -----------------------------------------------------------------


def test_one_meaning_per_name() -> None:
    # No canonical name is a legacy one, every legacy name resolves to canonical names only,
    # and each context's alias map is the table read in that context.
    assert not set(ACCOUNTANTS) & set(LEGACY_NAMES)
    for legacy in LEGACY_NAMES.values():
        for target in (legacy.plan, legacy.worker):
            assert target is None or target in ACCOUNTANTS
    assert dict(LEGACY_ACCOUNTANTS) == {
        "prv": "pld",
        "rdp": "dp-rdp",
        "rdp (RepeatAndSelect)": "dp-rdp",
    }
    assert dict(WORKER_ALIASES) == {"prv": "opacus-prv", "rdp": "opacus-rdp"}
    assert DEFAULT_ACCOUNTANT in ACCOUNTANTS and ACCOUNTANTS[DEFAULT_ACCOUNTANT].plannable
    assert DEFAULT_RUN_ACCOUNTANT in ACCOUNTANTS
    for row in ACCOUNTANTS.values():
        assert (row.trial_accountant is not None) == row.plannable
        assert row.trial_accountant is None or row.trial_accountant in ACCOUNTANTS


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from([*ACCOUNTANTS, *LEGACY_NAMES]) | st.text(max_size=16))
def test_resolution_is_idempotent_and_canonical_names_stay(name: str) -> None:
    for context in (PLAN, WORKER):
        once = resolve(name, context)
        assert resolve(once, context) == once
        if name in ACCOUNTANTS or name not in LEGACY_NAMES:
            assert once == name
        elif once != name:
            assert once in ACCOUNTANTS


def _old_plan(accountant: str, accounting: str = "compose") -> dict[str, Any]:
    """A grid plan as an early version stored it (before migration 0010 renamed its names)."""
    return {
        "arm": "fixed",
        "strategy": "fixed",
        "epsilon_budget": 3.0,
        "delta": 1e-5,
        "trials": 4,
        "steps_per_trial": 50,
        "sample_rate": 0.02,
        "noise_multiplier": 1.3,
        "epsilon_per_trial": 1.0,
        "delta_per_trial": 1e-5,
        "epsilon_total": 2.9,
        "epsilon_verified": 2.9,
        "accounting": accounting,
        "accountant": accountant,
        "verified_by": "prv",
        "release": "all",
    }


@pytest.mark.parametrize(
    ("stored", "means"),
    [("rdp", "dp-rdp"), ("prv", "pld"), ("rdp (RepeatAndSelect)", "dp-rdp"), ("pld", "pld")],
)
def test_an_old_stored_plan_reads_back_meaning_what_it_meant(stored: str, means: str) -> None:
    grid = GridPlan.from_stored(_old_plan(stored))
    assert grid.accountant == stored  # the stored name is kept as stored
    run = grid.run_inputs()
    assert run.accountant == means  # and read as a plan's: dp_accounting's accountants
    assert (run.sigma, run.sample_rate, run.steps, run.delta) == (1.3, 0.02, 50, 1e-5)
    assert (run.eval_noise_multiplier, run.evaluations) == (None, 0)


def test_the_docs_show_the_table_itself() -> None:
    """docs/privacy.md's table of names is the one table, rendered (edit the table, not it)."""
    from pathlib import Path

    from dpsweep.accountants import markdown_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "privacy.md").read_text()
    assert markdown_table() in page
