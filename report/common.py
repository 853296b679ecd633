"""What every experiment of the report shares: running a spec with dpsweep, reading it back,
and the tables and figure scaffolding.

Every number in the report comes from dpsweep's own released outputs: ``dpsweep run`` into a
fresh SQLite database (local Ray), ``dpsweep export --format json`` (the summary and the
released trials), and :func:`sweeper.sweeps.trial_detail.trial_detail` for a trial's bins and
trajectories.
A papernot-steinke sweep therefore shows only its selected trials, as it must.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from dpsweep.plan_fields import plan_field
from sweeper.datasets.access import Viewer
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.trial_detail import trial_detail

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
DPSWEEP = str(Path(sys.executable).with_name("dpsweep"))
SPECS = ROOT / "examples" / "report"
READINGS = Path(__file__).resolve().parent / "readings"
LOCAL = Viewer(owner=None, admin=True)
_UPGRADE_LOCK = threading.Lock()
# Set by :func:`one_process`: dpsweep's commands then run in this process, one at a time.
_IN_PROCESS = threading.Event()
_COMMAND_LOCK = threading.Lock()
# Set by :func:`reuse_runs`: a spec whose run is recorded in its directory is read back, not rerun.
_REUSE = threading.Event()
# One colour per arm name across every figure of the report.
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


@dataclass
class Run:
    """One sweep of an experiment, run and read back."""

    spec: dict[str, Any]
    summary: dict[str, Any]
    trials: list[dict[str, Any]]
    seconds: float
    details: dict[str, dict[str, Any]] = field(default_factory=dict)

    def done(self) -> list[dict[str, Any]]:
        """The finished (released) trials."""
        return [t for t in self.trials if t["state"] == "done"]

    def arms(self) -> list[str]:
        """The arms' names, in the spec's order."""
        return [a["name"] for a in self.spec["arms"]]

    def levels(self) -> list[float]:
        """The per-grid ε levels, in the spec's order."""
        return [float(e) for e in self.spec["privacy"]["budgets"]]

    def done_by_arm(self) -> dict[str, list[dict[str, Any]]]:
        """The finished (released) trials per arm, in the spec's arm order."""
        out: dict[str, list[dict[str, Any]]] = {a: [] for a in self.arms()}
        for t in self.done():
            out[t["arm"]].append(t)
        return out

    def results(self) -> dict[tuple[str, float], dict[str, Any]]:
        """dpsweep's best configuration per (arm, ε level): mean ± std over its seeds."""
        return {(r["arm"], float(r["epsilon_budget"])): r for r in self.summary["results"]}


def load(name: str, scale: str) -> dict[str, Any]:
    """The spec ``examples/report/<name>.yaml`` as a dict, :func:`shrink`-ed at tiny scale."""
    spec: dict[str, Any] = yaml.safe_load((SPECS / f"{name}.yaml").read_text())
    return shrink(spec) if scale == "tiny" else spec


def shrink(spec: dict[str, Any]) -> dict[str, Any]:
    """The tiny-scale version of a spec, so the whole pipeline runs in minutes: the same arms,
    at most 2 values per grid axis, the first and last ε level, at most 2 epochs and 2 seeds."""
    s = copy.deepcopy(spec)
    s["name"] = f"{s['name']}-tiny"
    budgets = s["privacy"]["budgets"]
    s["privacy"]["budgets"] = [budgets[0], budgets[-1]] if len(budgets) > 2 else budgets
    for arm in s["arms"]:
        for name, axis in (arm.get("grid") or {}).items():
            if isinstance(axis, list):
                arm["grid"][name] = axis[:2]
            else:
                axis["k"] = min(2, axis["k"])
    training = s.setdefault("training", {})
    training.pop("steps", None)
    training["epochs"] = min(2, training.get("epochs") or 2)
    training["eval_every"] = 5
    s["seeds"] = min(2, s.get("seeds", 1))
    return s


@contextlib.contextmanager
def one_process() -> Iterator[None]:
    """Run every ``dpsweep`` command of the experiments in this process, on one local Ray.

    By default each ``dpsweep run`` is its own process that starts (and stops) its own local
    Ray and Ray workers: about 15 s per sweep on 2 cores, which is most of a tiny sweep. Here
    Ray is started once (:func:`sweeper.driver.ray_backend.ray_session`, as ``dpsweep run``
    would), every command runs through :func:`api.cli.main` with the same arguments, and its
    sweeps reuse the warm Ray workers, as sweeps run by ``dpsweep serve`` do. Commands then run
    one at a time (their ``DPSWEEP_*`` settings and output are process-wide).
    """
    from sweeper.driver.ray_backend import ray_session
    from sweeper.settings import SweeperSettings

    with ray_session(SweeperSettings()):
        _IN_PROCESS.set()
        try:
            yield
        finally:
            _IN_PROCESS.clear()


@contextlib.contextmanager
def reuse_runs() -> Iterator[None]:
    """Read back the sweeps a kept earlier run recorded (``make_report.py --reuse DIR``).

    Each :func:`run_spec` records its sweep's id and wall time beside its database; inside this
    context a spec with such a record is exported again instead of being rerun, so the report's
    text (its readings) can be redrawn from the same sweeps without spending hours again.
    """
    _REUSE.set()
    try:
        yield
    finally:
        _REUSE.clear()


