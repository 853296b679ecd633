"""The dashboard's Audits panel (issue 38), in a real headless Chromium against a real
``dpsweep serve``: on a finished trial's page, "Audit this trial" starts a canary audit, the
panel polls it until it ends and shows its lower bound beside the claimed epsilon; the sweep's
page lists the same audit; a refused request shows the server's own words. An audit of private
data shows its cost and asks first (issue 51): nothing is charged until the user confirms.

The server is ``test_dashboard``'s (its fixtures are reused); the sweep is a tiny one of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

import tests.api.test_dashboard as _dash
from api.testing.browser import screenshot
from api.testing.server import Server

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
    explain = page.inner_text("#audits-explain")
    assert "proves nothing" in explain and "at most 5 %" in explain and "public data" in explain
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
    assert "95 % lower bound, any mechanism" in text
    assert "no evidence of a leak" in text  # the API's verdict, in its words
    assert "white-box" in text and "200 canaries" in text
    audit_id = row.get_attribute("data-audit")

    # The API agrees with what the page shows.
    a = api.get(f"/api/v1/audits/{audit_id}").json()
    assert a["state"] == "succeeded" and a["trial_id"] == trial_id
    assert a["result"]["verdict"] in text
    assert a["result"]["canaries"] == 200 and a["result"]["setting"] == "white-box"

    page.goto(f"/sweeps/{tiny['id']}")
    page.wait_for_selector(f"#audits-panel li[data-audit='{audit_id}'][data-state=succeeded]")
    assert page.locator("#audits-panel #audit-form").count() == 0
    listed = page.inner_text(f"#audits-panel li[data-audit='{audit_id}']")
    assert "white-box" in listed and "claimed ε" in listed
    screenshot(page, "sweep-audits")


@pytest.fixture(scope="module")
def analyst_trial(server: Server, api: httpx.Client) -> Iterator[tuple[str, str]]:
    """An analyst's (ana's) finished trial on alice's private upload: (ana's token, trial id)."""
    rng = np.random.default_rng(0)
    x = np.round(rng.normal(size=(200, 4)), 3)
    y = (x[:, 0] > 0).astype(int)
    lines = ["a,b,c,d,label"] + [
        ",".join(repr(float(v)) for v in row) + f",{t}" for row, t in zip(x, y, strict=True)
    ]
    r = api.post(
        "/api/v1/datasets",
        files={"file": ("owned.csv", "\n".join(lines) + "\n", "text/csv")},
        data={
            "label_column": "label",
            "epsilon_cap": "20",
            "name": "audit-owned",
            "declare_counted": "true",
        },
    )
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    tok = server.token("ana")
    r = api.post(f"/api/v1/datasets/{ds}/grants", json={"analyst": "ana", "epsilon_allowance": 3})
    assert r.status_code == 201, r.text
    r = api.put(f"/api/v1/datasets/{ds}/policy", json={"view": {"input_bounds": [-5.0, 5.0]}})
    assert r.status_code == 200, r.text
    spec = {
        "name": "analyst-audit",
        "dataset": {"name": ds, "input_bounds": [-5.0, 5.0]},
        "model": {"name": "logreg"},
        "training": {"steps": 4, "batch_size": 32, "eval_every": 2},
        "privacy": {"budgets": [1], "delta": 1e-5},
        "eval": {"mode": "dp"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
    }
    with server.client(tok) as ana:
        r = ana.post("/api/v1/sweeps", json=spec)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        _dash._wait_state(ana, sid, {"done"}, timeout=240)
        items = ana.get(f"/api/v1/sweeps/{sid}/trials", params={"limit": 500}).json()["items"]
        done = [t for t in items if t["state"] == "done"]
        assert done, items
        yield tok, str(done[0]["id"])


def test_an_analysts_audit_is_refused_with_the_servers_message(
    browser: Any, server: Server, analyst_trial: tuple[str, str]
) -> None:
    tok, trial = analyst_trial
    with server.client(tok) as ana:
        refused = ana.post("/api/v1/audits", json={"trial": trial, "canaries": 200})
    assert refused.status_code == 403, refused.text
    detail = refused.json()["detail"]

    ctx = browser.new_context(base_url=server.base, viewport={"width": 1280, "height": 900})
    ctx.add_init_script(f"sessionStorage.setItem('dpsweep.token', {tok!r})")
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    try:
        pg.goto(f"/trials/{trial}")
        pg.wait_for_selector("#audits-panel #audit-form")
        pg.fill("#audit-canaries", "200")
        pg.click("#audit-start")
        pg.wait_for_selector("#audit-error")
        assert detail in pg.inner_text("#audit-error")
        assert pg.locator("#audits-list li").count() == 0
        screenshot(pg, "trial-audit-refused")
    finally:
        ctx.close()
    assert not errors, errors


def _store_audits(
    server: Server, sweep_id: str, trial_id: str, results: list[dict[str, Any]]
) -> list[str]:
    """Succeeded audits of the trial with these results, stored as the server stores them;
    their ids."""
    from datetime import UTC, datetime

    from sqlalchemy.orm import Session

    from sweeper.store import Audit, AuditState
    from sweeper.store.engine import make_engine

    engine = make_engine(server.db_url)
    ids = []
    try:
        with Session(engine) as s, s.begin():
            for result in results:
                row = Audit(owner="alice", dataset="digits", sweep_id=sweep_id,
                            trial_id=trial_id, request={"trial": trial_id},
                            state=AuditState.succeeded, result=result,
                            finished_at=datetime.now(UTC))  # fmt: skip
                s.add(row)
                s.flush()
                ids.append(str(row.id))
    finally:
        engine.dispose()
    return ids


def test_a_bound_above_the_claim_shows_the_servers_verdict(
    page: Any, server: Server, tiny: dict[str, Any], trial_id: str
) -> None:
    """Two stored audits of the trial: one from before issue 49 whose one-run bound (5.0)
    exceeds its claim (4.0), read in today's terms (its unchecked Gaussian 6.5 is dropped);
    one whose bound stays below the claim while its Gaussian estimate exceeds it. The panel
    marks each and shows the server's sentence."""
    from dpsweep.audit import audit_verdict

    base = {"confidence": 0.95, "setting": "white-box", "canaries": 1000, "strategy": "fixed"}
    legacy = {**base, "epsilon_claimed": 4.0, "epsilon_lower_bound": 6.5, "method": "gaussian",
              "epsilon_lower_bound_one_run": 5.0, "epsilon_lower_bound_gaussian": 6.5}  # fmt: skip
    suspect = {**base, "epsilon_claimed": 4.0, "epsilon_lower_bound": 2.3, "method": "one-run",
               "epsilon_estimate": 6.6, "estimate_assumption": "Gaussian scores",
               **audit_verdict(bound=2.3, claimed=4.0, confidence=0.95, estimate=6.6)}  # fmt: skip
    legacy_id, suspect_id = _store_audits(server, tiny["id"], trial_id, [legacy, suspect])
    ids = {"legacy": legacy_id, "suspect": suspect_id}
    page.goto(f"/trials/{trial_id}")
    above = page.locator(f"#audits-list li[data-audit='{ids['legacy']}']")
    above.wait_for()
    assert "audit-above" in (above.get_attribute("class") or "")
    text = above.inner_text()
    assert "ε ≥ 5" in text and "6.5" not in text, text
    assert "exceeds the claimed epsilon" in text and "at most 5 %" in text, text
    assert "repeat the audit on public data" in text, text
    suspect_row = page.locator(f"#audits-list li[data-audit='{ids['suspect']}']")
    assert "audit-suspect" in (suspect_row.get_attribute("class") or "")
    text = suspect_row.inner_text()
    assert "Gaussian estimate ε ≈ 6.6 (not a bound)" in text, text
    assert "the Gaussian estimate does" in text, text
    assert " per " not in text, text  # example level: no unit named
    screenshot(page, "trial-audit-verdicts")


