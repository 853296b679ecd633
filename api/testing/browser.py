"""A real headless Chromium for the dashboard tests, driven by Playwright.

Playwright's own browser download does not work on these machines, so the tests drive the
system's Chromium (Debian's ``chromium`` package; ``.ci/run`` installs it). Screenshots go to
``test-artifacts/dashboard/`` (git-ignored) so that the pages can be looked at after a run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# The checkout's root (this file is api/testing/browser.py).
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    """The system Chromium (``DPSWEEP_CHROMIUM`` overrides), or None."""
    env = os.environ.get("DPSWEEP_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A launched browser (Playwright ``Browser``); closed on exit."""
    # optional: playwright is a dev extra, for the dashboard's browser tests only
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    if path is None:
        raise RuntimeError(
            "no Chromium found for the dashboard's browser tests: install it with "
            "`apt-get install chromium` (.ci/run does) or set DPSWEEP_CHROMIUM"
        )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot as ``test-artifacts/dashboard/NAME.png``; its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
