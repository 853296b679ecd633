"""The typed plan: it round-trips with the stored JSON, reads old plans, refuses corrupt ones."""

from __future__ import annotations

import ast
import copy
import functools
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsweep.errors import PlanCorrupt
from dpsweep.plan import GridKey, GridPlan, SweepPlan

ROOT = Path(__file__).resolve().parents[2]

finite = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)
optional = st.none() | finite
labels = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)


@st.composite
def grid_plans(draw: st.DrawFn) -> GridPlan:
    plan = GridPlan(
        arm=draw(labels),
        strategy=draw(st.sampled_from(["fixed", "quantile", "online", "bam"])),
        epsilon_budget=draw(finite),
        delta=draw(st.floats(min_value=1e-12, max_value=1e-3)),
        trials=draw(st.integers(1, 10_000)),
        steps_per_trial=draw(st.integers(1, 10_000)),
        sample_rate=draw(st.floats(min_value=1e-6, max_value=1.0)),
        noise_multiplier=draw(finite),
        epsilon_per_trial=draw(finite),
        delta_per_trial=draw(st.floats(min_value=1e-14, max_value=1e-3)),
        epsilon_total=draw(finite),
        epsilon_verified=draw(finite | st.just(math.nan)),
        accounting=draw(st.sampled_from(["compose", "basic", "papernot-steinke"])),
        accountant=draw(st.sampled_from(["pld", "dp-rdp"])),
        verified_by=draw(st.sampled_from(["dp-rdp", "prv", "unverified"])),
        release=draw(st.sampled_from(["all", "selected-only"])),
        gradient_noise_multiplier=draw(finite),
        retries=draw(st.integers(0, 5)),
        input_scaling=draw(st.none() | st.just({"method": "minmax", "clip": [0.0, 1.0]})),
        count_noise=draw(optional),
        warnings=tuple(draw(st.lists(st.text(max_size=20), max_size=2))),
        n_train=draw(st.none() | st.integers(1, 10**6)),
        n_eval=draw(st.none() | st.integers(1, 10**6)),
        distribution_shape=draw(st.none() | finite | st.just(math.inf)),
        eval_mode=draw(st.sampled_from(["carve-out", "public", "dp"])),
        eval_releases=draw(st.integers(0, 20)),
        eval_noise_multiplier=draw(optional),
        epsilon_eval=draw(optional),
        engine_path=draw(st.sampled_from([None, "packed", "generic", "auto"])),
    )
    if draw(st.booleans()):
        plan = plan.stored(
            planned_trials=draw(st.integers(0, 10_000)),
            charges={"epsilon": ["0.5", "1"], "delta": ["0", "1e-6"], "whole_grid": False},
            dataset_sha256=draw(st.none() | st.just("ab" * 32)),
        )
    return plan


def _same(a: GridPlan, b: GridPlan) -> bool:
    # NaN (an unverified epsilon) is never == itself: compare the JSON texts instead.
    return json.dumps(a.to_stored()) == json.dumps(b.to_stored())


@settings(max_examples=150, deadline=None)
@given(st.lists(grid_plans(), min_size=1, max_size=4))
def test_a_plan_round_trips_through_its_stored_json(grids: list[GridPlan]) -> None:
    stored = json.loads(json.dumps(SweepPlan(grids).to_stored()))
    back = SweepPlan.from_stored(stored)
    assert len(back) == len(grids)
    assert all(_same(a, b) for a, b in zip(back, grids, strict=True))
    assert back.to_stored() == stored or any(math.isnan(g.epsilon_verified) for g in grids)


@given(labels, finite)
def test_a_grid_key_is_its_stored_string(arm: str, level: float) -> None:
    key = GridKey(arm, level)
    assert str(key) == f"{arm}@{level:g}"
    assert str(GridKey.parse(str(key))) == str(key)


def test_a_grid_key_that_is_no_key_is_refused() -> None:
    for text in ("fixed", "@1", "fixed@x"):
        with pytest.raises(ValueError):
            GridKey.parse(text)


def _planned() -> list[dict[str, Any]]:
    """A real planned sweep's stored plan (a fresh copy: tests change it)."""
    return copy.deepcopy(_planned_once())


@functools.cache
def _planned_once() -> list[dict[str, Any]]:
    # Planning the demo takes seconds: once per session is enough.
    from dpsweep.spec import load_spec
    from sweeper.privacy.charges import charge_schedule
    from sweeper.sweeps.planning import plan_sweep

    plan = plan_sweep(load_spec(ROOT / "examples" / "demo.yaml"))
    return SweepPlan(
        [
            g.stored(
                planned_trials=g.trials,
                charges=charge_schedule(g).to_json(),
                dataset_sha256=plan.dataset_sha256,
            )
            for g in plan
        ]
    ).to_stored()


def test_a_real_plan_round_trips_byte_for_byte() -> None:
    stored = json.loads(json.dumps(_planned()))
    again = SweepPlan.from_stored(stored).to_stored()
    assert json.dumps(again) == json.dumps(stored)
    for d in stored:
        assert d["grid"] == f"{d['arm']}@{d['epsilon_budget']:g}"


