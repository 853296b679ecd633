"""The dashboard reads without a guide (issue 51, item 7), in a real headless Chromium against a
real ``dpsweep serve``:

* the ε front's ticks are the grids' ε levels, linear and log (no 1.5 between levels, no stray
  minor label);
* the calibration front is drawn per ε level, each ringing exactly its level's non-dominated
  trials;
* a finished sweep shows one state badge and how long it took;
* a trial's learning curve has the objective and ECE on two stacked axes, the clipping
  diagnostics in a chart of their own, a loss axis from zero, and a header whose run number is
  the ledger's;
* a budget bar turns amber, then red, as the cap is used up;
* the sign-in field fits a 420 px window.

The server and the finished two-arm sweep are ``test_dashboard``'s fixtures, reused.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tests.api.test_dashboard as _dash
from api.testing.browser import screenshot

pytestmark = pytest.mark.slow

server = _dash.server
token = _dash.token
api = _dash.api
finished = _dash.finished
browser = _dash.browser
page = _dash.page


def _layout(page: Any, selector: str) -> dict[str, Any]:
    return dict(page.evaluate(f"document.querySelector({selector!r}).layout"))


def _traces(page: Any, selector: str) -> list[dict[str, Any]]:
    return list(
        page.evaluate(
            f"""() => document.querySelector({selector!r}).data.map(t => ({{
                role: t.dpRole || null, name: t.name, yaxis: t.yaxis || 'y',
                x: Array.from(t.x || []), y: Array.from(t.y || []),
                customdata: t.customdata ? Array.from(t.customdata) : null}}))"""
        )
    )


def test_epsilon_axis_ticks_are_the_levels(page: Any, finished: dict[str, Any]) -> None:
    levels = sorted({r["epsilon_budget"] for r in finished["results"]})
    assert levels == [1, 4]
    page.goto(f"/sweeps/{finished['id']}")
    page.wait_for_selector("#eps-chart .scatterlayer .trace")
    assert _layout(page, "#eps-chart")["xaxis"]["tickvals"] == levels
    ticks = page.locator("#eps-chart .xtick text").all_text_contents()
    assert ticks == ["1", "4"]  # not 1.5, 2, 2.5, ...
    page.check("#log-eps")
    page.wait_for_function("document.querySelector('#eps-chart').layout.xaxis.type === 'log'")
    page.wait_for_function(
        "Array.from(document.querySelectorAll('#eps-chart .xtick text')).length === 2"
    )
    assert page.locator("#eps-chart .xtick text").all_text_contents() == ["1", "4"]


def test_calibration_fronts_are_per_level(
    page: Any, api: httpx.Client, finished: dict[str, Any]
) -> None:
    page.goto(f"/sweeps/{finished['id']}")
    page.wait_for_selector("#cal-chart .scatterlayer .trace")
    points = api.get(f"/api/v1/sweeps/{finished['id']}/pareto?x=accuracy&y=ece").json()["points"]
    fronts = [t for t in _traces(page, "#cal-chart") if t["role"] == "front"]
    assert [t["name"] for t in fronts] == ["non-dominated at ε 1", "non-dominated at ε 4"]
    for level, front in zip((1, 4), fronts, strict=True):
        mine = [p for p in points if p["epsilon_budget"] == level]
        expected = {
            p["trial"]
            for p in mine
            if not any(
                q is not p
                and q["x"] >= p["x"]
                and q["y"] <= p["y"]
                and (q["x"] > p["x"] or q["y"] < p["y"])
                for q in mine
            )
        }
        assert set(front["customdata"]) == expected and expected
    note = page.inner_text("#cal-card")
    assert "non-dominated within their ε level" in note


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([1.0, 2.0, 8.0]),
            st.floats(0, 1, allow_nan=False),
            st.floats(0, 0.5, allow_nan=False),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_level_fronts_matches_its_definition(
    browser: Any, server: Any, token: str, pts: list[tuple[float, float, float]]
) -> None:
    """levelFronts (the dashboard's own code, run in the browser) against the definition."""
    ctx = browser.new_context(base_url=server.base)
    try:
        pg = ctx.new_page()
        pg.goto("/static/index.html")
        points = [
            {"epsilon_budget": e, "x": x, "y": y, "trial": f"t{i}"}
            for i, (e, x, y) in enumerate(pts)
        ]
        got = pg.evaluate(
            """async (points) => (await import('/static/views/sweep.js')).levelFronts(points)
                .map(([level, f]) => [level, f.map((p) => p.trial)])""",
            points,
        )
    finally:
        ctx.close()
    levels = sorted({p["epsilon_budget"] for p in points})
    assert [g[0] for g in got] == levels
    for level, trials in got:
        mine = [p for p in points if p["epsilon_budget"] == level]
        nd = [
            p
            for p in mine
            if not any(
                q["x"] >= p["x"] and q["y"] <= p["y"] and (q["x"] > p["x"] or q["y"] < p["y"])
                for q in mine
            )
        ]
        assert sorted(trials) == sorted(p["trial"] for p in nd)


def test_a_finished_sweep_has_one_badge_and_a_duration(page: Any, finished: dict[str, Any]) -> None:
    page.goto(f"/sweeps/{finished['id']}")
    page.wait_for_selector("#sweep-duration")
    assert page.locator("#conn-state").is_hidden()  # no second "finished" badge
    assert re.fullmatch(r" in \d+ (s|min \d+ s|h \d+ min)", page.inner_text("#sweep-duration"))
    assert page.locator(".row .badge").count() == 1


def test_trial_page_curves_read_clearly(
    page: Any, api: httpx.Client, finished: dict[str, Any]
) -> None:
    items = api.get(f"/api/v1/sweeps/{finished['id']}/trials", params={"arm": "fixed"})
    trial = next(t for t in items.json()["items"] if t["state"] == "done")
    detail = api.get(f"/api/v1/trials/{trial['id']}").json()
    page.goto(f"/trials/{trial['id']}")
    page.wait_for_selector("#curves-chart .scatterlayer .trace", state="attached")
    curves = _traces(page, "#curves-chart")
    assert [(t["role"], t["yaxis"]) for t in curves] == [("objective", "y"), ("ece", "y2")]
    layout = _layout(page, "#curves-chart")
    assert layout["yaxis"]["range"] == [0, 1]
    top, bottom = layout["yaxis"]["domain"], layout["yaxis2"]["domain"]
    assert bottom[1] < top[0]  # stacked: accuracy and ECE never share an axis
    assert len(page.evaluate("document.querySelector('#curves-chart').data")) == 2
    # Every other evaluation metric (the clipping diagnostics) has a chart of its own.
    metrics = api.get(f"/api/v1/trials/{trial['id']}/metrics").json()["metrics"]
    others = set(metrics) - {"accuracy", "mse", "ece", "mce", "loss"}
    if others:
        page.wait_for_selector("#diagnostics-chart .scatterlayer .trace", state="attached")
        assert {t["name"] for t in _traces(page, "#diagnostics-chart")} == others
    else:
        assert page.locator("#diagnostics-card").is_hidden()
    assert _layout(page, "#loss-chart")["yaxis"]["rangemode"] == "tozero"
    # The header's run number is the ledger's.
    note = next(c["note"] for c in detail["privacy"]["charges"] if c["note"])
    run = re.match(r"run (\d+) of grid", note)
    assert run is not None
    assert f"trial {detail['number']} (run {run.group(1)} of its grid)" in page.inner_text("h1")
    screenshot(page, "trial-curves")


@pytest.mark.parametrize(
    ("committed", "reserved", "level", "colour"),
    [
        (2.0, 0.0, "low", "#2e7d32"),
        (7.5, 0.0, "mid", "#e0a000"),
        (9.0, 0.9, "high", "#c62828"),
    ],
)
def test_budget_bar_colour_follows_what_is_left(
    browser: Any, server: Any, committed: float, reserved: float, level: str, colour: str
) -> None:
    ctx = browser.new_context(base_url=server.base)
    try:
        pg = ctx.new_page()
        pg.goto("/static/index.html")
        got = pg.evaluate(
            """async ([c, r]) => {
                const { bar } = await import('/static/views/datasets.js');
                const el = bar({ epsilon_cap: 10, epsilon_committed: c, epsilon_reserved: r });
                document.body.append(el);
                const span = el.querySelector('span');
                return [el.dataset.used, getComputedStyle(span).backgroundColor];
            }""",
            [committed, reserved],
        )
    finally:
        ctx.close()
    assert got[0] == level
    if level != "low":
        assert _hex(got[1]) == colour


def _hex(css: str) -> str:
    m = re.fullmatch(r"rgba?\((\d+),\s*(\d+),\s*(\d+)(?:,\s*[\d.]+)?\)", css.strip())
    assert m is not None, css
    return "#" + "".join(f"{int(v):02x}" for v in m.groups())


def test_the_token_field_fits_a_narrow_window(browser: Any, server: Any) -> None:
    ctx = browser.new_context(base_url=server.base, viewport={"width": 420, "height": 800})
    try:
        pg = ctx.new_page()
        pg.goto("/signin")
        pg.wait_for_selector("#token")
        box = pg.locator("#token").bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 420
        assert pg.evaluate("document.documentElement.scrollWidth") <= 420
        screenshot(pg, "signin-420")
    finally:
        ctx.close()
