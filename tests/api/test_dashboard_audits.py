"""The dashboard's Audits panel (issue 38), in a real headless Chromium against a real
``dpsweep serve``: on a finished trial's page, "Audit this trial" starts a canary audit, the
panel polls it until it ends and shows its lower bound beside the claimed epsilon; the sweep's
page lists the same audit; a refused request shows the server's own words.

The server is ``test_dashboard``'s (its fixtures are reused); the sweep is a tiny one of its own.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

import tests.api.test_dashboard as _dash
from api.testing.browser import screenshot

pytestmark = pytest.mark.slow

server = _dash.server
token = _dash.token
api = _dash.api
browser = _dash.browser
page = _dash.page

TINY_SPEC = """\
name: dash-audit
dataset: {name: digits}
model: {name: mlp}
training: {epochs: 1, batch_size: 128, eval_every: 4}
privacy: {budgets: [2], delta: 1.0e-5, accounting: basic}
arms:
  - {name: base, strategy: fixed, grid: {lr: [0.5], clip: [1.0]}}
"""


@pytest.fixture(scope="module")
def tiny(api: httpx.Client) -> dict[str, Any]:
    r = api.post("/api/v1/sweeps", content=TINY_SPEC, headers=_dash.YAML)
    assert r.status_code == 201, r.text
    return _dash._wait_state(api, r.json()["id"], {"done"})


@pytest.fixture(scope="module")
def trial_id(api: httpx.Client, tiny: dict[str, Any]) -> str:
    items = api.get(f"/api/v1/sweeps/{tiny['id']}/trials", params={"limit": 500}).json()["items"]
    done = [t for t in items if t["state"] == "done"]
    assert done, items
    return str(done[0]["id"])


def _number(text: str, pattern: str) -> float:
    m = re.search(pattern, text)
    assert m is not None, f"{pattern!r} not in {text!r}"
    return float(m.group(1))


def test_a_refused_audit_shows_the_servers_detail(page: Any, trial_id: str) -> None:
    page.goto(f"/trials/{trial_id}")
    page.wait_for_selector("#audits-panel #audit-form")
    assert "proves nothing" in page.inner_text("#audits-explain")
    assert page.input_value("#audit-canaries") == "1000"
    assert page.input_value("#audit-setting") == "white-box"
    page.fill("#audit-canaries", "1")
    page.click("#audit-start")
    page.wait_for_selector("#audit-error")
    assert "canaries" in page.inner_text("#audit-error")
    assert page.locator("#audits-list li").count() == 0


def test_audit_a_trial_then_see_it_on_the_sweep(
    page: Any, api: httpx.Client, tiny: dict[str, Any], trial_id: str
) -> None:
    page.goto(f"/trials/{trial_id}")
    page.wait_for_selector("#audits-panel #audit-form")
    page.wait_for_selector("#audits-status")
    assert "No audits" in page.inner_text("#audits-status")
    page.fill("#audit-canaries", "200")
    page.click("#audit-start")
    page.wait_for_selector("#audits-list li[data-state=running]")
    page.wait_for_selector("#audits-list li[data-state=succeeded]", timeout=300_000)
    row = page.locator("#audits-list li[data-state=succeeded]")
    text = row.inner_text()
    screenshot(page, "trial-audit")
    low = _number(text, r"ε ≥ ([0-9.e+-]+)")
    claimed = _number(text, r"claimed ε = ([0-9.e+-]+)")
    assert 0 <= low <= claimed, text
    assert "95 % lower bound" in text
    assert "white-box" in text and "200 canaries" in text
    audit_id = row.get_attribute("data-audit")

    # The API agrees with what the page shows.
    a = api.get(f"/api/v1/audits/{audit_id}").json()
    assert a["state"] == "succeeded" and a["trial_id"] == trial_id
    assert a["result"]["canaries"] == 200 and a["result"]["setting"] == "white-box"

    page.goto(f"/sweeps/{tiny['id']}")
    page.wait_for_selector(f"#audits-panel li[data-audit='{audit_id}'][data-state=succeeded]")
    assert page.locator("#audits-panel #audit-form").count() == 0
    listed = page.inner_text(f"#audits-panel li[data-audit='{audit_id}']")
    assert "white-box" in listed and "claimed ε" in listed
    screenshot(page, "sweep-audits")