def test_an_audit_per_person_says_so_beside_every_epsilon(
    page: Any, server: Server, tiny: dict[str, Any], trial_id: str
) -> None:
    """A stored audit of a dataset with a privacy unit: its bound, claim and estimate are per
    unit, and the row says so beside each."""
    from dpsweep.audit import audit_verdict

    result = {"confidence": 0.95, "setting": "white-box", "canaries": 1000, "strategy": "fixed",
              "epsilon_claimed": 4.0, "epsilon_lower_bound": 1.5, "method": "one-run",
              "epsilon_estimate": 2.5, "privacy_unit": "patient",
              **audit_verdict(bound=1.5, claimed=4.0, confidence=0.95, estimate=2.5)}  # fmt: skip
    (audit_id,) = _store_audits(server, tiny["id"], trial_id, [result])
    page.goto(f"/trials/{trial_id}")
    item = page.locator(f"#audits-list li[data-audit='{audit_id}']")
    item.wait_for()
    text = item.inner_text()
    assert "ε ≥ 1.5 per patient" in text, text
    assert "claimed ε = 4 per patient" in text, text
    assert "Gaussian estimate ε ≈ 2.5 per patient (not a bound)" in text, text


def _spent(server: Server, dataset: str) -> float:
    from sweeper.datasets.identity import ledger_key_of
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger
    from sweeper.store.engine import create_ledger_engine

    engine = create_ledger_engine(server.db_url)
    try:
        s = BudgetLedger(engine).summary(ledger_key_of(engine, dataset))
        return float(s.epsilon_spent + s.epsilon_reserved)
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def private_trial(api: httpx.Client) -> tuple[str, str]:
    """Alice's finished trial on her own private upload: (dataset id, trial id)."""
    rng = np.random.default_rng(51)
    x = np.round(rng.normal(size=(200, 4)), 3)
    y = (x[:, 0] > 0).astype(int)
    lines = ["a,b,c,d,label"] + [
        ",".join(repr(float(v)) for v in row) + f",{t}" for row, t in zip(x, y, strict=True)
    ]
    r = api.post(
        "/api/v1/datasets",
        files={"file": ("confirm.csv", "\n".join(lines) + "\n", "text/csv")},
        data={"label_column": "label", "epsilon_cap": "20", "name": "audit-confirm",
              "declare_counted": "true"},
    )  # fmt: skip
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    spec = {
        "name": "confirm-audit",
        "dataset": {"name": ds},
        "model": {"name": "logreg"},
        "training": {"steps": 4, "batch_size": 32, "eval_every": 2},
        "privacy": {"budgets": [1], "delta": 1e-5},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
    }
    r = api.post("/api/v1/sweeps", json=spec)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    _dash._wait_state(api, sid, {"done"}, timeout=240)
    items = api.get(f"/api/v1/sweeps/{sid}/trials", params={"limit": 500}).json()["items"]
    done = [t for t in items if t["state"] == "done"]
    assert done, items
    return ds, str(done[0]["id"])


