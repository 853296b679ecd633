"""How fast the dashboard opens a big finished sweep, in a real headless Chromium.

It loads a finished sweep of ``--trials`` trials (default 2,000; the same real, bulk-finished
sweep as ``bench/api_load.py``: 4 arms x 5 epsilon levels) into a fresh SQLite database,
starts ``dpsweep serve`` on loopback (no scheduler, auth off) and opens the sweep's page in
the system Chromium (``api/testing/browser.py``), ``--repeats`` times in fresh browser tabs (the
first open of a version also builds the server's cached summary; later ones reuse it).

Per open it reports the wall time from navigation to:

* ``header_ms``: the sweep's name and progress drawn (``GET /sweeps/{id}``);
* ``eps_front_ms``: the epsilon-utility front drawn (``/pareto?x=epsilon``);
* ``calibration_ms``: the accuracy-vs-ECE scatter of every trial drawn (``/pareto?x=accuracy
  &y=ece``), the page's largest payload;
* ``trials_first_page_ms``: the trials tab's first rows drawn (``?tab=trials``, one page of
  500 trials), and ``trials_all_ms``: every trial loaded page by page.

The sweep's audited epsilon is stored for its plan first, as the driver does when it takes a
sweep (:func:`sweeper.privacy.releases.store_release`), so a server start does not compose the
grids again; ``--no-stored-release`` leaves it out (a sweep stored before migration 0009: the
first summary composes it, seconds).

It also reports the bytes of each API response the page fetched. The target is 2 s to open a
sweep of 2,000 trials on loopback (the fronts drawn); it is printed, not asserted.

Usage: ``python bench/dashboard_open.py [--trials N] [--repeats R] [--no-stored-release]
[--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from finished_sweep import load_finished_sweep  # noqa: E402

from api.testing.browser import chromium  # noqa: E402
from api.testing.server import start_server  # noqa: E402
from sweeper.privacy.releases import store_release  # noqa: E402
from sweeper.store.engine import make_engine  # noqa: E402
from sweeper.store.schema import upgrade  # noqa: E402

TARGET_MS = 2000.0


def open_sweep(browser: Any, base: str, sweep_id: str, total: int) -> dict[str, Any]:
    """Open the sweep page in a fresh tab; milliseconds to each milestone, and payloads."""
    ctx = browser.new_context(base_url=base, viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    sizes: dict[str, int] = {}

    def on_response(resp: Any) -> None:
        if "/api/v1/" in resp.url:
            with contextlib.suppress(Exception):  # a streamed or aborted body has none
                sizes[resp.url.split("/api/v1", 1)[1]] = len(resp.body())

    page.on("response", on_response)
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    page.goto(f"/sweeps/{sweep_id}")
    page.wait_for_selector("#sweep-progress .progress")
    out["header_ms"] = (time.perf_counter() - t0) * 1e3
    page.wait_for_selector("#eps-chart .scatterlayer .trace .point")
    out["eps_front_ms"] = (time.perf_counter() - t0) * 1e3
    page.wait_for_selector("#cal-chart .scatterlayer .trace .point")
    out["calibration_ms"] = (time.perf_counter() - t0) * 1e3
    drawn = page.evaluate(
        "document.querySelector('#cal-chart').data.filter(t => t.dpRole === 'trials')"
        ".reduce((a, t) => a + t.x.length, 0)"
    )
    if drawn != total:
        raise RuntimeError(f"the calibration chart shows {drawn} trials, not {total}")

    t1 = time.perf_counter()
    page.click("button[data-tab=trials]")
    page.wait_for_selector("#trials-table tbody tr")
    out["trials_first_page_ms"] = (time.perf_counter() - t1) * 1e3
    page.wait_for_function(
        f"document.querySelector('#trials-status').textContent.startsWith('{total} of {total}')",
        timeout=120_000,
    )
    out["trials_all_ms"] = (time.perf_counter() - t1) * 1e3
    out["bytes"] = dict(sizes)
    ctx.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--no-stored-release",
        action="store_true",
        help="do not store the sweep's release first (the server composes it)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dpsweep-bench-dash-") as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        upgrade(url)
        loaded = load_finished_sweep(url, args.trials)
        if not args.no_stored_release:
            engine = make_engine(url)
            try:
                store_release(engine, loaded.id)  # what the sweep's driver did at its start
            finally:
                engine.dispose()
        server = start_server(url, Path(tmp), scheduler=False, auth=False)
        try:
            with chromium() as browser:
                runs = [
                    open_sweep(browser, server.base, loaded.id, loaded.trials)
                    for _ in range(args.repeats)
                ]
        finally:
            server.stop()
    keys = [k for k in runs[0] if k.endswith("_ms")]
    result: dict[str, Any] = {
        "trials": loaded.trials,
        "repeats": args.repeats,
        "stored_release": not args.no_stored_release,
        "target_ms": TARGET_MS,
        "first": {k: round(runs[0][k]) for k in keys},
        "median": {k: round(statistics.median(r[k] for r in runs)) for k in keys},
        "bytes": runs[-1]["bytes"],
    }
    result["meets_target"] = result["first"]["calibration_ms"] <= TARGET_MS
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"dashboard: open a finished sweep of {loaded.trials} trials (ms)")
        print(f"{'milestone':<24}{'first open':>12}{'median':>10}")
        for k in keys:
            print(f"{k:<24}{result['first'][k]:>12}{result['median'][k]:>10}")
        print(
            f"target: fronts drawn within {TARGET_MS:.0f} ms on the first open: "
            f"{'met' if result['meets_target'] else 'NOT met'}"
        )
        for path, n in sorted(result["bytes"].items()):
            print(f"  {n:>9} B  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
