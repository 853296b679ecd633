"""The benchmarks run and report every column (figures are not asserted here)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script(path: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``ROOT / path`` with this interpreter, as `make bench` / `make report` would."""
    return subprocess.run(
        [sys.executable, str(ROOT / path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_step_overhead_benchmark_smoke() -> None:
    args = [
        "--json",
        "--repeats",
        "2",
        "--models",
        "mlp",
        "--batches",
        "64",
        "--strategies",
        "quantile,online,bam",
    ]
    p = _script("bench/step_overhead.py", *args)
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)["mlp"]["64"]
    assert set(row) == {
        "nonprivate_ms",
        "fixed",
        "fixed_plain_noise",
        "opacus_hooks",
        "opacus_ghost",
        "quantile",
        "online",
        "bam",
    }
    assert all(v > 0 for v in row.values())


def test_step_overhead_quick_is_the_first_look_and_flags_beside_it_win() -> None:
    p = _script("bench/step_overhead.py", "--quick", "--json", "--repeats", "1")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert set(res) == {"mlp", "cnn"}
    for rows in res.values():
        assert set(rows) == {"64"}
        assert {"fixed", "online", "bam", "opacus_ghost"} <= set(rows["64"])


def test_step_overhead_benchmark_smoke_on_a_generic_model() -> None:
    args = ["--json", "--repeats", "1", "--models", "text_classifier"]
    p = _script("bench/step_overhead.py", *args)
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(p.stdout)["text_classifier"].values()
    assert row["engine_path"] == "generic" and row["unsupported"] == {}
    for key in ("nonprivate_ms", "fixed_ms", "opacus_hooks_ms", "opacus_ghost_ms"):
        assert row[key] > 0, key
    assert row["fixed_vs_opacus_ghost"] > 0


def test_packing_benchmark_smoke() -> None:
    p = _script("bench/packing.py", "--json", "--quick", "--models", "mlp")
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)["mlp"]
    assert row["trials"] == 25 and row["speedup"] > 0 and row["per_trial_step_vs_nonprivate"] > 0


def test_eval_modes_benchmark_smoke() -> None:
    p = _script("bench/eval_modes.py", "--json", "--quick", "--shares", "0.3")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out["modes"]) == {"carve-out", "dp@0.3"}
    exact, dp = out["modes"]["carve-out"]["grids"][0], out["modes"]["dp@0.3"]["grids"][0]
    # The carve-out's released best is exact: the picked model's true accuracy.
    assert exact["released"] == pytest.approx(exact["true"]) and exact["acc_std"] == 0
    # DP evaluation: more training noise (the evaluations share the budget), noisy releases.
    assert dp["sigma"] > exact["sigma"] and dp["acc_std"] > 0
    assert 0 <= dp["true"] <= 1 and 0 <= dp["released"] <= 1


def test_sweep_throughput_benchmark_smoke() -> None:
    p = _script("bench/sweep_throughput.py", "--quick", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert {
        "trials",
        "workers_1_s",
        "workers_2_s",
        "speedup",
        "overhead_mean_s",
        "overhead_max_s",
        "targets",
        "model",
        "steps",
        "pack_size",
    } <= set(out)
    assert out["targets"] == {"speedup": 1.7, "overhead_s": 0.5}
    assert out["trials"] == 4 and out["pack_size"] == 1
    assert out["speedup"] > 0
    assert isinstance(out["overhead_mean_s"], float) and math.isfinite(out["overhead_mean_s"])


def test_api_load_benchmark_smoke() -> None:
    # 200 trials plan faster than 40 (larger grids get more noise, which the PLD accountant
    # handles faster); a few requests per endpoint, SQLite only.
    args = ["--json", "--trials", "200", "--clients", "4", "--requests", "3", "--warmup", "2"]
    p = _script("bench/api_load.py", *args, "--backends", "sqlite")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["trials"] == 200 and out["clients"] == 4 and out["backends"] == ["sqlite"]
    assert out["target_p99_ms"] == 100.0
    rows = out["sqlite"]
    assert set(rows) == {
        "GET /sweeps/{id}/pareto",
        "GET /sweeps/{id}/trials?limit=100",
        "GET /sweeps/{id}",
    }
    for row in rows.values():
        assert row["n"] == 12 and row["errors"] == 0
        assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("p50_ms", "p99_ms", "rps"))
        assert row["p50_ms"] <= row["p99_ms"] and isinstance(row["meets_target"], bool)
    assert out["sweeps"]["sqlite"]["trials"] == 200


