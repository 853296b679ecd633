"""The web dashboard: a single page of static files served by ``dpsweep serve`` at ``/``.

Everything it needs ships in this package (no CDN, no build step): ``static/index.html``,
the page's modules, its stylesheet and a vendored Plotly.js (basic bundle, MIT). The page
talks only to ``/api/v1`` with the bearer token kept in the browser session.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
# The page's own paths: each serves index.html, whose router draws the view from the URL, so a
# link (with its query string of filters and tab) reproduces what its sender saw.
PAGES = (
    "/",
    "/sweeps",
    "/sweeps/{sweep_id}",
    "/trials/{trial_id}",
    "/datasets",
    "/submit",
    "/signin",
)


def install(app: FastAPI) -> None:
    """Serve the dashboard's pages and ``/static`` assets (left out of the OpenAPI document)."""
    router = APIRouter(include_in_schema=False)

    def page() -> FileResponse:
        # no-cache: the browser revalidates (ETag) so a new release's page is picked up.
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    for path in PAGES:
        router.add_api_route(path, page, methods=["GET"], name=f"page:{path}")
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
