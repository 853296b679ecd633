"""What the dashboard shows, checked in a real headless Chromium against a real ``dpsweep serve``
(issue 37, item 8):

* one seed has no spread: "± std" reads "—", as in the CLI's table, and no error bar is drawn;
* the trial page's C_t and learning rate are two stacked, labelled panels of their own colour;
* a DP-evaluation sweep says why it has no calibration front, where the chart would be, and
  draws no empty plot;
* every arm has the colour the CLI's plots give it (one palette, :mod:`api.plots.palette`);
* the Model section reads as the card's README.md: its headings, the ε statement with the
  release it covers, the metrics, the model and how to load it; no raw dump of keys.

The server and the finished two-arm sweep are ``test_dashboard``'s (its fixtures are reused);
a small three-arm DP-evaluation sweep is run here.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from matplotlib.colors import to_hex

import tests.api.test_dashboard as _dash
from api.plots import pareto_figures
from api.plots.palette import arm_styles, natural_order
from api.testing.browser import screenshot
from api.testing.server import Server
from sweeper.store.engine import make_engine
from sweeper.sweeps.stored import load_sweep
from sweeper.sweeps.summary import sweep_results

pytestmark = pytest.mark.slow

server = _dash.server
token = _dash.token
api = _dash.api
finished = _dash.finished
browser = _dash.browser
page = _dash.page

# Three arms whose names sort differently as text ("arm10" < "arm2") and naturally: the
# palette's order is the natural one, in both the CLI's plots and the dashboard.
DP_EVAL_SPEC = """\
name: dash-dp-eval
dataset: {name: digits}
model: {name: mlp}
training: {epochs: 1, batch_size: 128, eval_every: 4}
privacy: {budgets: [4], delta: 1.0e-5, accounting: basic}
eval: {mode: dp}
arms:
  - {name: arm10, strategy: fixed, grid: {lr: [0.5], clip: [1.0]}}
  - {name: arm2, strategy: fixed, grid: {lr: [1.0], clip: [1.0]}}
  - {name: base, strategy: fixed, grid: {lr: [0.8], clip: [0.5]}}
"""

DASH = "—"


@pytest.fixture(scope="module")
def dp_eval(api: httpx.Client, finished: dict[str, Any]) -> dict[str, Any]:
    r = api.post("/api/v1/sweeps", content=DP_EVAL_SPEC, headers=_dash.YAML)
    assert r.status_code == 201, r.text
    return _dash._wait_state(api, r.json()["id"], {"done"})


def _rgb_hex(css: str) -> str:
    """``rgb(31, 119, 180)`` (what the browser reports) as ``#1f77b4``."""
    m = re.fullmatch(r"rgba?\((\d+),\s*(\d+),\s*(\d+)(?:,\s*[\d.]+)?\)", css.strip())
    if m is None:
        return css.strip().lower()
    return "#" + "".join(f"{int(v):02x}" for v in m.groups())


def _traces(page: Any, selector: str) -> list[dict[str, Any]]:
    """Each trace's role, name, colours and axes, as the chart was drawn."""
    return list(
        page.evaluate(
            f"""() => document.querySelector({selector!r}).data.map(t => ({{
                role: t.dpRole || null, name: t.name, n: t.x ? t.x.length : 0,
                yaxis: t.yaxis || "y",
                marker: t.marker ? t.marker.color || null : null,
                line: t.line ? t.line.color || null : null,
                dash: t.line ? t.line.dash || "solid" : null,
                errors: t.error_y && t.error_y.array ? Array.from(t.error_y.array) : null,
                text: t.text ? Array.from(t.text) : null}}))"""
        )
    )


def _hex(colour: Any) -> str:
    """A matplotlib colour (a hex string or an RGBA array) as ``#rrggbb``."""
    return str(to_hex(colour))


def _cli_colours(server: Server, sweep_id: str) -> tuple[dict[str, str], dict[str, str]]:
    """Each arm's colour on the CLI's two figures (``dpsweep run --plot``'s path: the sweep's
    released records through :func:`api.plots.pareto_figures`)."""
    engine = make_engine(server.db_url)
    try:
        res = sweep_results(load_sweep(engine, sweep_id))
    finally:
        engine.dispose()
    eps_fig, cal_fig = pareto_figures(res.records, metric=res.metric, mode=res.mode)
    eps = {
        str(line.get_gid()).removeprefix("series:"): _hex(line.get_color())
        for line in eps_fig.axes[0].get_lines()
        if str(line.get_gid()).startswith("series:")
    }
    cal = {
        str(c.get_gid()).removeprefix("trials:"): _hex(c.get_facecolor()[0])
        for c in cal_fig.axes[0].collections
        if str(c.get_gid()).startswith("trials:")
    }
    return eps, cal


