"""The web dashboard in a real headless Chromium, against a real ``dpsweep serve``.

The module starts one server (SQLite, auth on, one Ray worker) with a finished sweep and a
running one, and drives the pages the way a user would: sign in, the sweeps list, the fronts
(counted from the charts' own data), clicking a point, the trial page's reliability diagram,
live progress without reload, the trials table, datasets and upload, the dry run and submit,
and cancel. Screenshots land in ``test-artifacts/dashboard/``.
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from api.testing.browser import chromium, screenshot
from api.testing.server import Server, start_server
from dpsweep.plan_fields import plan_field
from sweeper.store.engine import make_engine
from sweeper.store.tokens import create_token, revoke_token
from tests.sweeper.sweeps.test_public_tuning import _spec as tuned_spec

pytestmark = pytest.mark.slow


FINISHED_SPEC = """\
name: dash-finished
dataset: {name: digits}
model: {name: mlp}
training: {epochs: 1, batch_size: 128, eval_every: 4}
privacy: {budgets: [1, 4], delta: 1.0e-5, accounting: basic}
arms:
  - strategy: fixed
    grid: {lr: [0.5, 1.0], clip: [1.0]}
  - strategy: quantile
    grid: {lr: [1.0], target_quantile: [0.5]}
    params: {clip_init: 0.1, clip_lr: 0.2}
"""

# Big enough to still be running while the tests look at it (one Ray worker, one trial per
# pack, so "done" moves one trial at a time); the cancel test ends it.
RUNNING_SPEC = """\
name: dash-running
dataset: {name: digits}
model: {name: cnn}
training: {epochs: 4, batch_size: 128, eval_every: 10}
privacy: {budgets: [240], delta: 1.0e-5, accounting: basic}
arms:
  - strategy: fixed
    grid: {lr: {logspace: [-1, 0], k: 4}, clip: [0.5, 2.0]}
