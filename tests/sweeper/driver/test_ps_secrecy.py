"""papernot-steinke secrecy: nothing a user sees may depend on a grid's secret number of runs K
except through the one trial it releases (Papernot & Steinke 2022).

The key test runs two real sweeps (local Ray, SQLite) whose K is forced to differ, collects
every user-visible output of each (summaries, ``dpsweep show``, exports, trial pages and
details, metric histories, events as the SSE route serves them, ledger entries, budget views,
the CLI's progress display, the REST API itself) and asserts that their *shapes* are identical:
JSON structure with leaves replaced by their type, except integers and plain strings, which are
compared as they are (a count, a run index or a note with a number in it would differ); only
ids, timestamps, floats and a few values that depend on the data of the released run (named
in ``DATA_KEYS``) are normalised. A third pair of sweeps is cancelled mid-run.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import io
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import sweeper.sweeps.create as sweeps_mod
from api.cli import main
from api.cli.run import _progress_view
from api.cli.sweeps import cancel_message
from dpsweep.errors import ConfigError, TrialNotFound
from sweeper.datasets.access import Viewer
from sweeper.datasets.views import budget
from sweeper.driver.loop import run_sweep
from sweeper.driver.progress import Snapshot, format_elapsed
from sweeper.driver.ray_backend import ray_session
from sweeper.privacy.charges import ps_charge_note
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.ledger.rows import EntryKind
from sweeper.settings import SweeperSettings
from sweeper.store import Sweep, SweepState, Trial, TrialResultRow, TrialState
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.events import read_events
from sweeper.sweeps.export import export_sweep
from sweeper.sweeps.lifecycle import PS_CANCEL_NOTE, cancel_sweep
from sweeper.sweeps.released import released_records
from sweeper.sweeps.stored import grid_key, load_sweep
from sweeper.sweeps.summary import list_sweeps, summarize
from sweeper.sweeps.sweep_pages import page_sweeps, sweep_head
from sweeper.sweeps.trial_detail import metric_history, trial_detail
from sweeper.sweeps.trial_pages import page_trials
from tests.sweeper.sweeps.test_sweep import digits_key, tiny_spec

ADMIN = Viewer(owner=None, admin=True)

# Leaves that legitimately depend on the data the released run trained on (which run was
# selected, and how it went), not on K: normalised to their type like floats.
DATA_KEYS = frozenset(
    {
        "best_step",  # the selected run's best checkpoint (step 10 or 20)
        "diverged_at",
        "dominated",  # Pareto membership of the released results
        "params",  # the selected run's hyperparameters (an independent draw)
        "best_params",
    }
)
HEX_ID = re.compile(r"^[0-9a-f]{32}$")
TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
BOX = re.compile(r"[\u2500-\u257f]")
FLOAT_TEXT = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")


def _cursor(value: str) -> Any:
    raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    return {"cursor": shape(json.loads(raw))}


def shape(x: Any, key: str | None = None) -> Any:
    """``x`` with ids, timestamps, floats and data-dependent leaves replaced by placeholders;
    integers, booleans, None and other strings kept as they are."""
    if key in DATA_KEYS and x is not None:
        return f"<{key}>"
    if key == "reliability" and isinstance(x, list):
        # The selected run's calibration bins: how many, with which fields (an empty bin's
        # accuracy is None: data, not K).
        return [sorted(b) for b in x]
    if isinstance(x, dict):
        return {str(k): shape(v, str(k)) for k, v in sorted(x.items())}
    if isinstance(x, list | tuple):
        return [shape(v, key) for v in x]
    if isinstance(x, bool) or x is None:
        return x
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        return "<float>"
    if isinstance(x, str):
        if key in ("next_cursor", "cursor") and x:
            return _cursor(x)
        if HEX_ID.match(x):
            return "<id>"
        if TIMESTAMP.match(x):
            return "<ts>"
        return HEX_RUN.sub("<id>", x)
    return f"<{type(x).__name__}>"


HEX_RUN = re.compile(r"[0-9a-f]{32}")


def text_shape(text: str) -> list[str]:
    """Printed text with ids, floats, elapsed times and table drawing normalised; integers
    stay (a count of runs would show)."""
    out = []
    for line in text.splitlines():
        line = BOX.sub(" ", HEX_RUN.sub("<id>", line))
        line = re.sub(r"elapsed [0-9hms]+", "elapsed <t>", line)
        line = FLOAT_TEXT.sub("<float>", line)
        line = re.sub(r"lr=\S+", "lr=<param>", line)
        line = line.replace("★", "")  # Pareto membership: data, like "dominated"
        # Which searches run at a given moment is timing (a grid's search ends when it
        # releases, which users see anyway), not a count: the grids named are normalised.
        line = re.sub(
            r"papernot-steinke grids? [^(]+ running", "papernot-steinke <grids> running", line
        )
        line = " ".join(line.split())
        if line:
            out.append(line)
    return out


#: The hyperparameters' CSV columns of the sweeps below (their values are drawn at random).
PARAM_COLUMNS = ("lr", "clip")


def csv_shape(text: str) -> list[dict[str, Any]]:
    rows = list(csv.DictReader(io.StringIO(text)))
    out = []
    for row in rows:
        cells: dict[str, Any] = {}
        for k, v in row.items():
            if k in PARAM_COLUMNS:
                cells[k] = "<param>"
            elif re.fullmatch(r"-?\d+", v or ""):
                cells[k] = int(v)
            elif FLOAT_TEXT.fullmatch(v or "") or re.fullmatch(r"-?\d+(\.\d*)?e[-+]?\d+", v or ""):
                cells[k] = "<float>"
            else:
                cells[k] = shape(v, k)
        out.append(cells)
    return [{"header": list(rows[0].keys()) if rows else []}, *out]


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def local_ray() -> Any:
    import ray

    with ray_session(SweeperSettings(), workers=2):
        yield ray


def ps_spec(**over: Any) -> dict[str, Any]:
    """Two papernot-steinke grids (one arm, two levels) of a tiny logistic regression."""
    base: dict[str, Any] = {
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1, 0.5], "clip": [1.0]}}],
        "privacy": {
            "budgets": [3, 8],
            "delta": 1e-5,
            "accounting": "papernot-steinke",
            "distribution": {"name": "poisson"},
        },
        "search": {"method": "random", "n": 3},
    }
    return tiny_spec(**(base | over))


def fresh_engine(path: Path) -> tuple[Any, str]:
    url = f"sqlite:///{path}"
    upgrade(url)
    return make_engine(url), url


def create_with_runs(engine: Any, spec: dict[str, Any], runs: int) -> str:
    """A sweep whose every papernot-steinke grid draws exactly ``runs`` runs."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sweeps_mod, "draw_run_count", lambda *a, **k: runs)
        return create_sweep(engine, spec)


