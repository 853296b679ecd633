"""The trial page's "Model" panel in a real headless Chromium, against a real ``dpsweep serve``.

The finished sweep of ``test_dashboard`` (its fixtures are reused: one server and one sweep for
this module) keeps each grid's best model (``artifacts.keep`` defaults to ``best_per_grid``).
On a kept trial's page the "Download model" button saves the very bytes the server keeps
(their sha256 is the card's and the ``model_artifacts`` row's) and the card is rendered with
the grid's ε the API reports; on a trial without a model the panel says why (the 404's detail).
A reproducible-mode papernot-steinke sweep's one released model carries both warnings.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session

import tests.api.test_dashboard as _dash
from api.testing.browser import screenshot
from api.testing.server import Server
from sweeper.store import ModelArtifact
from sweeper.store.engine import make_engine

pytestmark = pytest.mark.slow

# The browser-test harness of test_dashboard: a server (auth on, one worker), alice's token and
# client, its finished sweep, the browser and a signed-in tab that accepts downloads. Bound by
# assignment, so that pytest finds them here (each with this module's own scope).
server = _dash.server
token = _dash.token
api = _dash.api
finished = _dash.finished
browser = _dash.browser
page = _dash.page

# One grid searched at random with a secret, geometric number of runs (at least one), in the
# labelled reproducible mode: its selected trial's model is the only one kept.
PS_SPEC = """\
name: dash-ps-reproducible
dataset: {name: digits}
model: {name: mlp}
training: {epochs: 1, batch_size: 128, eval_every: 4}
privacy:
  budgets: [4]
  delta: 1.0e-5
  accounting: papernot-steinke
  distribution: {name: geometric}
  reproducible: true
search: {method: random, n: 2}
arms:
  - strategy: fixed
    grid: {lr: [0.5, 1.0], clip: [1.0]}
"""


@pytest.fixture(scope="module")
def cards(api: httpx.Client, finished: dict[str, Any]) -> dict[str, httpx.Response]:
    """Each of the finished sweep's trials -> its GET /model-card response (200 or 404)."""
    r = api.get(f"/api/v1/sweeps/{finished['id']}/trials", params={"limit": 500})
    assert r.status_code == 200, r.text
    return {t["id"]: api.get(f"/api/v1/trials/{t['id']}/model-card") for t in r.json()["items"]}


def _kept(cards: dict[str, httpx.Response]) -> list[str]:
    kept = [tid for tid, r in cards.items() if r.status_code == 200]
    assert kept, "the finished sweep kept no model (artifacts.keep defaults to best_per_grid)"
    return kept


def _open_panel(page: Any, trial_id: str, state: str) -> Any:
    page.goto(f"/trials/{trial_id}")
    panel = page.locator(f"#model-panel[data-state={state}]")
    panel.wait_for()
    return panel


def test_download_model_saves_the_kept_bytes_and_the_card_shows_the_grid_epsilon(
    page: Any, api: httpx.Client, server: Server, cards: dict[str, httpx.Response]
) -> None:
    trial_id = _kept(cards)[0]
    card = cards[trial_id].json()
    trial = api.get(f"/api/v1/trials/{trial_id}").json()
    panel = _open_panel(page, trial_id, "kept")

    with page.expect_download() as info:
        page.click("#download-model")
    download = info.value
    assert download.suggested_filename == f"dpsweep-{trial_id}.safetensors"
    data = Path(download.path()).read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    assert sha == card["model"]["weights"]["sha256"]
    assert len(data) == card["model"]["weights"]["size_bytes"]
    engine = make_engine(server.db_url)
    try:
        with Session(engine) as session:
            row = session.get(ModelArtifact, trial_id)
            assert row is not None
            assert sha == row.sha256
    finally:
        engine.dispose()
    # The same bytes as the API serves (the file is safetensors: an 8-byte header length,
    # then a JSON header).
    assert data == api.get(f"/api/v1/trials/{trial_id}/model").content
    header_len = int.from_bytes(data[:8], "little")
    assert json.loads(data[8 : 8 + header_len])
    assert panel.locator("#model-sha256").inner_text() == sha

    with page.expect_download() as info:
        page.click("#download-card")
    saved = Path(info.value.path()).read_bytes()
    assert saved == cards[trial_id].content
    assert json.loads(saved) == card

    # The rendered card shows the grid's ε as the API reports it (the card's, else the
    # trial's grid budget).
    expected = (card.get("privacy") or {}).get("grid", {}).get("epsilon")
    if expected is None:
        expected = trial["planned"].get("grid_epsilon_budget") or trial["epsilon_budget"]
    eps = panel.locator("#model-grid-epsilon")
    assert float(eps.get_attribute("data-epsilon")) == pytest.approx(float(expected))
    assert f"ε = {float(expected):.4g}" in eps.inner_text()  # shown to 4 significant digits
    values = card["metrics"]["values"]
    assert "accuracy" in values
    for metric, value in values.items():
        if isinstance(value, float) and metric in ("accuracy", "ece"):
            shown = panel.locator(f"#model-metrics td[data-key='{metric}']").inner_text()
            assert float(shown) == pytest.approx(value, rel=1e-2)
    # A secret-randomness, basic-accounting sweep: neither warning applies.
    assert trial["randomness"] == "secret"
    assert page.locator("#model-reproducible-warning").count() == 0
    assert page.locator("#model-selected-warning").count() == 0
    screenshot(page, "trial-model")


def test_a_trial_without_a_model_says_why(page: Any, cards: dict[str, httpx.Response]) -> None:
    missing = [tid for tid, r in cards.items() if r.status_code == 404]
    assert missing, "every trial kept a model; best_per_grid keeps one per grid"
    trial_id = missing[0]
    detail = cards[trial_id].json()["detail"]
    assert cards[trial_id].headers["content-type"].startswith("application/problem+json")
    _open_panel(page, trial_id, "missing")
    assert page.locator("#model-missing").inner_text() == detail
    assert "no model is kept" in detail
    assert page.locator("#download-model").count() == 0
    screenshot(page, "trial-no-model")


def test_a_reproducible_selected_trial_model_carries_both_warnings(
    page: Any, api: httpx.Client
) -> None:
    r = api.post("/api/v1/sweeps", content=PS_SPEC, headers=_dash.YAML)
    assert r.status_code == 201, r.text
    sweep = _dash._wait_state(api, r.json()["id"], {"done"})
    items = api.get(f"/api/v1/sweeps/{sweep['id']}/trials").json()["items"]
    assert len(items) == 1  # the grid's selected trial; its other runs stay private
    trial_id = items[0]["id"]
    card = api.get(f"/api/v1/trials/{trial_id}/model-card")
    assert card.status_code == 200, card.text
    panel = _open_panel(page, trial_id, "kept")
    assert "public seed" in panel.locator("#model-reproducible-warning").inner_text()
    assert "Selected trial" in panel.locator("#model-selected-warning").inner_text()
    with page.expect_download() as info:
        page.click("#download-model")
    data = Path(info.value.path()).read_bytes()
    assert hashlib.sha256(data).hexdigest() == card.json()["model"]["weights"]["sha256"]
    screenshot(page, "trial-model-ps-reproducible")