@pytest.mark.slow
def test_dashboard_open_benchmark_smoke() -> None:
    args = ["--json", "--trials", "200", "--repeats", "1"]
    p = _script("bench/dashboard_open.py", *args, timeout=600)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["trials"] == 200
    first = out["first"]
    assert set(first) == {
        "header_ms",
        "eps_front_ms",
        "calibration_ms",
        "trials_first_page_ms",
        "trials_all_ms",
    }
    assert 0 < first["header_ms"] <= first["eps_front_ms"] <= first["calibration_ms"]
    assert any("pareto?x=accuracy&y=ece" in path for path in out["bytes"])


@pytest.mark.slow
def test_make_report_runs_end_to_end_at_tiny_scale(tmp_path: Path) -> None:
    """`make report`'s pipeline, tiny: every experiment's real sweeps, read back, tables,
    figures and markdown."""
    keep = str(tmp_path / "keep")
    p = _script(
        "report/make_report.py",
        "--scale",
        "tiny",
        "--out",
        str(tmp_path),
        "--keep",
        keep,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    facts = json.loads(p.stdout)
    assert list(facts) == [
        "strategies",
        "calibration",
        "clip-bias",
        "clipless",
        "tuning-cost",
        "finetuning",
        "units",
    ]
    md = (tmp_path / "results.md").read_text()
    heads = [md.index(f"## {i}. ") for i in range(1, 8)]
    assert heads == sorted(heads)  # sections in the experiments' order
    # 1: compose and basic per strategy at the tiny levels (1 and 8), basic below compose's σ cap.
    assert set(facts["strategies"]["seconds"]) == {
        f"{d}_{k}" for d in ("digits", "mnist1d") for k in ("compose", "basic")
    }
    assert "| fixed | 1 |" in md and "| online | 8 |" in md
    # The non-private ceiling beside them, on both data sets (trained outside any sweep).
    ceilings = facts["strategies"]["ceiling"]
    assert set(ceilings) == {"digits", "mnist1d"} and all(0 < v <= 1 for v in ceilings.values())
    assert md.count("**Non-private ceiling:**") == 2
    assert "`privacy.accounting: basic`" in md
    # 2: calibration's plan and results tables.
    cal = facts["calibration"]
    assert cal["seconds"] > 0 and cal["cnn1d_seconds"] > 0
    assert len([k for k in cal if k.startswith("ece_")]) == 8  # MLP on digits, cnn1d on MNIST-1D
    assert len([k for k in cal if k.startswith("ece_cnn1d ")]) == 4
    assert "| small-C | 3 |" in md and "| large-C | 3 |" in md
    assert "lr=2, clip=0.1" in md and "lr=0.02, clip=10" in md
    # 3: a bias trajectory per arm, measured: finite everywhere, positive under heavy clipping
    # (C = 0.1 clips every example). At C = 5 two tiny epochs may clip nothing, and then plain
    # DP-SGD's bias is exactly 0, which is the right answer.
    bias = {
        k.removeprefix("bias_"): v for k, v in facts["clip-bias"].items() if k.startswith("bias_")
    }
    assert set(bias) == {
        f"{m} C={c}" for m in ("dp-sgd", "bam-0.02", "bam-0.1") for c in ("0.1", "5")
    }
    assert all(0 <= v < math.inf for v in bias.values()), bias
    assert all(v > 0 for arm, v in bias.items() if arm.endswith("C=0.1")), bias
    # 4: each run's own step time, for the default and tuned Lipschitz MLPs, lip_cnn and the MLP.
    steps = {k: v for k, v in facts["clipless"].items() if k.startswith("step_ms_")}
    assert len(steps) == 4 and all(v > 0 for v in steps.values())
    # 5: compose and papernot-steinke keep each level's ε; the naive search composes to more,
    # and the papernot-steinke run count is never shown.
    tc = facts["tuning-cost"]
    for level in (1, 8):
        assert tc[f"compose_epsilon_{level}"] <= level and tc[f"ps_epsilon_{level}"] <= level
        assert tc[f"naive_epsilon_{level}"] > level
    assert "hidden" in md.split("## 5. ")[1]
    # 6: from scratch, pre-trained (all parameters, head only) and the pre-trained model alone.
    ft = facts["finetuning"]
    assert 0 < ft["pretrained_alone"] <= 1 and ft["pretrained_digest"].startswith("sha256:")
    assert all(
        0 < ft[f"finetuning-{v}_{e}"] <= 1
        for v in ("scratch", "pretrained", "head")
        for e in (1, 8)
    )
    # 7: example level and user level (mean, capped) on mnist1d-people; the example level's
    # epsilon per person by group privacy: one row gives the plan's epsilon back, more rows more.
    un = facts["units"]
    assert un["people"] == 381
    assert all(0 < un[f"units-{v}_{e}"] <= 1 for v in ("example", "mean", "capped") for e in (1, 8))
    for e in (1, 8):
        planned, one_row = un[f"example_{e}_row_check"]
        assert one_row == pytest.approx(planned, rel=1e-3)
        assert planned < un[f"example_{e}_person_6_rows"] < un[f"example_{e}_person_50_rows"]
    assert "one person, all their rows" in md.split("## 7. ")[1]
    # Redrawn from the kept sweeps (--reuse): the same numbers and wall times, nothing rerun.
    again = tmp_path / "again"
    p = _script(
        "report/make_report.py",
        "--scale",
        "tiny",
        "--out",
        str(again),
        "--reuse",
        keep,
        "--only",
        "tuning-cost",
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    redrawn = json.loads(p.stdout)["tuning-cost"]
    # wall_seconds is this call's own: reading back three sweeps, far less than running them.
    assert redrawn.pop("wall_seconds") < tc["wall_seconds"]
    assert redrawn == {k: v for k, v in tc.items() if k != "wall_seconds"}
    assert md.split("**Wall time of this report:**")[1].split(",")[0] in (
        (again / "results.md").read_text()
    )

    figures = (
        "strategies-accuracy",
        "strategies-mnist1d",
        "calibration-reliability",
        "calibration-cnn1d-reliability",
        "clip-bias",
        "clipless",
        "finetuning",
        "units",
    )
    for name in figures:
        assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 10_000, name
        assert f"(figures/{name}.png)" in md, name
    assert sorted(p.stem for p in (tmp_path / "figures").glob("*.png")) == sorted(figures)
    # The header states the whole report's wall time.
    assert "**Wall time of this report:**" in md.split("## 1. ")[0]


def test_generic_packs_benchmark_smoke() -> None:
    args = ["--json", "--repeats", "1", "--trials", "2", "--models", "text_classifier"]
    p = _script("bench/generic_packs.py", *args)
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)["text_classifier"]
    assert row["batched_ms"] > 0 and row["sequential_ms"] > 0
    assert row["faster"] in ("batched", "sequential") and row["declared"] == "batched"


def test_ledger_benchmark_smoke() -> None:
    """bench/ledger.py charges on both databases and checks the books (a few charges)."""
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ledger.py"), "--charges", "40", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["sqlite"]["charges"] == 40 and out["sqlite"]["seconds"] > 0
    assert out["postgresql"]["charges"] in (0, 40)


def test_planning_benchmark_smoke() -> None:
    """bench/planning.py plans a spec both ways and finds the same plan (one repeat)."""
    p = _script("bench/planning.py", "--json", "--repeats", "1", "--specs", "four_grids")
    assert p.returncode == 0, p.stderr[-2000:]
    row = json.loads(p.stdout)["four_grids"]
    assert row["grids"] == 4 and row["seconds"] > 0 and row["library_seconds"] > 0


def test_planning_benchmark_plans_and_reserves_ten_thousand_trials() -> None:
    """bench/planning.py's 10,000-trial grid (issue 41) is planned, stored and reserved, its
    schedule in O(log K) charge points adding up to the ledger's reservation (no timing)."""
    p = _script("bench/planning.py", "--json", "--specs", "ten_thousand")
    assert p.returncode == 0, p.stderr[-2000:]
    row = json.loads(p.stdout)["ten_thousand"]
    assert row["trials"] == 10_000 and row["charge_points"] <= 40
    assert row["seconds"] >= row["plan_seconds"] > 0


def test_audit_benchmark_smoke() -> None:
    """bench/audit.py --quick: a target row, a strategy row, black-box and one fault."""
    p = _script("bench/audit.py", "--json", "--quick")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert [r["case"] for r in rows][:2] == ["target eps=8", "fixed layerwise K=1"]
    for r in rows:
        assert r["epsilon_lower_bound"] >= 0.0
        if "detected" in r:
            # Halved noise: caught by the Gaussian estimate (the bound, which assumes nothing,
            # sees only part of a Gaussian mechanism's epsilon at this m).
            assert r["detected"] in ("bound", "estimate"), r
            key = "epsilon_lower_bound" if r["detected"] == "bound" else "epsilon_estimate"
            assert r[key] > r["epsilon_claimed"], r
        else:
            assert r["epsilon_lower_bound"] <= r["epsilon_claimed"] and not r["exceeds_claim"]


def test_first_result_benchmark_smoke() -> None:
    p = _script("bench/first_result.py", "--json", "--smoke")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert {"cli_s", "serve_warm_s", "opacus_script_s", "cli_ratio", "serve_warm_ratio"} <= set(out)
    assert out["targets"] == {"serve_warm_ratio": 1.0, "cli_ratio": 2.0}
    assert all(out[k] > 0 for k in ("cli_s", "serve_warm_s", "opacus_script_s"))
    assert out["steps"] == 4


def test_vs_opacus_benchmark_smoke() -> None:
    p = _script("bench/vs_opacus.py", "--json", "--smoke", "--workers", "2")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert {"dpsweep_s", "opacus_s", "workers", "speedup"} <= set(out)
    assert out["workers"] == 2 and out["trials"] == 2 and out["target"] == 3.0
    assert out["dpsweep_s"] > 0 and out["opacus_s"] > 0


def test_vs_opacus_large_grid_smoke() -> None:
    p = _script("bench/vs_opacus.py", "--json", "--smoke", "--grid", "large", "--workers", "2")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["grid"] == "large" and out["workers"] == 2 and out["trials"] == 4
    assert out["trial_steps"] == 40 and out["target"] == 3.0
    for side in ("dpsweep", "opacus"):
        assert out[f"{side}_s"] > 0 and out[f"{side}_ms_per_trial_step"] > 0


def test_opacus_trial_script_learns_mnist1d_with_momentum_and_average(tmp_path: Path) -> None:
    import numpy as np  # deferred: the other benches' tests need neither

    from workers.datasets.builtin import mnist1d_parts  # deferred: as above

    x, y, x_test, y_test = mnist1d_parts()
    np.savez(tmp_path / "m.npz", x=x, y=y, x_test=x_test, y_test=y_test)
    trial = {
        "model": "mlp",
        "lr": 0.05,
        "clip": 1.0,
        "sigma": 0.5,
        "steps": 40,
        "sample_rate": 0.016,
        "batch_size": 64,
        "eval_every": 20,
        "seed": 0,
        "test_fraction": 0.2,
        "momentum": 0.9,
        "ema": 0.99,
        "data_path": str(tmp_path / "m.npz"),
    }
    p = _script("bench/opacus_trial.py", json.dumps(trial))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["accuracy"] > 0.15  # chance is 0.1


def test_opacus_trial_script_learns() -> None:
    trial = {
        "model": "mlp",
        "lr": 0.5,
        "clip": 1.0,
        "sigma": 0.5,
        "steps": 30,
        "sample_rate": 0.05,
        "batch_size": 64,
        "eval_every": 10,
        "seed": 0,
        "test_fraction": 0.2,
    }
    p = _script("bench/opacus_trial.py", json.dumps(trial))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["accuracy"] > 0.3


def test_report_only_replaces_its_own_sections() -> None:
    """`make_report.py --only NAME` rewrites NAME's section of an existing results.md (or
    appends it) and leaves the header and the other sections as they were."""
    from report.make_report import splice

    md = "# Report\n\nheader\n\n## 1. One\n\nold one\n\n## 2. Two\n\ntwo\n"
    assert splice(md, ["## 1. One\n\nnew one"]) == md.replace("old one", "new one")
    assert splice(md, ["## 2. Two\n\nnew two"]) == md.replace("\ntwo\n", "\nnew two\n")
    assert splice(md, ["## 6. Six\n\nsix"]) == md + "\n## 6. Six\n\nsix\n"