def _dashboard_colours(page: Any) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Each arm's colour on the page: the ε front, the calibration front, the table's swatch."""
    eps = {t["name"]: t["marker"] for t in _traces(page, "#eps-chart") if t["role"] == "arm"}
    for t in _traces(page, "#eps-chart"):
        if t["role"] == "arm":
            assert t["line"] == t["marker"]
    cal = {}
    if page.locator("#cal-chart:not([hidden])").count():
        cal = {t["name"]: t["marker"] for t in _traces(page, "#cal-chart") if t["role"] == "trials"}
    swatches = page.evaluate(
        """() => Array.from(document.querySelectorAll('#results-table tbody tr')).map(tr => [
            tr.children[0].textContent,
            getComputedStyle(tr.querySelector('.swatch')).backgroundColor])"""
    )
    table = {arm: _rgb_hex(css) for arm, css in swatches}
    return eps, cal, table


# ---------------------------------------------------------------------------------------------


def test_one_seed_has_no_spread_a_dash_as_in_the_cli(page: Any, finished: dict[str, Any]) -> None:
    assert finished["results"] and all(r["seeds"] == 1 for r in finished["results"])
    page.goto(f"/sweeps/{finished['id']}")
    page.wait_for_selector("#results-table tbody tr")
    page.wait_for_selector("#eps-chart .scatterlayer .trace")
    cells = page.locator("#results-table td.std").all_inner_texts()
    assert len(cells) == len(finished["results"])
    assert cells == [DASH] * len(cells)  # the CLI's "—", not 0
    header = page.locator("#results-table thead th").all_inner_texts()
    assert "± std" in header
    # No error bar and no "± 0" in the points' hover text either.
    for t in _traces(page, "#eps-chart"):
        if t["role"] == "arm":
            assert t["errors"] and all(e == 0 for e in t["errors"])
            assert all("±" not in s and "1 seed" in s for s in t["text"])


def test_trial_page_draws_clip_and_learning_rate_as_two_labelled_panels(
    page: Any, api: httpx.Client, finished: dict[str, Any]
) -> None:
    items = api.get(f"/api/v1/sweeps/{finished['id']}/trials", params={"arm": "quantile"})
    trial = next(
        t for t in items.json()["items"] if t["arm"] == "quantile" and t["state"] == "done"
    )
    page.goto(f"/trials/{trial['id']}")
    page.wait_for_selector("#traj-chart .scatterlayer .trace", state="attached")
    traces = {t["role"]: t for t in _traces(page, "#traj-chart")}
    clip, lr = traces["clip"], traces["lr"]
    assert clip["n"] > 1 and lr["n"] == clip["n"]
    assert "Cₜ" in clip["name"] and lr["name"] == "learning rate"
    # Each on its own y axis, of its own colour and line style.
    assert {clip["yaxis"], lr["yaxis"]} == {"y", "y2"}
    assert clip["line"] != lr["line"] and clip["dash"] != lr["dash"]
    layout = page.evaluate(
        """() => { const l = document.querySelector('#traj-chart').layout;
            return {y: l.yaxis, y2: l.yaxis2, legend: l.showlegend}; }"""
    )
    axes = {"y": layout["y"], "y2": layout["y2"]}
    clip_axis, lr_axis = axes[clip["yaxis"]], axes[lr["yaxis"]]
    # Stacked, not overlaid: the two panels' heights do not overlap.
    assert not clip_axis.get("overlaying") and not lr_axis.get("overlaying")
    lo, hi = sorted([clip_axis["domain"], lr_axis["domain"]])
    assert lo[1] < hi[0]
    assert clip_axis["domain"][0] > lr_axis["domain"][0]  # C_t above
    # Axis titles say which is which, in the colour of their line.
    assert "Cₜ" in clip_axis["title"]["text"] and "learning rate" in lr_axis["title"]["text"]
    assert clip_axis["title"]["font"]["color"] == clip["line"]
    assert lr_axis["title"]["font"]["color"] == lr["line"]
    assert layout["legend"] is not False
    # Rendered: two subplots, each with its line, and the legend names both.
    assert page.locator("#traj-chart .scatterlayer .trace").count() == 2
    legend = page.evaluate("document.querySelector('#traj-chart .legend').textContent")
    assert "learning rate" in legend and "Cₜ" in legend
    screenshot(page, "trial-trajectories")


def test_dp_evaluation_sweep_says_why_there_is_no_calibration_front(
    page: Any, dp_eval: dict[str, Any]
) -> None:
    assert dp_eval["privacy"]["evaluation"]["mode"] == "dp"
    assert all(r["ece_mean"] is None for r in dp_eval["results"])
    page.goto(f"/sweeps/{dp_eval['id']}")
    page.wait_for_selector("#eps-chart .scatterlayer .trace")
    page.wait_for_selector("#cal-card[data-state=unavailable]")
    reason = page.locator("#cal-reason")
    assert reason.is_visible()
    assert reason.get_attribute("data-reason") == "dp-evaluation"
    assert "DP evaluation" in reason.inner_text() and "noisy accuracy" in reason.inner_text()
    # No empty plot: the chart is hidden and holds no drawing.
    assert page.locator("#cal-chart").is_hidden()
    assert page.locator("#cal-chart .main-svg").count() == 0
    # The reason is at the top of the panel, right under its heading, where the plot would be.
    order = page.evaluate(
        """() => Array.from(document.querySelector('#cal-card').children)
            .filter(e => !e.hidden).map(e => e.id || e.tagName.toLowerCase())"""
    )
    assert order[:2] == ["h2", "cal-reason"], order
    title = page.locator("#cal-card h2").bounding_box()
    box = reason.bounding_box()
    card = page.locator("#cal-card").bounding_box()
    assert title and box and card
    assert box["y"] >= title["y"] + title["height"] - 1 and box["y"] < card["y"] + 120
    screenshot(page, "sweep-dp-eval")
    # Its trials' pages likewise say why there is no reliability diagram, in its place.
    page.locator("#results-table a", has_text="best trial").first.click()
    page.wait_for_url("**/trials/*")
    page.wait_for_selector("#reliability-reason")
    assert "DP evaluation" in page.inner_text("#reliability-reason")
    assert page.locator("#reliability-chart .main-svg").count() == 0


def test_arm_colours_are_the_cli_plots_colours(
    page: Any, server: Server, finished: dict[str, Any], dp_eval: dict[str, Any]
) -> None:
    for sweep in (finished, dp_eval):
        arms = [a["name"] for a in sweep["arms"]]
        expected = {a: s.colour for a, s in arm_styles(arms).items()}
        cli_eps, cli_cal = _cli_colours(server, sweep["id"])
        assert set(cli_eps) == set(arms)
        page.goto(f"/sweeps/{sweep['id']}")
        page.wait_for_selector("#eps-chart .scatterlayer .trace")
        page.wait_for_selector("#results-table tbody tr")
        page.wait_for_selector("#cal-card[data-state]")
        eps, cal, table = _dashboard_colours(page)
        assert set(eps) == set(arms)
        for arm in arms:
            assert eps[arm] == cli_eps[arm] == expected[arm], arm
            assert table[arm] == cli_eps[arm], arm
        for arm, colour in cli_cal.items():  # the calibration front (none for DP evaluation)
            assert cal[arm] == colour, arm
        assert set(cal) == set(cli_cal)
        # Distinct arms, distinct colours.
        assert len(set(eps.values())) == len(arms)
    # Keyed by the natural order: arm2 before arm10, whatever order the spec gives them in.
    assert natural_order(a["name"] for a in dp_eval["arms"]) == ["arm2", "arm10", "base"]
    # The page's own palette.js agrees with Python's for any list of names (tab20 past ten).
    names = [f"arm{i}" for i in range(23)] + ["b", "a10", "a9", "x1y2", "x1y10"]
    js = page.evaluate(
        "async (names) => (await import('/static/palette.js')).armStyles(names)", names
    )
    py = arm_styles(names)
    assert {a: (v["color"], v["symbol"]) for a, v in js.items()} == {
        a: (s.colour, s.symbol) for a, s in py.items()
    }


def _leaves(card: dict[str, Any]) -> list[str]:
    return [k for k, v in card.items() if v is not None]


def test_model_section_reads_as_the_cards_readme(
    page: Any, api: httpx.Client, finished: dict[str, Any]
) -> None:
    items = api.get(f"/api/v1/sweeps/{finished['id']}/trials", params={"limit": 500}).json()
    cards = {t["id"]: api.get(f"/api/v1/trials/{t['id']}/model-card") for t in items["items"]}
    trial_id = next(tid for tid, r in cards.items() if r.status_code == 200)
    card = cards[trial_id].json()
    page.goto(f"/trials/{trial_id}")
    panel = page.locator("#model-panel[data-state=kept]")
    panel.wait_for()

    # The README's title and sections, in its order, then how to download and load.
    assert page.inner_text("#model-card-title") == (
        f"Model card: {card['model']['name']} from trial {trial_id}"
    )
    headings = panel.locator("section.model-section > h4").all_inner_texts()
    best_step = card["metrics"]["best_step"]
    assert headings[:2] == ["Privacy", "Evaluation"]
    for h in (f"Metrics (best checkpoint, step {best_step})", "Model", "Download and load"):
        assert h in headings
    intro = page.inner_text("#model-card-intro")
    t = card["trial"]
    assert t["sweep_name"] in intro and t["arm"] in intro and t["strategy"] in intro
    assert card["dataset"]["name"] in intro

    # The privacy statement: ε and δ of this model's release (its grid), and what it covers;
    # then the whole sweep's.
    p = card["privacy"]
    statement = page.inner_text("#model-privacy-statement")
    assert f"ε = {p['epsilon']:.4g}" in statement
    assert "(this model's grid)" in statement and p["covers"] in statement
    eps = float(page.get_attribute("#model-grid-epsilon", "data-epsilon"))
    assert eps == pytest.approx(p["epsilon"])
    sweep_line = page.inner_text("#model-sweep-epsilon")
    assert f"ε = {p['sweep']['epsilon']:.4g}" in sweep_line and "(the whole sweep)" in sweep_line
    mechanism = page.inner_text("#model-mechanism")
    assert f"σ = {p['noise_multiplier']:.4g}" in mechanism and f"T = {p['steps']}" in mechanism
    assert card["evaluation"]["statement"] in page.inner_text("#model-evaluation-statement")

    # Accuracy and every metric of the card, in a table.
    for metric, value in card["metrics"]["values"].items():
        if isinstance(value, float):
            shown = panel.locator(f"#model-metrics td[data-key='{metric}']").inner_text()
            assert float(shown) == pytest.approx(value, rel=1e-3)
    assert "accuracy" in card["metrics"]["values"]

    # The model, strategy and hyperparameters; the weights' hash; how to load it.
    assert card["model"]["name"] in page.inner_text("#model-arch")
    hyper = page.inner_text("#model-hyperparameters")
    assert t["strategy"] in hyper
    for k in t["hyperparameters"]:
        assert f"{k}=" in hyper
    assert page.inner_text("#model-sha256") == card["model"]["weights"]["sha256"]
    snippet = page.inner_text("#model-load-snippet")
    assert f'client.trial("{trial_id}")' in snippet and "load_model()" in snippet
    assert f"dpsweep model {trial_id} -o DIR" in page.inner_text("#model-howto")

    # No raw dump of the card's keys: none of its field names is shown as text.
    text = panel.inner_text()
    for raw in (
        "noise_multiplier",
        "sample_rate",
        "target_delta",
        "single_run_epsilon",
        "seed_seeds",
        "sweep_name",
        "input_shape",
        "num_classes",
        "size_bytes",
        "hyperparameters:",
        "epsilon_budget",
        "best_step",
        "{",
    ):
        assert raw not in text, raw
    # Fields no section shows are listed, each once, under "Details" (what a newer card adds,
    # such as the split's seed, appears there without a change here).
    listed = page.evaluate(
        """() => Array.from(document.querySelectorAll('#model-details dd[data-key]'))
            .map(e => e.dataset.key)"""
    )
    shown_elsewhere = {
        "": {"format", "card_version", "dpsweep_version", "trial", "dataset", "model"}
        | {"privacy", "evaluation", "metrics", "warnings"},
    }
    top_extra = [k for k in _leaves(card) if k not in shown_elsewhere[""]]
    for k in top_extra:
        assert k in listed
    assert len(listed) == len(set(listed))
    screenshot(page, "trial-model-card")


def test_unknown_card_fields_are_listed_under_details(
    page: Any, api: httpx.Client, finished: dict[str, Any]
) -> None:
    """A card from a newer server: its new fields are listed, by name, in the details list.

    The real card is fetched from the real server; the browser sees it with three fields
    added (as a newer dpsweep's card would have them): nothing else is changed."""
    items = api.get(f"/api/v1/sweeps/{finished['id']}/trials", params={"limit": 500}).json()
    trial_id = next(
        t["id"]
        for t in items["items"]
        if api.get(f"/api/v1/trials/{t['id']}/model-card").status_code == 200
    )

    def newer(route: Any) -> None:
        response = route.fetch()
        card = response.json()
        card["dataset"]["split_seed"] = 1234
        card["dataset"]["test_fraction"] = 0.2
        card["provenance"] = {"host_class": "cpu"}
        route.fulfill(response=response, body=json.dumps(card))

    page.route(f"**/api/v1/trials/{trial_id}/model-card", newer)
    page.goto(f"/trials/{trial_id}")
    page.locator("#model-panel[data-state=kept]").wait_for()
    details = page.locator("#model-details")
    assert details.locator("summary").inner_text().startswith("Details")
    details.locator("summary").click()
    assert details.locator("dd[data-key='dataset.split_seed']").inner_text() == "1234"
    assert details.locator("dd[data-key='dataset.test_fraction']").inner_text() == "0.2"
    assert "split seed (dataset)" in details.inner_text()
    assert "cpu" in details.locator("dd[data-key='provenance']").inner_text()
    # The README sections are all still there.
    assert page.locator("#model-privacy-statement").count() == 1