def test_an_audit_of_private_data_shows_its_cost_and_asks_first(
    page: Any, server: Server, api: httpx.Client, private_trial: tuple[str, str]
) -> None:
    """Issue 51: "Audit this trial" on private data shows what it will charge (the server's
    quote) and sends nothing until confirmed; Cancel leaves the budget as it was; Confirm
    charges exactly the quoted epsilon and the audit runs."""
    ds, trial = private_trial
    before = _spent(server, ds)
    quote = api.post("/api/v1/audits/quote", json={"trial": trial, "canaries": 200}).json()
    assert quote["charged"] is True and quote["epsilon"] > 0
    page.goto(f"/trials/{trial}")
    page.wait_for_selector("#audits-panel #audit-form")
    page.fill("#audit-canaries", "200")
    page.click("#audit-start")
    page.wait_for_selector("#audit-confirm-box")
    cost = page.inner_text("#audit-cost")
    assert cost == quote["text"], cost
    assert f"this audit charges ε {quote['epsilon']:.4g}, δ 1e-05" in cost
    assert "ε left " in cost and "→" in cost
    assert f"Charge ε {quote['epsilon']:.4g}" in page.inner_text("#audit-confirm")
    screenshot(page, "trial-audit-confirm")
    # Asked, not sent: nothing is charged or stored.
    assert _spent(server, ds) == before
    assert api.get("/api/v1/audits", params={"trial": trial}).json()["items"] == []
    page.click("#audit-cancel")
    assert page.locator("#audit-confirm-box").count() == 0
    assert _spent(server, ds) == before
    assert page.locator("#audits-list li").count() == 0

    page.click("#audit-start")
    page.click("#audit-confirm")
    page.wait_for_selector("#audits-list li[data-state=succeeded]", timeout=300_000)
    assert page.locator("#audit-confirm-box").count() == 0
    (audit,) = api.get("/api/v1/audits", params={"trial": trial}).json()["items"]
    assert audit["request"]["confirm"] is True
    assert audit["charge"]["epsilon_charged"] == quote["epsilon"]
    assert _spent(server, ds) - before == pytest.approx(quote["epsilon"], rel=1e-9)
    row = page.inner_text(f"#audits-list li[data-audit='{audit['id']}']")
    assert "Verdict: 95 % lower bound " in row and "≤ claimed ε" in row, row
    assert audit["result"]["summary"] in row
