"""The plan's public fields, declared once (dpsweep/plan_fields.py), and the views of it."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings

from dpsweep.plan import GridPlan
from dpsweep.plan_fields import (
    CLI,
    DRY_RUN,
    PUBLIC_PLAN_FIELDS,
    SUMMARY,
    public_fields,
    public_view,
)
from tests.dpsweep.test_plan import grid_plans

# What a grid plan keeps inside: the second accountant's error bars, a papernot-steinke grid's
# shape of its number of runs, and what storing the sweep adds (stored runs, the charge
# schedule, the key, the records' hash). No view may show one.
INSIDE = {
    "verifier",
    "epsilon_verified_lower",
    "epsilon_verified_upper",
    "distribution_shape",
    "planned_trials",
    "charges",
    "grid",
    "dataset_sha256",
}


def test_every_public_field_is_a_plan_field_and_none_is_kept_inside() -> None:
    names = [f.name for f in PUBLIC_PLAN_FIELDS]
    assert len(names) == len(set(names))
    plan_fields = {f.name for f in dataclasses.fields(GridPlan)}
    assert set(names) <= plan_fields
    assert plan_fields >= INSIDE and not INSIDE & set(names)
    for f in PUBLIC_PLAN_FIELDS:
        assert f.label and f.views and f.views <= {CLI, SUMMARY, DRY_RUN}, f


@settings(max_examples=50, deadline=None)
@given(grid_plans())
def test_each_view_shows_its_fields_only(plan: GridPlan) -> None:
    for view in (CLI, DRY_RUN):
        assert list(public_view(plan, view)) == [f.name for f in public_fields(view)]
    summary = [f.name for f in public_fields(SUMMARY) if f.name != "trials"]
    shown = public_view(plan, SUMMARY)
    assert list(shown) == [*summary, "trials"] and shown["trials"] == plan.planned_trials
    # A grid that releases only its selected trial keeps its number of runs secret.
    assert list(public_view(plan, SUMMARY, hide_count=True)) == summary


def test_the_api_schema_titles_and_describes_each_field() -> None:
    from api.schemas import PlanGrid

    props = PlanGrid.model_json_schema()["properties"]
    for f in public_fields(DRY_RUN):
        assert props[f.name]["title"] == f.label
        assert props[f.name].get("description") == (f.help or None)
    assert list(props) == [f.name for f in public_fields(DRY_RUN)] + [
        "epsilon_reserved",
        "delta_reserved",
    ]