@dataclasses.dataclass
class World:
    """One database with one sweep, run to its end, and what was printed while it ran."""

    k: int
    engine: Any
    url: str
    sweep_id: str
    progress: list[str]
    outcome: dict[str, Any]


def _render(snap: Snapshot) -> list[str]:
    console_file = io.StringIO()
    from rich.console import Console

    Console(file=console_file, width=200, color_system=None).print(_progress_view(snap, "tiny"))
    return text_shape(console_file.getvalue())


def run_world(tmp: Path, k: int) -> World:
    engine, url = fresh_engine(tmp / f"k{k}.db")
    sid = create_with_runs(engine, ps_spec(), k)
    snaps: list[Snapshot] = []
    out = run_sweep(engine, sid, on_progress=snaps.append)
    lines = sorted({line for s in snaps for line in _render(s)})
    return World(k, engine, url, sid, lines, {"state": out.state, "counts": out.counts})


@pytest.fixture(scope="module")
def worlds(local_ray: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[World]]:
    tmp = tmp_path_factory.mktemp("ps")
    ws = [run_world(tmp, 2), run_world(tmp, 6)]
    yield ws
    for w in ws:
        w.engine.dispose()


def outputs(w: World, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Every output a user can get of ``w``'s sweep, through sweeper's read functions and the
    CLI (the API's routes are thin wrappers of the same functions; see test_api_* below)."""
    from api.views import SummaryCache, pareto

    e, sid = w.engine, w.sweep_id
    out: dict[str, Any] = {"outcome": w.outcome, "progress": w.progress}
    out["summary"] = summarize(e, sid)
    capsys.readouterr()
    assert main(["show", sid, "--db", w.url, "--json"]) == 0
    out["show_json"] = json.loads(capsys.readouterr().out)
    assert main(["show", sid, "--db", w.url]) == 0
    out["show_text"] = text_shape(capsys.readouterr().out)
    assert main(["sweeps", "--db", w.url, "--json"]) == 0
    out["sweeps_json"] = json.loads(capsys.readouterr().out)
    out["export_json"] = json.loads(export_sweep(e, sid, fmt="json"))
    out["export_csv"] = csv_shape(export_sweep(e, sid, fmt="csv"))
    out["sweep_page"] = dataclasses.asdict(page_sweeps(e, ADMIN))
    out["head"] = dataclasses.asdict(sweep_head(e, sid, ADMIN))
    pages: dict[str, Any] = {}
    for sort in ("number", "objective"):
        pages[sort] = dataclasses.asdict(page_trials(e, sid, ADMIN, sort=sort))
        # One at a time, following the cursors: a cursor must not encode a position either.
        chain, cursor = [], None
        while True:
            page = page_trials(e, sid, ADMIN, sort=sort, limit=1, cursor=cursor)
            chain.append(dataclasses.asdict(page))
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        pages[f"{sort}_by_one"] = chain
    for state in ("done", "failed", "cancelled", "pending"):
        pages[state] = dataclasses.asdict(page_trials(e, sid, ADMIN, state=state))
    out["trial_pages"] = pages
    items = pages["number"]["items"]
    out["trial_detail"] = [trial_detail(e, t["id"], ADMIN) for t in items]
    out["metric_history"] = [metric_history(e, t["id"], ADMIN) for t in items]
    out["events"] = [dataclasses.asdict(ev) for ev in read_events(e, sid)]
    out["ledger"] = [
        {
            "kind": x.kind.value,
            "epsilon": float(x.epsilon),
            "delta": float(x.delta),
            "note": x.note,
            "trial": x.trial_id,
        }
        for x in BudgetLedger(e).entries(digits_key(e), sid)
    ]
    out["dataset_budget"] = budget(e, "digits", ADMIN)
    entry = SummaryCache().get(e, sid, ADMIN)
    out["cached"] = {"summary": entry.summary, "etag": entry.etag}
    for name, x, y in (
        ("pareto_epsilon", "epsilon", None),
        ("pareto_calibration", "accuracy", "ece"),
    ):
        try:
            out[name] = pareto(entry, sid, x=x, y=y)
        except ConfigError as exc:  # nothing released records an ece
            out[name] = {"error": str(exc)}
    out["sweeps"] = list_sweeps(e)
    return out


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two shapes differ (paths), to say what leaked."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only one side" for k in a.keys() ^ b.keys()]
        for k in a.keys() & b.keys():
            out += _differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def assert_same_shape(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    diffs = [d for key in a for d in _differences(shape(a[key]), shape(b[key]), key)]
    assert diffs == []


# ---------------------------------------------------------------------------------------------
# The key test


def test_outputs_have_the_same_shape_whatever_k(
    worlds: list[World], capsys: pytest.CaptureFixture[str]
) -> None:
    small, big = worlds
    for w in worlds:
        with Session(w.engine) as s:
            n = s.scalar(sa.select(sa.func.count(Trial.id)).where(Trial.sweep_id == w.sweep_id))
        assert n == 2 * w.k  # K really differs: two grids of K runs each
        assert w.outcome["state"] == "done"
    a, b = outputs(small, capsys), outputs(big, capsys)
    assert_same_shape(a, b)
    # And what the shapes rest on: each grid released its selected trial, with no position.
    assert len(a["trial_pages"]["number"]["items"]) == 2
    for t in a["trial_pages"]["number"]["items"] + b["trial_pages"]["number"]["items"]:
        assert t["number"] == 0 and t["started_at"] is None and t["finished_at"] is None
        # Its pack's wall time: packs grow with the runs left, and a cold worker is slower.
        assert t["train_seconds"] is None
    for d in a["trial_detail"] + b["trial_detail"]:
        assert d["worker"] is None and d["step_time_ms_median"] is None
        (charge,) = d["privacy"]["charges"]
        assert charge["at"] is None and charge["note"].startswith("papernot-steinke grid ")
    # The progress display shows elapsed time and which searches run, never a count.
    for line in a["progress"] + b["progress"]:
        assert not re.search(r"\b(done|ETA|trial\(s\)|step)\b", line), line
    assert any("papernot-steinke <grids> running" in line for line in a["progress"])


def test_one_ledger_charge_per_grid_naming_no_run(worlds: list[World]) -> None:
    for w in worlds:
        with Session(w.engine) as s:
            sweep = s.get(Sweep, w.sweep_id)
            assert sweep is not None
            plan = list(sweep.plan or [])
            grid_of = {
                t.id: grid_key(t.arm, t.epsilon_budget)
                for t in s.scalars(sa.select(Trial).where(Trial.sweep_id == w.sweep_id))
            }
        charges = [
            e
            for e in BudgetLedger(w.engine).entries(digits_key(w.engine), w.sweep_id)
            if e.kind == EntryKind.CHARGE
        ]
        # Exactly one entry per grid, after K runs each, holding the grid's whole total.
        assert sorted(grid_of[str(e.trial_id)] for e in charges) == sorted(g["grid"] for g in plan)
        for e in charges:
            grid = grid_of[str(e.trial_id)]
            assert e.note == ps_charge_note(grid)
            assert not re.search(r"\brun\s*\d", e.note)
            total = next(g["epsilon_total"] for g in plan if g["grid"] == grid)
            assert float(e.epsilon) == pytest.approx(total, rel=1e-12)
        bal = BudgetLedger(w.engine).sweep_balance(digits_key(w.engine), sweep_id=w.sweep_id)
        assert bal.epsilon_outstanding == 0 and bal.epsilon_charged == bal.epsilon_reserved


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
def test_api_serves_the_same_shapes_whatever_k(worlds: list[World]) -> None:
    """GET the sweep, its trials, results, fronts, events, trial pages and budget through the
    real FastAPI app (in process: K is forced by patching the draw, which a server process
    would not see) for both sweeps, and compare the shapes of the responses."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.settings import ApiSettings

    def collect(w: World) -> dict[str, Any]:
        app = create_app(ApiSettings(auth=False, planner_processes=1), database_url=w.url)
        out: dict[str, Any] = {}
        with TestClient(app) as c:
            base = f"/api/v1/sweeps/{w.sweep_id}"
            for name, path in (
                ("sweep", base),
                ("results", f"{base}/results"),
                ("pareto", f"{base}/pareto"),
                ("calibration", f"{base}/pareto?x=accuracy&y=ece"),
                ("trials", f"{base}/trials"),
                ("trials_by_objective", f"{base}/trials?sort=objective"),
                ("trials_one", f"{base}/trials?limit=1"),
                ("trials_pending", f"{base}/trials?state=pending"),
                ("sweeps", "/api/v1/sweeps"),
                ("budget", "/api/v1/datasets/digits/budget"),
            ):
                r = c.get(path)
                assert r.status_code == 200, (path, r.text)
                out[name] = {"body": r.json(), "etag": r.headers.get("etag")}
            for t in out["trials"]["body"]["items"]:
                for sub in ("", "/metrics"):
                    r = c.get(f"/api/v1/trials/{t['id']}{sub}")
                    assert r.status_code == 200, r.text
                    out.setdefault("trial", []).append(r.json())
            with c.stream("GET", f"{base}/events") as r:
                assert r.status_code == 200
                out["events"] = [line for line in r.iter_lines() if line]
            # Hidden trials are not found, and say nothing more than an unknown id does.
            with Session(w.engine) as s:
                ids = set(s.scalars(sa.select(Trial.id).where(Trial.sweep_id == w.sweep_id)))
            shown = {t["id"] for t in out["trials"]["body"]["items"]}
            missing = [c.get(f"/api/v1/trials/{i}") for i in sorted(ids - shown)]
            assert all(r.status_code == 404 for r in missing)
            unknown = c.get(f"/api/v1/trials/{'0' * 32}").json()
            assert {json.dumps(shape(r.json())) for r in missing} <= {json.dumps(shape(unknown))}
        return out

    a, b = (collect(w) for w in worlds)
    # SSE lines: "id: N", "event: kind", "data: {...}" (ids kept: they count events).
    for side in (a, b):
        side["events"] = [
            shape(json.loads(line[6:])) if line.startswith("data: ") else line
            for line in side["events"]
        ]
    assert_same_shape(a, b)


# ---------------------------------------------------------------------------------------------
# Cancels


def _wait(cond: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _cancel_mid_run(tmp: Path, k: int) -> tuple[World, dict[str, Any]]:
    """A one-grid sweep of ``k`` slow runs, cancelled as soon as its search was charged."""
    engine, url = fresh_engine(tmp / f"cancel{k}.db")
    spec = ps_spec(
        training={"steps": 400, "batch_size": 64, "eval_every": 200},
        privacy={
            "budgets": [4],
            "delta": 1e-5,
            "accounting": "papernot-steinke",
            "distribution": {"name": "poisson"},
        },
    )
    sid = create_with_runs(engine, spec, k)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(out=run_sweep(engine, sid)))
    thread.start()

    def charged() -> bool:
        return any(
            e.kind == EntryKind.CHARGE
            for e in BudgetLedger(engine).entries(digits_key(engine), sid)
        )

    try:
        _wait(charged)
        response = cancel_sweep(engine, sid)
    finally:
        thread.join(timeout=300)
    with Session(engine) as s:
        states = list(s.scalars(sa.select(Trial.state).where(Trial.sweep_id == sid)))
    assert TrialState.cancelled in states  # the search was really cut short
    out = result["out"]
    return World(k, engine, url, sid, [], {"state": out.state, "counts": out.counts}), response


def test_cancel_mid_run_counts_nothing_and_releases_nothing(
    local_ray: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (w3, r3), (w6, r6) = _cancel_mid_run(tmp_path, 3), _cancel_mid_run(tmp_path, 6)
    assert shape(r3) == shape(r6)
    assert r3["cancelled_pending"] == r3["stopped_running"] == 0
    assert r3["papernot_steinke"] == PS_CANCEL_NOTE
    # The grid's search had started: charged in full, nothing released back, nothing shown.
    assert r3["released_epsilon"] == 0.0
    a, b = outputs(w3, capsys), outputs(w6, capsys)
    assert_same_shape(a, b)
    for side in (a, b):
        assert side["summary"]["results"] == [] and side["trial_pages"]["number"]["items"] == []
        assert side["summary"]["state"] == "cancelled"
        assert side["summary"]["budget"]["epsilon_charged"] == pytest.approx(
            side["summary"]["plan"][0]["epsilon_total"], rel=1e-12
        )
    # What the CLI prints for it.
    msg = cancel_message("S", r3)
    assert PS_CANCEL_NOTE in msg and "trial(s)" not in msg
    for w in (w3, w6):
        w.engine.dispose()


def test_cancel_before_running_counts_no_ps_trials(tmp_path: Path) -> None:
    responses = []
    for k in (2, 6):
        engine, _ = fresh_engine(tmp_path / f"pending{k}.db")
        sid = create_with_runs(engine, ps_spec(), k)
        reserved = (
            BudgetLedger(engine).sweep_balance(digits_key(engine), sweep_id=sid).epsilon_reserved
        )
        r = cancel_sweep(engine, sid)
        assert r["released_epsilon"] == float(reserved)  # no search had started
        assert summarize(engine, sid)["trials"] == {s.value: 0 for s in TrialState}
        responses.append(r)
        engine.dispose()
    assert responses[0] == responses[1]
    assert responses[0]["cancelled_pending"] == 0 and responses[0]["stopped_running"] == 0
    # A compose sweep still counts its trials, and says nothing of papernot-steinke.
    engine, _ = fresh_engine(tmp_path / "compose.db")
    r = cancel_sweep(engine, create_sweep(engine, tiny_spec()))
    assert r["cancelled_pending"] == 6 and r["papernot_steinke"] is None
    engine.dispose()


# ---------------------------------------------------------------------------------------------
# Units: rows, release rule, crash policy, progress


def test_ps_rows_hide_their_position(tmp_path: Path) -> None:
    from dpsweep.spec import load_spec

    # In the order they are drawn (j = 0..K-1): nothing in a row follows j.
    spec = load_spec(ps_spec(seeds=3))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sweeps_mod, "draw_run_count", lambda *a, **k: 60)
        # Only the grid's planned mean number of runs is read from its plan.
        grid = SimpleNamespace(trials=6)
        rows = sweeps_mod._arm_trials(spec, spec.arms[0], grid)  # type: ignore[arg-type]
    assert len(rows) == 60
    assert all(r["number"] == 0 and r["config"] == 0 for r in rows)
    seeds = [r["seed"] for r in rows]
    assert set(seeds) <= {0, 1, 2}
    # Drawn, not j % seeds: 60 uniform draws from 3 follow that one sequence with chance
    # 3**-60, and are all equal with chance 3**-59.
    assert seeds != [j % 3 for j in range(60)] and len(set(seeds)) > 1
    # Stored as drawn.
    engine, _ = fresh_engine(tmp_path / "rows.db")
    sid = create_with_runs(engine, ps_spec(seeds=3), 60)
    with Session(engine) as s:
        stored = list(s.scalars(sa.select(Trial).where(Trial.sweep_id == sid)))
    assert len(stored) == 120
    assert all(t.number == 0 and t.config == 0 for t in stored)
    assert {t.seed for t in stored} <= {0, 1, 2}
    # Other accountings keep their grid order.
    sid2 = create_sweep(engine, tiny_spec())
    with Session(engine) as s:
        numbers = sorted(
            (t.arm, t.epsilon_budget, t.number)
            for t in s.scalars(sa.select(Trial).where(Trial.sweep_id == sid2))
        )
    assert [n for _, _, n in numbers] == [0, 0, 0, 1, 0, 1]
    engine.dispose()


def _finish(session: Session, t: Trial, state: TrialState, accuracy: float | None) -> None:
    now = datetime.now(UTC)
    t.state = state
    t.attempts = 1
    t.started_at, t.finished_at, t.train_seconds = now, now, 1.0
    if accuracy is not None:
        session.add(
            TrialResultRow(
                trial_id=t.id,
                metrics={"accuracy": accuracy},
                final_metrics={},
                steps=20,
                trajectories={},
                objective=accuracy,
            )
        )


def test_a_cancelled_search_releases_nothing(tmp_path: Path) -> None:
    engine, _ = fresh_engine(tmp_path / "release.db")
    spec = ps_spec(privacy=ps_spec()["privacy"] | {"budgets": [4]})
    sid = create_with_runs(engine, spec, 4)
    with Session(engine) as s, s.begin():
        trials = list(s.scalars(sa.select(Trial).where(Trial.sweep_id == sid)))
        ids = sorted(t.id for t in trials)
        for t in trials:
            # Two tie for best: the larger id (random) wins, not a position.
            acc = 0.9 if t.id in ids[:2] else 0.5
            _finish(s, t, TrialState.done, acc)
        s.get(Sweep, sid).state = SweepState.done  # type: ignore[union-attr]

    def released() -> list[dict[str, Any]]:
        return released_records(load_sweep(engine, sid), metric="accuracy", mode="max")

    (rec,) = released()
    assert rec["id"] == ids[1] and rec["number"] == 0
    assert rec["started_at"] is None and rec["finished_at"] is None
    assert rec["train_seconds"] is None
    assert trial_detail(engine, ids[1], ADMIN)["started_at"] is None
    # A failed run is part of the search's outcome: still released.
    with Session(engine) as s, s.begin():
        row = s.get(Trial, ids[3])
        assert row is not None
        row.state = TrialState.failed
    assert [r["id"] for r in released()] == [ids[1]]
    # A cancelled run means the search was cut short: nothing is released, anywhere.
    with Session(engine) as s, s.begin():
        row = s.get(Trial, ids[2])
        assert row is not None
        row.state = TrialState.cancelled
    assert released() == []
    assert summarize(engine, sid)["results"] == []
    assert page_trials(engine, sid, ADMIN).items == []
    with pytest.raises(TrialNotFound):
        trial_detail(engine, ids[1], ADMIN)
    with pytest.raises(TrialNotFound):
        metric_history(engine, ids[1], ADMIN)
    engine.dispose()


def _dead_driver() -> str:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return f"{socket.gethostname()}:{proc.pid}"


@pytest.mark.parametrize("started", [True, False])
def test_crash_policy_with_one_charge_per_grid(
    local_ray: Any, tmp_path: Path, started: bool
) -> None:
    """A driver died with two runs of a papernot-steinke grid claimed. If the grid's search had
    started (its one charge written), neither may run again, even the one that holds no entry:
    the ledger cannot tell whether it touched data. If not, both go back to the queue."""
    engine, _ = fresh_engine(tmp_path / "crash.db")
    spec = ps_spec(privacy=ps_spec()["privacy"] | {"budgets": [4]})
    sid = create_with_runs(engine, spec, 3)
    with Session(engine) as s, s.begin():
        sweep = s.get(Sweep, sid)
        assert sweep is not None
        plan = list(sweep.plan or [])
        sweep.state = SweepState.running
        sweep.driver = _dead_driver()
        sweep.heartbeat_at = datetime.now(UTC) - timedelta(hours=1)
        trials = sorted(
            s.scalars(sa.select(Trial).where(Trial.sweep_id == sid)), key=lambda t: t.id
        )
        first, second, third = (t.id for t in trials)
        for t in trials[:2]:
            t.state, t.attempts, t.started_at = TrialState.running, 1, datetime.now(UTC)
    if started:
        from sweeper.privacy.charges import ChargeSchedule

        e, d = ChargeSchedule.from_json(plan[0]["charges"]).charge_for_run(1)
        BudgetLedger(engine).charge(
            digits_key(engine),
            sweep_id=sid,
            trial_id=first,
            epsilon=e,
            delta=d,
            note=ps_charge_note(plan[0]["grid"]),
        )
    assert run_sweep(engine, sid).state == "done"
    with Session(engine) as s:
        got = {t.id: t for t in s.scalars(sa.select(Trial).where(Trial.sweep_id == sid))}
    assert got[third].state == TrialState.done and got[third].attempts == 1
    for tid in (first, second):
        if started:
            assert got[tid].state == TrialState.failed and got[tid].attempts == 1
            assert "do not re-run" in (got[tid].error or "")
        else:
            assert got[tid].state == TrialState.done and got[tid].attempts == 1
    charges = [
        e
        for e in BudgetLedger(engine).entries(digits_key(engine), sid)
        if e.kind == EntryKind.CHARGE
    ]
    assert len(charges) == 1 and charges[0].note == ps_charge_note(plan[0]["grid"])
    # Failed runs are part of the search: the grid still releases its best finished run.
    assert len(summarize(engine, sid)["results"]) == 1
    engine.dispose()


def test_progress_view_of_a_papernot_steinke_sweep_shows_no_counts() -> None:
    snap = Snapshot(
        counts={"done": 0, "running": 0, "pending": 0},
        total=0,
        best={},
        elapsed=80.4,
        eta=None,
        hidden_grids=2,
        metric="accuracy",
        last_event="papernot-steinke grid fixed@3 running (elapsed 1m20s)",
        searching=("fixed@3",),
    )
    text = "\n".join(_render(snap))
    assert "elapsed <t>" in text and "papernot-steinke <grids> running" in text
    assert not re.search(r"\b(done|running \d|failed|ETA)\b", text)
    assert format_elapsed(80.4) == "1m20s" and format_elapsed(7) == "7s"
    assert format_elapsed(3725) == "1h02m05s"