def test_plans_stored_before_newer_fields_load_with_their_defaults() -> None:
    stored = _planned()[0]
    old = {k: v for k, v in stored.items() if k not in ("eval_mode", "engine_path", "verifier")}
    old["a_field_since_dropped"] = 1
    g = GridPlan.from_stored(old)
    assert g.eval_mode == "carve-out" and g.engine_path is None and g.verifier == ""
    assert g.noise_multiplier == stored["noise_multiplier"]


@pytest.mark.parametrize(
    "change",
    [
        {"noise_multiplier": None},  # a required figure missing
        {"noise_multiplier": "lots"},
        {"trials": 2.5},
        {"grid": "another@1"},  # a key that is not its arm and level
    ],
)
def test_a_corrupt_stored_plan_is_refused(change: dict[str, Any]) -> None:
    stored = _planned()
    bad = dict(stored[0])
    for k, v in change.items():
        if v is None:
            del bad[k]
        else:
            bad[k] = v
    with pytest.raises(PlanCorrupt):
        SweepPlan.from_stored([bad, *stored[1:]])


def test_a_plan_finds_its_grids_by_key() -> None:
    plan = SweepPlan.from_stored(_planned())
    first = plan.grids[0]
    assert plan.grid(first.key) is first and plan.grid(str(first.key)) is first
    with pytest.raises(KeyError):
        plan.grid("nope@1")


def test_the_apis_plan_schema_is_derived_from_the_plan() -> None:
    """The dry run's ``PlanGrid`` shows fields of :class:`GridPlan` only (besides its
    reservation), each of the plan's type (or that type or null: what the API leaves out),
    and :meth:`PlanGrid.of` copies each one from a real plan."""
    from decimal import Decimal

    from api.schemas import PlanGrid

    own = {"epsilon_reserved", "delta_reserved"}
    plan_fields = GridPlan.__pydantic_fields__
    assert set(PlanGrid.model_fields) - own <= set(plan_fields)
    for name, f in PlanGrid.model_fields.items():
        if name in own:
            continue
        typ = plan_fields[name].annotation
        allowed = {typ, typ | None, list[str] if typ == tuple[str, ...] else typ}
        assert f.annotation in allowed, (name, f.annotation, typ)
    g = SweepPlan.from_stored(_planned()).grids[0]
    shown = PlanGrid.of(g, epsilon_reserved=Decimal("0.5"), delta_reserved=Decimal("1e-6"))
    stored = g.to_stored()
    for name in set(PlanGrid.model_fields) - own - {"gradient_noise_multiplier", "warnings"}:
        assert getattr(shown, name) == stored[name], name
    assert shown.warnings == list(g.warnings)
    assert shown.gradient_noise_multiplier == (g.gradient_noise_multiplier or None)


# Records of other kinds with keys of the same names: a model card's JSON (rendered, and
# re-checked), and the sweep composition's canonical input (the stored form, hashed).
NOT_THE_PLAN = {
    ("sweeper/artifacts/card_markdown.py", "g.get('verified_by')"),
    ("sweeper/artifacts/card_markdown.py", "p['noise_multiplier']"),
    ("sweeper/artifacts/card_markdown.py", "p['sample_rate']"),
    ("sweeper/artifacts/recheck.py", "ev.get('eval_noise_multiplier')"),
    ("sweeper/privacy/releases.py", "g['epsilon_total']"),
}


def test_readers_of_the_stored_plan_use_the_typed_plan() -> None:
    """No module indexes a stored plan's grids by string key: each reads it once, typed."""
    readers = [
        "sweeper/sweeps/create.py",
        "sweeper/driver/held_sweep.py",
        "sweeper/driver/liveness.py",
        "workers/plan_check.py",
        "sweeper/sweeps/summary.py",
        "sweeper/sweeps/stored.py",
        "sweeper/sweeps/trial_detail.py",
        "sweeper/sweeps/sweep_pages.py",
        "sweeper/sweeps/export.py",
        "sweeper/artifacts/cards.py",
        "sweeper/artifacts/recheck.py",
        "sweeper/audits/prepare.py",
        "sweeper/privacy/releases.py",
        "api/cli/run.py",
        "api/cli/plan_view.py",
        "sweeper/artifacts/card_markdown.py",
        "api/routes/sweeps.py",
    ]
    # Names that only a grid plan has (``arm`` or ``trials`` are also keys of other records).
    grid_fields = {
        "noise_multiplier",
        "steps_per_trial",
        "sample_rate",
        "epsilon_total",
        "epsilon_per_trial",
        "delta_per_trial",
        "gradient_noise_multiplier",
        "planned_trials",
        "charges",
        "verified_by",
        "eval_noise_multiplier",
        "dataset_sha256",
        "release",
    }
    bad = []
    for path in readers:
        tree = ast.parse((ROOT / path).read_text())
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key = node.slice.value
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                key = node.args[0].value
            if key in grid_fields and (path, ast.unparse(node)) not in NOT_THE_PLAN:
                bad.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, bad


def test_the_plan_is_part_of_the_light_contract() -> None:
    """Reading a stored plan pulls in none of the server's packages (workers read it too)."""
    heavy = ["api", "fastapi", "numpy", "ray", "sqlalchemy", "sweeper", "torch", "workers"]
    code = (
        "import sys; from dpsweep.plan import SweepPlan; SweepPlan.from_stored([]); "
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}); "
        "assert not bad, bad"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