seeds: 15
"""

YAML = {"Content-Type": "application/yaml"}


def _wait_state(
    c: httpx.Client, sid: str, states: set[str], timeout: float = 300
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        s = c.get(f"/api/v1/sweeps/{sid}").json()
        if s["state"] in states:
            return s
        if time.monotonic() > deadline:
            raise AssertionError(f"sweep {sid} still {s['state']} after {timeout} s")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("dashboard")
    url = f"sqlite:///{work / 'dash.db'}"
    srv = start_server(
        url, work, workers=1, env={"DPSWEEP_DRAIN_SECONDS": "1", "DPSWEEP_MAX_PACK_SIZE": "1"}
    )
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def token(server: Server) -> str:
    return server.token("alice")


@pytest.fixture(scope="module")
def api(server: Server, token: str) -> Iterator[httpx.Client]:
    with server.client(token) as c:
        yield c


@pytest.fixture(scope="module")
def finished(api: httpx.Client) -> dict[str, Any]:
    r = api.post("/api/v1/sweeps", content=FINISHED_SPEC, headers=YAML)
    assert r.status_code == 201, r.text
    return _wait_state(api, r.json()["id"], {"done"})


@pytest.fixture(scope="module")
def running(api: httpx.Client, finished: dict[str, Any]) -> Iterator[dict[str, Any]]:
    r = api.post("/api/v1/sweeps", content=RUNNING_SPEC, headers=YAML)
    assert r.status_code == 201, r.text
    s = _wait_state(api, r.json()["id"], {"running"}, timeout=120)
    yield s
    # Free the cores for whatever runs next (the test that cancels it may not have run).
    api.post(f"/api/v1/sweeps/{s['id']}/cancel")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any, server: Server, token: str) -> Iterator[Any]:
    """A signed-in tab (the token in this session's storage, as sign-in leaves it)."""
    ctx = browser.new_context(
        base_url=server.base, viewport={"width": 1280, "height": 900}, accept_downloads=True
    )
    ctx.add_init_script(f"sessionStorage.setItem('dpsweep.token', {token!r})")
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def _chart(page: Any, selector: str) -> list[dict[str, Any]]:
    """The traces a chart was drawn with (Plotly keeps them on the element)."""
    return list(
        page.evaluate(
            f"""() => document.querySelector({selector!r}).data.map(t => ({{
                role: t.dpRole, name: t.name, x: Array.from(t.x),
                customdata: t.customdata ? Array.from(t.customdata) : null}}))"""
        )
    )


# ---------------------------------------------------------------------------------------------


def test_sign_in_rejects_a_bad_token_and_401_returns_to_it(
    browser: Any, server: Server, finished: dict[str, Any]
) -> None:
    ctx = browser.new_context(base_url=server.base, viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    try:
        pg.goto("/sweeps?state=done")
        pg.wait_for_url(lambda u: "/signin?next=" in u)
        pg.fill("#token", "dps_000000000000_not-a-real-token")
        pg.click("#signin-form button[type=submit]")
        pg.wait_for_selector("#signin-error:not([hidden])")
        assert "not accepted" in pg.inner_text("#signin-error")
        assert pg.evaluate("sessionStorage.getItem('dpsweep.token')") is None
        screenshot(pg, "signin-rejected")

        engine = make_engine(server.db_url)
        try:
            secret, info = create_token(engine, name="bob")
            pg.fill("#token", secret)
            pg.click("#signin-form button[type=submit]")
            # Back where the user was going, filters included.
            pg.wait_for_url(lambda u: u.endswith("/sweeps?state=done"))
            pg.wait_for_selector("#sweeps-status")
            assert pg.inner_text("#who") == "bob"
            # bob sees none of alice's sweeps.
            pg.wait_for_function(
                "document.querySelector('#sweeps-status').textContent.includes('No sweeps')"
            )
            revoke_token(engine, info.id)
        finally:
            engine.dispose()
        pg.click("a[data-nav=datasets]")
        pg.wait_for_url(lambda u: u.endswith("/signin?next=%2Fdatasets"))
        assert pg.evaluate("sessionStorage.getItem('dpsweep.token')") is None
    finally:
        ctx.close()


def test_sweeps_list_shows_both_sweeps(
    page: Any, api: httpx.Client, finished: dict[str, Any], running: dict[str, Any]
) -> None:
    page.goto("/")
    for s in (finished, running):
        page.wait_for_selector(f"#sweeps-table tr[data-sweep='{s['id']}']")
    row = page.locator(f"tr[data-sweep='{finished['id']}']")
    assert row.get_attribute("data-state") == "done"
    item = next(i for i in api.get("/api/v1/sweeps").json()["items"] if i["id"] == finished["id"])
    total = sum(item["trials"].values())
    assert f"{item['trials']['done']} done" in row.inner_text()
    assert f"of {total}" in row.inner_text()
    assert {b["arm"] for b in item["best"]} == {"fixed", "quantile"}
    assert "1, 4" in row.inner_text()
    screenshot(page, "sweeps")

    # The state filter lives in the URL and narrows the rows.
    page.select_option("#state-filter", "done")
    page.wait_for_function("location.search.includes('state=done')")
    page.wait_for_selector(f"tr[data-sweep='{running['id']}']", state="detached")
    page.fill("#sweep-search", "no-such-sweep")
    page.wait_for_function(
        "document.querySelector('#sweeps-status').textContent.includes('No sweep matches')"
    )


def test_pareto_front_has_one_point_per_strategy_and_level(
    page: Any, api: httpx.Client, finished: dict[str, Any]
) -> None:
    sid = finished["id"]
    page.goto(f"/sweeps/{sid}")
    page.wait_for_selector("#eps-chart .scatterlayer .trace")
    page.wait_for_selector("#cal-chart .scatterlayer .trace")
    traces = _chart(page, "#eps-chart")
    arms = [t for t in traces if t["role"] == "arm"]
    pairs = {(t["name"], x) for t in arms for x in t["x"]}
    expected = {(r["arm"], r["epsilon_budget"]) for r in finished["results"]}
    assert len(expected) == 4
    assert sum(len(t["x"]) for t in arms) == len(pairs) == 4
    assert pairs == expected
    front = next(t for t in traces if t["role"] == "front")
    api_front = api.get(f"/api/v1/sweeps/{sid}/pareto?x=epsilon").json()["points"]
    assert len(front["x"]) == sum(not p["dominated"] for p in api_front) >= 1
    # Rendered, not just configured: one marker per point in the SVG.
    assert page.locator("#eps-chart .scatterlayer .trace").first.locator(".point").count() == 2

    cal = _chart(page, "#cal-chart")
    done = finished["trials"]["done"]
    assert sum(len(t["x"]) for t in cal if t["role"] == "trials") == done
    screenshot(page, "sweep-fronts")

    # The log-ε toggle is part of the URL: a reload keeps it.
    page.check("#log-eps")
    page.wait_for_function("location.search.includes('log=1')")
    page.wait_for_function("document.querySelector('#eps-chart').layout.xaxis.type === 'log'")
    page.reload()
    page.wait_for_selector("#eps-chart .scatterlayer .trace")
    assert page.is_checked("#log-eps")


def test_clicking_points_opens_trials_with_reliability_diagram(
    page: Any, api: httpx.Client, finished: dict[str, Any]
) -> None:
    sid = finished["id"]
    page.goto(f"/sweeps/{sid}")
    page.wait_for_selector("#eps-chart .scatterlayer .trace .point")
    # The ε front: a point opens its configuration's best trial.
    arms = [t for t in _chart(page, "#eps-chart") if t["role"] == "arm"]
    page.locator("#eps-chart .scatterlayer .trace").first.locator(".point").first.click(force=True)
    page.wait_for_url("**/trials/*")
    assert page.url.rsplit("/", 1)[1] == arms[0]["customdata"][0]

    page.go_back()
    page.wait_for_selector("#cal-chart .scatterlayer .trace .point")
    cal = [t for t in _chart(page, "#cal-chart") if t["role"] == "trials"]
    page.locator("#cal-chart .scatterlayer .trace").first.locator(".point").first.click(force=True)
    page.wait_for_url("**/trials/*")
    trial_id = page.url.rsplit("/", 1)[1]
    assert trial_id == cal[0]["customdata"][0]

    detail = api.get(f"/api/v1/trials/{trial_id}").json()
    bins = [b for b in detail["reliability"] if b["count"] > 0]
    assert bins
    page.wait_for_selector("#reliability-chart .barlayer .point")
    assert page.locator("#reliability-chart .barlayer .point").count() == len(bins)
    page.wait_for_selector("#curves-chart .scatterlayer .trace")
    page.wait_for_selector("#traj-chart .scatterlayer .trace", state="attached")
    assert page.locator("#traj-chart .scatterlayer .trace").count() == 2  # C_t and lr
    assert page.locator("#ledger-table tbody tr").count() == len(detail["privacy"]["charges"])
    screenshot(page, "trial")


def test_running_sweep_progress_advances_without_reload(
    page: Any, api: httpx.Client, running: dict[str, Any]
) -> None:
    sid = running["id"]
    page.goto(f"/sweeps/{sid}")
    page.wait_for_selector("#sweep-progress .progress")
    page.wait_for_selector("#conn-state[data-state=live]", timeout=30_000)
    page.evaluate("window.__sameDocument = true")
    first = int(page.get_attribute("#sweep-progress .progress", "data-done"))
    page.wait_for_function(
        f"Number(document.querySelector('#sweep-progress .progress').dataset.done) > {first}",
        timeout=120_000,
    )
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
    now = api.get(f"/api/v1/sweeps/{sid}").json()["trials"]["done"]
    assert now > first
    screenshot(page, "sweep-running")


def test_polling_fallback_when_the_events_stream_is_blocked(
    page: Any, running: dict[str, Any]
) -> None:
    """A proxy that drops the event stream: the page says so, polls, and still advances."""
    sid = running["id"]
    page.route("**/api/v1/sweeps/*/events*", lambda route: route.abort())
    page.goto(f"/sweeps/{sid}")
    page.wait_for_selector("#conn-state[data-state=reconnecting]", timeout=30_000)
    page.wait_for_selector("#conn-state[data-state=polling]", timeout=30_000)
    first = int(page.get_attribute("#sweep-progress .progress", "data-done"))
    page.wait_for_function(
        f"Number(document.querySelector('#sweep-progress .progress').dataset.done) > {first}",
        timeout=120_000,
    )


def test_cancel_button_confirms_then_cancels(
    page: Any, api: httpx.Client, running: dict[str, Any]
) -> None:
    sid = running["id"]
    page.goto(f"/sweeps/{sid}")
    page.wait_for_selector("#cancel-sweep:not([hidden])")
    page.click("#cancel-sweep")
    assert page.is_visible("#confirm")
    page.click("#confirm-yes")
    page.wait_for_selector("#cancel-result, .error", timeout=60_000)
    assert page.locator("#cancel-result").count() == 1, page.inner_text("main")
    assert api.get(f"/api/v1/sweeps/{sid}").json()["state"] == "cancelled"
    page.wait_for_selector("#sweep-name + span [data-state=cancelled]")
    assert page.is_hidden("#cancel-sweep")


def test_trials_table_filters_columns_sort_and_csv(
    page: Any, api: httpx.Client, finished: dict[str, Any]
) -> None:
    sid = finished["id"]
    page.goto(f"/sweeps/{sid}?tab=trials")
    page.wait_for_selector("#trials-table tbody tr")
    total = sum(finished["trials"].values())
    page.wait_for_function(
        f"document.querySelectorAll('#trials-table tbody tr').length === {total}"
    )
    page.select_option("#f-arm", "quantile")
    page.wait_for_function("location.search.includes('arm=quantile')")
    quantile = [
        t
        for t in api.get(f"/api/v1/sweeps/{sid}/trials?arm=quantile").json()["items"]
        if t["arm"] == "quantile"
    ]
    page.wait_for_function(
        f"document.querySelectorAll('#trials-table tbody tr').length === {len(quantile)}"
    )
    page.select_option("#f-arm", "")
    page.wait_for_function(
        f"document.querySelectorAll('#trials-table tbody tr').length === {total}"
    )
    # Sort by the objective, descending (two clicks), and show the seed column.
    page.click("#trials-table th[data-col=objective]")
    page.click("#trials-table th[data-col=objective]")
    page.wait_for_function("location.search.includes('tdir=desc')")
    page.click("details.chooser summary")
    page.check("#column-chooser input[value=seed]")
    page.wait_for_selector("#trials-table th[data-col=seed]")
    best = max(
        (t for t in api.get(f"/api/v1/sweeps/{sid}/trials").json()["items"]),
        key=lambda t: t["objective"],
    )
    assert page.get_attribute("#trials-table tbody tr", "data-trial") == best["id"]
    screenshot(page, "sweep-trials")

    with page.expect_download() as dl:
        page.click("#export-csv")
    text = Path(dl.value.path()).read_text()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == total
    assert rows[0]["id"] == best["id"]
    assert "seed" in rows[0] and "lr" in rows[0]

    # The URL reproduces the view: same columns and order in a fresh tab.
    url = page.url
    page.goto(url)
    page.wait_for_selector("#trials-table th[data-col=seed]")
    page.wait_for_function(
        f"document.querySelector('#trials-table tbody tr')?.dataset.trial === {best['id']!r}"
    )


def test_plan_and_budget_panel_matches_the_stored_plan(
    page: Any, api: httpx.Client, finished: dict[str, Any]
) -> None:
    page.goto(f"/sweeps/{finished['id']}?tab=plan")
    page.wait_for_selector("#plan-table tbody tr")
    rows = page.locator("#plan-table tbody tr")
    assert rows.count() == len(finished["plan"])
    g = finished["plan"][0]
    text = rows.first.inner_text()
    assert g["arm"] in text and str(g["steps_per_trial"]) in text
    # The headers are the plan's public fields as the API's schema titles and describes them:
    # the one declaration (dpsweep/plan_fields.py) the CLI's table shows too.
    schema = api.get("/openapi.json").json()["components"]["schemas"]["PlanGrid"]["properties"]
    for name in ("epsilon_budget", "noise_multiplier", "epsilon_verified"):
        head = page.locator(f"#plan-table th[data-field={name}]")
        assert head.inner_text() == schema[name]["title"] == plan_field(name).label
        assert head.get_attribute("title") == schema[name]["description"]
    assert "ε charged" in page.inner_text("#sweep-budget")
    # One ε per release, each saying what it covers, and the evaluation statement.
    privacy = finished["privacy"]
    card = page.locator("#privacy-releases")
    releases = len(privacy["grids"]) + sum(
        privacy[k] is not None for k in ("sweep", "dataset_lifetime")
    )
    assert card.locator("tbody tr").count() == releases
    card_text = card.inner_text()
    assert "whole sweep" in card_text and "dataset lifetime (spent)" in card_text
    assert privacy["evaluation"]["statement"] == page.inner_text("#evaluation-statement")
    assert "single-run ε" in card_text
    screenshot(page, "sweep-plan")


def test_datasets_page_and_upload(page: Any, api: httpx.Client, tmp_path: Path) -> None:
    page.goto("/datasets")
    page.wait_for_selector("#datasets-table tr[data-dataset=digits]")
    lines = ["a,b,c,label"] + [f"{i % 7},{i % 5},{i % 3},{i % 2}" for i in range(60)]
    f = tmp_path / "toy.csv"
    f.write_text("\n".join(lines) + "\n")
    page.set_input_files("#up-file", str(f))
    page.fill("#up-name", "toy")
    page.fill("#up-label", "label")
    page.fill("#up-eps", "5")
    page.click("#upload-form button[type=submit]")
    page.wait_for_selector("#upload-result .info")
    uploaded = next(d for d in api.get("/api/v1/datasets").json()["items"] if d["name"] == "toy")
    row = page.locator(f"#datasets-table tr[data-dataset='{uploaded['id']}']")
    row.wait_for()
    assert "5" in row.inner_text() and row.locator(".bar.budget").count() == 1
    assert uploaded["budget"]["epsilon_cap"] == 5.0
    # A bad upload explains itself and stores nothing.
    page.set_input_files("#up-file", str(f))
    page.fill("#up-label", "nope")
    page.click("#upload-form button[type=submit]")
    page.wait_for_selector("#upload-result .error")
    assert "label" in page.inner_text("#upload-result .error")
    names = [d["name"] for d in api.get("/api/v1/datasets").json()["items"]]
    assert names.count("toy") == 1
    screenshot(page, "datasets")


def test_dry_run_shows_public_pre_tuning(page: Any, api: httpx.Client) -> None:
    """An arm with tune_on: the dry run's plan says where it was tuned, the best point there
    and the private grid centred on it, as the API's plan does."""
    pytest.importorskip("mnist1d")
    spec = yaml.safe_dump(tuned_spec(tune_on="mnist1d-test"))
    page.goto("/submit")
    page.fill("#spec", spec)
    page.click("#plan-btn")
    page.wait_for_selector("#plan-result #tuning-table tbody tr")
    (grid,) = api.post("/api/v1/sweeps:plan", content=spec, headers=YAML).json()["grids"]
    row = page.inner_text("#tuning-table tbody tr")
    assert "mnist1d-test" in row
    assert f"lr={grid['tuned_params']['lr']:.4g}" in row.replace(" ", "")
    assert "lr:" in row and "clip:" in row  # the centred grid's axes


def test_dry_run_shows_the_plan_and_submit_then_cancel(page: Any, api: httpx.Client) -> None:
    before = len(api.get("/api/v1/sweeps").json()["items"])
    page.goto("/submit")
    page.fill("#spec", "name: x\narms: []\n")
    page.click("#plan-btn")
    page.wait_for_selector("#plan .error")
    assert page.is_disabled("#submit-btn")

    spec = FINISHED_SPEC.replace("dash-finished", "dash-submitted")
    page.fill("#spec", spec)
    page.click("#plan-btn")
    page.wait_for_selector("#plan-result #plan-table tbody tr")
    plan = api.post("/api/v1/sweeps:plan", content=spec, headers=YAML).json()
    assert page.locator("#plan-table tbody tr").count() == len(plan["grids"]) == 4
    assert len(api.get("/api/v1/sweeps").json()["items"]) == before  # a dry run stores nothing
    screenshot(page, "submit-plan")

    page.click("#submit-btn")
    page.wait_for_url("**/sweeps/*")
    sid = page.url.rsplit("/", 1)[1]
    assert api.get(f"/api/v1/sweeps/{sid}").json()["name"] == "dash-submitted"
    page.wait_for_selector("#cancel-sweep:not([hidden])")
    # Cancel asks first; "Keep it" changes nothing.
    page.click("#cancel-sweep")
    page.click("#confirm-no")
    assert api.get(f"/api/v1/sweeps/{sid}").json()["state"] in ("pending", "running")
    api.post(f"/api/v1/sweeps/{sid}/cancel")


def test_pages_and_assets_are_served_offline(server: Server, token: str) -> None:
    """Every page path serves the one page; assets come from the package, none from a CDN."""
    with httpx.Client(base_url=server.base) as c:
        index = c.get("/")
        assert index.status_code == 200 and "text/html" in index.headers["content-type"]
        for path in ("/sweeps", "/sweeps/abc", "/trials/abc", "/datasets", "/submit", "/signin"):
            assert c.get(path).text == index.text
        for src in ("/static/app.js", "/static/vendor/plotly-basic-4.1.1.min.js"):
            assert c.get(src).status_code == 200
        assert "://" not in index.text.replace("http://www.w3.org", "")
        # The page is not part of the API: API 404s stay problem+json, and no page is in
        # the OpenAPI document.
        r = c.get("/api/v1/nothing-here")
        assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
        paths = c.get("/openapi.json").json()["paths"]
        assert "/" not in paths and "/api/v1/me" in paths
        assert c.get("/api/v1/me").status_code == 401
        me = c.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).json()
        assert me == {"name": "alice", "admin": False, "auth": True}
