"""Data owners and analysts in the dashboard, in a real headless Chromium against a real
``dpsweep serve`` (the harness of ``test_dashboard``: one server for this module).

The owner (alice) uploads a CSV, opens it on the datasets page, grants an analyst through the
Grants form and sets the analyst policy; the analyst's small DP-evaluated sweep runs; the
owner's audit panel lists its trial releases with the analyst as principal; the analyst, signed
in, sees their allowance bar at the ε the API reports, the public description and their modes,
and no Grants panel; the owner revokes the grant from the page, and the row says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

import tests.api.test_dashboard as _dash
from api.testing.browser import screenshot
from api.testing.server import Server

pytestmark = pytest.mark.slow

# The harness of test_dashboard, bound here so that pytest finds the fixtures (each with this
# module's own scope): a server (auth on, one worker), alice's token and client, the browser
# and a tab signed in as alice.
server = _dash.server
token = _dash.token
api = _dash.api
browser = _dash.browser
page = _dash.page

ANALYST = "ana"


@pytest.fixture(scope="module")
def dataset(api: httpx.Client) -> str:
    """alice's upload: 300 rows, 4 features, 2 classes, ε cap 20."""
    rng = np.random.default_rng(0)
    x = np.round(rng.normal(size=(300, 4)), 3)
    y = (x[:, 0] > 0).astype(int)
    lines = ["a,b,c,d,label"] + [
        ",".join(repr(float(v)) for v in row) + f",{t}" for row, t in zip(x, y, strict=True)
    ]
    r = api.post(
        "/api/v1/datasets",
        files={"file": ("owned.csv", "\n".join(lines) + "\n", "text/csv")},
        data={"label_column": "label", "epsilon_cap": "20", "name": "owned"},
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


@pytest.fixture(scope="module")
def analyst_token(server: Server) -> str:
    return server.token(ANALYST)


@pytest.fixture(scope="module")
def analyst_api(server: Server, analyst_token: str) -> Iterator[httpx.Client]:
    with server.client(analyst_token) as c:
        yield c


def _signed_in(browser: Any, server: Server, tok: str) -> tuple[Any, Any, list[str]]:
    ctx = browser.new_context(base_url=server.base, viewport={"width": 1280, "height": 900})
    ctx.add_init_script(f"sessionStorage.setItem('dpsweep.token', {tok!r})")
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    return ctx, pg, errors


def test_owner_grants_sets_policy_reads_the_audit_log_and_revokes_analyst_sees_allowance(
    page: Any,
    browser: Any,
    server: Server,
    api: httpx.Client,
    analyst_api: httpx.Client,
    analyst_token: str,
    dataset: str,
) -> None:
    # The owner opens the dataset from the list.
    page.goto("/datasets")
    page.wait_for_selector("#datasets-table tr[data-dataset=digits]")
    assert page.locator("#datasets-table tr[data-dataset=digits] a.open-dataset").count() == 0
    page.click(f"#datasets-table tr[data-dataset='{dataset}'] a.open-dataset")
    page.wait_for_selector("#dataset-detail[data-role=owner] #grant-form")
    page.wait_for_selector("#grants-empty")  # loaded after the panel appears

    # Nothing declared yet: the grant is refused, saying what to declare; the policy panel
    # shows the counts as undeclared and declares them in one click.
    page.fill("#grant-analyst", ANALYST)
    page.fill("#grant-eps", "3")
    page.fill("#grant-note", "pilot study")
    page.click("#grant-form button[type=submit]")
    page.wait_for_selector("#grant-result .error")
    assert "declare" in page.inner_text("#grant-result")
    page.wait_for_selector("#declared-facts tr[data-fact=n_examples][data-declared=false]")
    assert "300" in page.inner_text("#declared-facts tr[data-fact=n_examples]")
    page.click("#declare-counted")
    page.wait_for_selector("#facts-declared")
    assert page.locator("#declared-facts tr[data-declared=true]").count() == 3
    assert api.get(f"/api/v1/datasets/{dataset}/policy").json()["view"]["declared"] == [
        "n_examples",
        "classes",
        "input_shape",
    ]
    # Grant through the form: the row shows the allowance, nothing used yet.
    page.click("#grant-form button[type=submit]")
    row = page.locator(f"#grants-table tr[data-analyst={ANALYST}][data-active=true]")
    row.wait_for()
    assert "3" in row.inner_text() and "pilot study" in row.inner_text()
    assert row.locator(".used").inner_text() == "0"
    (g,) = api.get(f"/api/v1/datasets/{dataset}/grants").json()["items"]
    assert g["analyst"] == ANALYST and g["epsilon_allowance"] == 3 and g["active"]

    # The policy: DP evaluation only; checking carve-out emphasises its warning.
    page.wait_for_selector("#policy-form")
    assert page.is_checked("#mode-public") and page.is_checked("#mode-dp")
    assert not page.is_checked("#mode-carve-out")
    page.check("#mode-carve-out")
    page.wait_for_selector("#carve-out-warning.emphasis")
    assert "raw" in page.inner_text("#carve-out-warning")
    page.uncheck("#mode-carve-out")
    page.uncheck("#mode-public")
    page.fill("#policy-labels", "negative, positive")
    page.fill("#policy-description", "A toy table of four measurements.")
    page.click("#policy-save")
    page.wait_for_selector("#policy-saved")
    policy = api.get(f"/api/v1/datasets/{dataset}/policy").json()
    assert policy["analyst_eval_modes"] == ["dp"]
    assert policy["public_info"] == {
        "label_names": ["negative", "positive"],
        "description": "A toy table of four measurements.",
    }
    assert page.locator("#audit-table tbody tr").count() == 0
    screenshot(page, "dataset-owner-grants")

    # The analyst's small sweep, evaluated with DP (their only allowed mode): DP evaluation
    # scales by declared bounds only, which the owner declares in the view.
    r = api.put(f"/api/v1/datasets/{dataset}/policy", json={"view": {"input_bounds": [-5.0, 5.0]}})
    assert r.status_code == 200, r.text
    spec = {
        "name": "analyst-sweep",
        "dataset": {"name": dataset, "input_bounds": [-5.0, 5.0]},
        "model": {"name": "logreg"},
        "training": {"steps": 4, "batch_size": 32, "eval_every": 2},
        "privacy": {"budgets": [1], "delta": 1e-5},
        "eval": {"mode": "dp"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1, 0.3], "clip": [1.0]}}],
    }
    r = analyst_api.post("/api/v1/sweeps", json=spec)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    _dash._wait_state(analyst_api, sid, {"done"}, timeout=240)

    # The owner's audit panel lists the sweep's trial releases, the analyst as principal, as
    # the API reports them (oldest first).
    log = api.get(f"/api/v1/datasets/{dataset}/audit").json()
    trial_ids = {e["trial_id"] for e in log["items"] if e["kind"] == "trial"}
    assert len(trial_ids) == 2 and log["next_cursor"] is None
    page.reload()
    page.wait_for_selector("#audit-table tbody tr")
    rows = page.locator("#audit-table tbody tr")
    shown = [
        (
            r.get_attribute("data-entry"),
            r.get_attribute("data-principal"),
            r.get_attribute("data-kind"),
        )
        for r in rows.all()
    ]
    assert shown == [(str(e["id"]), ANALYST, e["kind"]) for e in log["items"]]
    trial_rows = page.locator(f"#audit-table tr[data-kind=trial][data-sweep='{sid}']")
    assert {r.get_attribute("data-trial") for r in trial_rows.all()} == trial_ids
    assert page.locator("#audit-more").is_hidden()
    screenshot(page, "dataset-owner-audit")

    # The analyst: their allowance bar at the API's spending, the public description, their
    # modes and their releases; no grants, no policy form.
    (mine,) = analyst_api.get(f"/api/v1/datasets/{dataset}/grants").json()["items"]
    assert 0.9 < mine["epsilon_used"] <= 1.0
    ctx, pg, errors = _signed_in(browser, server, analyst_token)
    try:
        pg.goto(f"/datasets?open={dataset}")
        pg.wait_for_selector("#dataset-detail[data-role=analyst] #allowance")
        allowance = pg.locator("#allowance")
        assert "null" not in pg.inner_text("#allowance-panel")
        assert float(allowance.get_attribute("data-used")) == mine["epsilon_used"]
        assert float(allowance.get_attribute("data-allowance")) == 3
        assert float(allowance.get_attribute("data-left")) == pytest.approx(
            3 - mine["epsilon_used"]
        )
        width = pg.eval_on_selector("#allowance-bar .p-done", "e => parseFloat(e.style.width)")
        # The browser keeps a style's width to 4 decimals.
        assert width == pytest.approx(100 * mine["epsilon_used"] / 3, abs=1e-3)
        pg.wait_for_selector("#public-description #analyst-modes")
        about = pg.inner_text("#public-description")
        assert "negative, positive" in about and "four measurements" in about
        assert [m.get_attribute("data-mode") for m in pg.locator("#analyst-modes li").all()] == [
            "dp"
        ]
        pg.wait_for_selector("#audit-table tbody tr")
        assert pg.locator("#audit-table tbody tr").count() == len(log["items"])
        for absent in ("#grants-panel", "#policy-panel", "#grant-form", ".revoke-grant"):
            assert pg.locator(absent).count() == 0
        screenshot(pg, "dataset-analyst")
    finally:
        ctx.close()
    assert not errors, f"JavaScript errors on the analyst's page: {errors}"

    # The owner revokes from the page (after confirming); the row shows it revoked.
    page.click(f"#grants-table tr[data-analyst={ANALYST}] .revoke-grant")
    page.click("#confirm-yes")
    page.wait_for_selector(f"#grants-table tr[data-analyst={ANALYST}][data-active=false]")
    revoked = page.locator(f"#grants-table tr[data-analyst={ANALYST}]")
    assert "revoked" in revoked.locator(".state").inner_text()
    assert revoked.locator(".revoke-grant").count() == 0
    (g,) = api.get(f"/api/v1/datasets/{dataset}/grants").json()["items"]
    assert not g["active"] and g["revoked_at"]
    assert g["epsilon_used"] == mine["epsilon_used"]  # what was charged stays charged
    screenshot(page, "dataset-owner-revoked")

    # A name no token has (a typo?): the page asks first; kept, nothing is granted.
    for answer in ("#confirm-no", "#confirm-yes"):
        page.fill("#grant-analyst", "carl")
        page.fill("#grant-eps", "1")
        page.click("#grant-form button[type=submit]")
        page.wait_for_selector("#confirm[open]")
        assert "No API token is named" in page.inner_text("#confirm-text")
        page.click(answer)
        if answer == "#confirm-no":
            page.wait_for_selector("#grant-result .error")
            assert "confirm" in page.inner_text("#grant-result")
            grants = api.get(f"/api/v1/datasets/{dataset}/grants").json()["items"]
            assert "carl" not in {x["analyst"] for x in grants}
    page.wait_for_selector("#grants-table tr[data-analyst=carl][data-active=true]")
    # The shared built-in's row shows this tenant's own spending, and says so.
    assert page.inner_text("#datasets-table tr[data-dataset=digits] .budget-scope") == "yours"