def dpsweep(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``dpsweep ARGS`` with extra environment ``env``: its exit code, stdout and stderr.

    A subprocess, or inside :func:`one_process` a call of :func:`api.cli.main` in this process.
    """
    if not _IN_PROCESS.is_set():
        p = subprocess.run(
            [DPSWEEP, *args],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        return p.returncode, p.stdout, p.stderr
    from api.cli import main

    out, err = io.StringIO(), io.StringIO()
    with (
        _COMMAND_LOCK,
        _environment(env or {}),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            rc = main(args)
        except SystemExit as exc:  # argparse's usage errors
            rc = exc.code if isinstance(exc.code, int) else 1
    return rc, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``env`` added, restored afterwards."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_spec(
    spec: dict[str, Any],
    work: Path,
    *,
    details: bool = False,
    workers: int | None = None,
    env: dict[str, str] | None = None,
) -> Run:
    """``dpsweep run`` the spec into ``work``'s database and read it back with
    ``dpsweep export``.

    Args:
        spec: the sweep spec.
        work: the experiment's directory (its database and plots).
        details: also read every released trial's detail (bins, trajectories, step time).
        workers: packs run at once (``--workers``; default one per CPU).
        env: extra ``DPSWEEP_*`` settings, e.g. ``DPSWEEP_MAX_PACK_SIZE=1`` so that each
            trial's step time is its own rather than its pack's.
    """
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    url = f"sqlite:///{work / 'report.db'}"
    with _UPGRADE_LOCK:  # Alembic's command context is process-global: one upgrade at a time.
        upgrade(url)
    record = work / f"{spec['name']}.run.json"
    if _REUSE.is_set() and record.exists():
        kept = json.loads(record.read_text())
        sweep_id, seconds = kept["id"], float(kept["seconds"])
    else:
        t0 = time.perf_counter()
        cmd = ["run", str(path), "--db", url, "--new", "--quiet", "--json"]
        cmd += ["--plots", str(work / "plots")]
        if workers is not None:
            cmd += ["--workers", str(workers)]
        rc, stdout, stderr = dpsweep(cmd, env)
        seconds = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"dpsweep run {path.name} failed:\n{stderr[-3000:]}")
        sweep_id = json.loads(stdout[stdout.index("{") :])["id"]
        record.write_text(json.dumps({"id": sweep_id, "seconds": seconds}))
    rc, exported, stderr = dpsweep(["export", sweep_id, "--db", url, "--format", "json"])
    if rc != 0:
        raise RuntimeError(f"dpsweep export {sweep_id} failed:\n{stderr[-3000:]}")
    data = json.loads(exported)
    run = Run(spec, data["sweep"], data["trials"], seconds)
    if details:
        engine = make_engine(url)
        try:
            for t in run.done():
                run.details[t["id"]] = trial_detail(engine, t["id"], LOCAL)
        finally:
            engine.dispose()
    return run


# ---------------------------------------------------------------------------------------------
# Text


def fmt(v: Any, digits: int = 4) -> str:
    """A table cell: ``–`` for missing, ``digits`` significant digits for floats."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def mean_std(values: list[float]) -> str:
    """``mean ± std`` (sample std; 0 for one value), ``–`` for none."""
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {sd:.3f}"


def params_text(params: dict[str, Any] | None) -> str:
    """``lr=0.316, clip=1`` (3 significant digits)."""
    return (
        ", ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in (params or {}).items()
        )
        or "–"
    )


_PLAN_COLUMNS = (
    "arm",
    "epsilon_budget",
    "trials",
    "noise_multiplier",
    "gradient_noise_multiplier",
    "steps_per_trial",
    "sample_rate",
    "epsilon_per_trial",
    "epsilon_total",
    "epsilon_verified",
)


def plan_table(run: Run) -> str:
    """The plan: per arm and ε level, trials, σ (and the gradient's σ_g after a noise split),
    steps, q, per-trial ε, the grid's ε and its verification by an independent accountant."""
    # Headers from the one declaration of the plan's public fields (dpsweep/plan_fields.py).
    labels = [plan_field(name).label for name in _PLAN_COLUMNS]
    rows = ["| " + " | ".join(labels) + " |", "|" + "---|" * len(labels)]
    for g in run.summary["plan"]:
        rows.append(
            f"| {g['arm']} | {fmt(g['epsilon_budget'])} | {g.get('trials', 'hidden')} | "
            f"{fmt(g['noise_multiplier'])} | {fmt(g.get('gradient_noise_multiplier'))} | "
            f"{g['steps_per_trial']} | {fmt(g['sample_rate'])} | "
            f"{fmt(g.get('epsilon_per_trial'))} | {fmt(g['epsilon_total'])} | "
            f"{fmt(g.get('epsilon_verified'))} ({g.get('verified_by', '')}) |"
        )
    return "\n".join(rows)


def spec_block(spec: dict[str, Any]) -> str:
    """The spec as it was run, in a YAML code block."""
    text = yaml.safe_dump(spec, sort_keys=False, default_flow_style=None, width=100)
    return "```yaml\n" + text.strip() + "\n```"


def reading(name: str, scale: str) -> list[str]:
    """The hand-written reading of a full-scale run (``report/readings/<name>.md``).

    A reading interprets the committed full-scale numbers, so a tiny run gets none.
    """
    path = READINGS / f"{name}.md"
    if scale != "full" or not path.exists():
        return []
    return ["**Reading.**", "", path.read_text().strip(), ""]


# ---------------------------------------------------------------------------------------------
# Figures


def figure(cols: int, rows: int = 1, *, width: float = 4.4, height: float = 3.6) -> Figure:
    """A matplotlib figure with the Agg canvas (no display, no global pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * cols, height * rows))
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, path: Path) -> str:
    """Save small (90 dpi PNG); returns the markdown image link relative to ``docs/``."""
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return f"![{path.stem}](figures/{path.name})"
