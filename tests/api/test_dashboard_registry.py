"""The dashboard's registry listing in a real headless Chromium, against a real ``dpsweep serve``
(no scheduler) with a real plug-in distribution on its PYTHONPATH: the datasets page lists
the registered models (built-in and the plug-in's) with their options, and the submit page
hints at the names a spec may use."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from api.testing.browser import chromium, screenshot
from api.testing.server import Server, start_server
from sweeper.store.schema import upgrade
from tests.api.plugin_site import PLUGIN_DATASET, PLUGIN_MODEL, env_with, plugin_site

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("dashboard-registry")
    url = f"sqlite:///{work / 'dash.db'}"
    upgrade(url)
    srv = start_server(url, work, scheduler=False, env=env_with(plugin_site(work / "plugins")))
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def page(server: Server) -> Iterator[Any]:
    """A signed-in tab; fails the test on any JavaScript error."""
    with chromium() as browser:
        ctx = browser.new_context(base_url=server.base, viewport={"width": 1280, "height": 900})
        ctx.add_init_script(f"sessionStorage.setItem('dpsweep.token', {server.token('eve')!r})")
        pg = ctx.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        yield pg
        ctx.close()
        assert not errors, f"JavaScript errors on the page: {errors}"


def test_registry_lists_builtin_and_plugin_models_with_options(page: Any) -> None:
    page.goto("/datasets")
    models = "#registry-models"
    page.wait_for_selector(f"{models} tr[data-name='{PLUGIN_MODEL}']")
    mlp = page.locator(f"{models} tr[data-name=mlp]").inner_text()
    assert "fully connected" in mlp and "hidden: list of int >= 1, default 128" in mlp
    plugin = page.locator(f"{models} tr[data-name='{PLUGIN_MODEL}']").inner_text()
    assert "from a plug-in" in plugin and "width: int >= 1, default 8" in plugin
    assert page.locator(f"#registry-datasets tr[data-name='{PLUGIN_DATASET}']").count() == 1
    fixed = page.locator("#registry-strategies tr[data-name=fixed]").inner_text()
    assert "clip: float > 0, default 1" in fixed
    assert (
        "dp_accounting PLD" in page.locator("#registry-accountants tr[data-name=pld]").inner_text()
    )
    screenshot(page, "registry")

    page.goto("/submit")
    hints = page.locator("#registry-hints")
    hints.get_by_text(PLUGIN_MODEL, exact=False).wait_for()
    text = hints.inner_text()
    assert "models:" in text and "mlp" in text and PLUGIN_DATASET in text and "fixed" in text
