"""Time to a first result: a one-trial sweep through dpsweep against a plain Opacus script.

One trial (digits, ``mlp``, one epoch at batch 64, ``fixed`` clipping at epsilon 3, evaluated
every ``EVAL_EVERY`` steps) is timed three ways in the same run, each from a cold process:

* ``cli_s``: ``dpsweep run SPEC --quiet`` in a fresh directory with a fresh SQLite database, as a
  subprocess, until it exits (planning, Ray start, the trial, results, plots, shutdown);
* ``serve_warm_s``: ``dpsweep serve`` (SQLite, no auth) is started and one sweep of the spec is
  submitted and waited for (untimed: the server's start and its first sweep warm Ray and the
  workers); then a second identical sweep is timed from its ``POST /api/v1/sweeps`` until its
  summary reads ``done`` with a result;
* ``opacus_script_s``: ``bench/opacus_trial.py`` (the same data, model, batch, sample rate, steps,
  noise multiplier from dpsweep's plan, and evaluation schedule, written with Opacus only) as a
  subprocess, its Python start-up and imports included.

It prints ``{"cli_s", "serve_warm_s", "opacus_script_s"}``, the ratios ``cli_ratio`` and
``serve_warm_ratio`` (each over ``opacus_script_s``) and ``targets`` (serve_warm <= 1.0x, cli
<= 2x; printed, not asserted). With ``--repeats R`` each figure is the median of R runs,
interleaved. ``--smoke`` shrinks the trial to 4 steps (for the tests).

Usage: ``python bench/first_result.py [--json] [--repeats R] [--smoke]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cli_runs import DPSWEEP, cli_env, run_checked  # noqa: E402

TARGETS = {"serve_warm_ratio": 1.0, "cli_ratio": 2.0}
EVAL_EVERY = 11


def spec_yaml(*, smoke: bool) -> str:
    """The one-trial sweep; ``smoke``: a 4-step trial (batch 360, one epoch)."""
    batch = 360 if smoke else 64
    every = 2 if smoke else EVAL_EVERY
    return (
        "name: first-result\n"
        "dataset: {name: digits, test_fraction: 0.2}\n"
        "model: {name: mlp}\n"
        f"training: {{epochs: 1, batch_size: {batch}, optimizer: sgd, eval_every: {every}}}\n"
        "privacy: {budgets: [3], delta: 1.0e-5}\n"
        "arms:\n"
        "  - strategy: fixed\n"
        "    grid: {lr: [0.5], clip: [1.0]}\n"
        "seeds: 1\n"
        "search: {method: grid}\n"
        "objective: {metric: accuracy, mode: max}\n"
    )


def plan(spec_path: Path, work: Path) -> dict[str, Any]:
    """dpsweep's plan of the one grid (``dpsweep plan --json``): steps, sample rate, sigma."""
    out = run_checked(
        [DPSWEEP, "plan", "--json", str(spec_path), "--db", f"sqlite:///{work / 'plan.db'}"],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=work,
    )
    return dict(json.loads(out.stdout)[0])


def time_cli(spec_path: Path, work: Path) -> float:
    """Wall time of ``dpsweep run`` in a fresh directory with a fresh SQLite database."""
    d = Path(tempfile.mkdtemp(dir=work))
    t0 = time.perf_counter()
    run_checked(
        [DPSWEEP, "run", str(spec_path), "--quiet", "--db", f"sqlite:///{d / 'run.db'}"],
        cwd=d,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def time_opacus(trial: dict[str, Any]) -> float:
    """Wall time of the plain Opacus script as a subprocess (start-up and imports included)."""
    t0 = time.perf_counter()
    run_checked(
        [sys.executable, str(ROOT / "bench" / "opacus_trial.py"), json.dumps(trial)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def _submit_and_wait(client: Any, spec: str, timeout: float = 600.0) -> float:
    """Submit ``spec`` and poll until its summary is ``done`` with a result; seconds taken."""
    t0 = time.perf_counter()
    r = client.post("/api/v1/sweeps", content=spec, headers={"Content-Type": "application/yaml"})
    r.raise_for_status()
    sid = r.json()["id"]
    while True:
        s = client.get(f"/api/v1/sweeps/{sid}").json()
        if s["state"] == "done" and s.get("results"):
            return time.perf_counter() - t0
        if s["state"] in ("failed", "cancelled"):
            raise RuntimeError(f"sweep {sid} {s['state']}")
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError(f"sweep {sid} still {s['state']} after {timeout} s")
        # A tight poll: the figure is the time until the result is readable.
        time.sleep(0.02)


def main() -> None:
    """Run the bench; print the figures (``--json``: one JSON object)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=1, help="runs per figure (median)")
    ap.add_argument("--smoke", action="store_true", help="a 4-step trial, for the tests")
    a = ap.parse_args()

    from api.testing.server import start_server

    spec = spec_yaml(smoke=a.smoke)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spec_path = work / "first-result.yaml"
        spec_path.write_text(spec)
        p = plan(spec_path, work)
        trial = {
            "model": "mlp",
            "lr": 0.5,
            "clip": 1.0,
            "sigma": p["gradient_noise_multiplier"],
            "steps": p["steps_per_trial"],
            "sample_rate": p["sample_rate"],
            "batch_size": 360 if a.smoke else 64,
            "eval_every": 2 if a.smoke else EVAL_EVERY,
            "seed": 0,
            "test_fraction": 0.2,
        }
        # The server keeps the defaults a user gets (poll interval and all): start_server's
        # test-speed settings are undone here.
        server = start_server(
            f"sqlite:///{work / 'serve.db'}",
            work,
            workers=1,
            auth=False,
            env={
                "DPSWEEP_POLL_SECONDS": "0.25",
                "DPSWEEP_HEARTBEAT_SECONDS": "2.0",
                "DPSWEEP_SSE_POLL_SECONDS": "1.0",
            },
        )
        cli, serve, opacus = [], [], []
        try:
            with server.client() as c:
                _submit_and_wait(c, spec)  # warm-up: Ray, the workers and their imports
                for _ in range(a.repeats):
                    opacus.append(time_opacus(trial))
                    serve.append(_submit_and_wait(c, spec))
                    cli.append(time_cli(spec_path, work))
        finally:
            server.stop()

    out: dict[str, Any] = {
        "cli_s": statistics.median(cli),
        "serve_warm_s": statistics.median(serve),
        "opacus_script_s": statistics.median(opacus),
    }
    out["cli_ratio"] = out["cli_s"] / out["opacus_script_s"]
    out["serve_warm_ratio"] = out["serve_warm_s"] / out["opacus_script_s"]
    out["targets"] = TARGETS
    out["steps"] = trial["steps"]
    out["repeats"] = a.repeats
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>18}: {v:.3f}" if isinstance(v, float) else f"{k:>18}: {v}")


if __name__ == "__main__":
    main()
