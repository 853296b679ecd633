"""The ``dpsweep train`` command, run as a real subprocess through the installed console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from opacus.accountants import RDPAccountant

DPSWEEP = shutil.which("dpsweep", path=str(Path(sys.executable).parent)) or "dpsweep"
FAST = ["--epochs", "1", "--batch-size", "32", "--eval-every", "10"]


# `dpsweep train` charges its dataset's ledger: these runs charge a throwaway database.
LEDGER_DB = f"sqlite:///{tempfile.mkdtemp(prefix='dpsweep-train-')}/ledger.db"


def run(*args: str, db: str = LEDGER_DB) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120", "DPSWEEP_DATABASE_URL": db}
    return subprocess.run(
        [DPSWEEP, "train", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def test_json_output_has_the_documented_keys_and_honest_epsilon() -> None:
    p = run(
        "--dataset",
        "digits",
        "--model",
        "cnn",
        "--strategy",
        "fixed",
        "--epsilon",
        "3",
        "--delta",
        "1e-5",
        "--lr",
        "0.5",
        "--clip",
        "1.0",
        "--seed",
        "0",
        "--json",
        *FAST,
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    for key in (
        "accuracy",
        "loss",
        "ece",
        "mce",
        "epsilon",
        "delta",
        "noise_multiplier",
        "sample_rate",
        "steps",
        "best_step",
        "step_time_ms_median",
    ):
        assert key in out, key
    assert out["epsilon"] <= 3.0 and out["delta"] == 1e-5
    acc = RDPAccountant()
    acc.history = [(out["noise_multiplier"], out["sample_rate"], out["steps"])]
    assert out["epsilon"] == pytest.approx(acc.get_epsilon(delta=1e-5), rel=1e-9)


def test_noise_multiplier_replaces_epsilon() -> None:
    p = run("--dataset", "wine", "--model", "logreg", "--noise-multiplier", "2.5", "--json", *FAST)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["noise_multiplier"] == 2.5 and out["epsilon"] > 0


@pytest.mark.parametrize(
    "strategy,flags,param",
    [
        ("quantile", ["--target-quantile", "0.3", "--clip-lr", "0.1"], {"target_quantile": 0.3}),
        ("online", ["--clip-init", "0.2", "--lr-lr", "0.01"], {"clip_init": 0.2, "lr_lr": 0.01}),
        ("global", ["--global-threshold", "5"], {"global_threshold": 5.0}),
        ("bam", ["--bam-lambda", "0.2"], {"bam_lambda": 0.2}),
        ("automatic", ["--clip-style", "layerwise"], {"clip_style": "layerwise"}),
    ],
)
def test_strategy_flags_and_trajectories(strategy: str, flags: list[str], param: dict) -> None:
    p = run(
        "--dataset",
        "wine",
        "--model",
        "logreg",
        "--strategy",
        strategy,
        "--noise-multiplier",
        "1.0",
        "--json",
        *flags,
        *FAST,
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert param.items() <= out["params"].items()
    traj = out["trajectories"]
    for key in ("step", "clip", "lr", "frac_clipped", "clip_bias", "grad_cos"):
        assert len(traj[key]) == len(traj["step"]) > 0, key
    assert out["clip_final"] == traj["clip"][-1]


def test_human_output_shows_a_summary() -> None:
    p = run("--dataset", "wine", "--model", "logreg", "--epsilon", "4", *FAST)
    assert p.returncode == 0, p.stderr
    assert "accuracy" in p.stdout and "epsilon" in p.stdout and "noise multiplier" in p.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--epsilon", "0"], "epsilon must be a finite number > 0"),
        (["--epsilon", "-1"], "epsilon must be a finite number > 0"),
        (["--epsilon", "1", "--delta", "1"], "delta must be strictly between 0 and 1"),
        (["--epsilon", "1", "--delta", "2e0"], "delta must be strictly between 0 and 1"),
        (
            ["--epsilon", "1", "--dataset", "mnist"],
            "unknown dataset 'mnist'; choose one of: breast_cancer",
        ),
        (
            ["--epsilon", "1", "--model", "resnet"],
            "unknown model 'resnet'; choose one of: autoencoder",
        ),
        (
            ["--epsilon", "1", "--strategy", "magic"],
            "unknown strategy 'magic'; choose one of: automatic, bam, fixed",
        ),
        ([], "give exactly one of --epsilon or --noise-multiplier"),
        (["--epsilon", "1", "--noise-multiplier", "1"], "give exactly one of"),
        (["--strategy", "nonprivate", "--epsilon", "1"], "nonprivate adds no noise"),
        (
            ["--epsilon", "1", "--clip-style", "diagonal"],
            "--clip-style for strategy 'fixed' must be one of",
        ),
        (
            [
                "--epsilon",
                "1",
                "--dataset",
                "csv",
                "--data-path",
                "/nonexistent.csv",
                "--label-column",
                "y",
            ],
            "/nonexistent.csv: file not found",
        ),
        (["--epsilon", "1", "--batch-size", "99999"], "exceeds the"),
        (
            ["--epsilon", "1", "--bam-lambda", "0.1"],
            "--bam-lambda does not apply to strategy 'fixed'",
        ),
    ],
)
def test_bad_arguments_exit_2_with_a_helpful_message(args: list[str], message: str) -> None:
    p = run(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert message in p.stderr
    # One line that says what to fix; the usage only with -h.
    assert p.stderr.startswith("dpsweep train: error: ") and p.stderr.count("\n") == 1, p.stderr
    assert "usage:" not in p.stderr


def test_usage_comes_with_h_only() -> None:
    p = run("-h")
    assert p.returncode == 0 and p.stdout.startswith("usage: dpsweep train") and not p.stderr
    p = run("--epsilon")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "usage:" not in p.stderr
    assert "--epsilon: expected one argument (`dpsweep train -h` lists the options)" in p.stderr


def test_user_files_train_through_the_cli(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 4))
    y = (x[:, 0] > 0).astype(int)
    path = tmp_path / "data.csv"
    path.write_text(
        "a,b,c,d,target\n"
        + "\n".join(
            ",".join(f"{v:.5f}" for v in row) + f",{lab}" for row, lab in zip(x, y, strict=True)
        )
    )
    p = run(
        "--dataset",
        "csv",
        "--data-path",
        str(path),
        "--label-column",
        "target",
        "--model",
        "logreg",
        "--strategy",
        "nonprivate",
        "--lr",
        "0.5",
        "--json",
        "--epochs",
        "5",
        "--batch-size",
        "16",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["accuracy"] > 0.8 and out["epsilon"] is None


def test_a_private_file_is_charged_only_when_confirmed(tmp_path: Path) -> None:
    """A file's records are private: the run shows its charge and needs --yes (no terminal
    here to ask on); refused, it charges and binds nothing. A shared set (digits) asks not."""
    from sqlalchemy import func, select
    from sqlalchemy.orm import Session

    from sweeper.store import Dataset
    from sweeper.store.engine import make_engine

    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 3))
    path = tmp_path / "private.csv"
    path.write_text(
        "a,b,c,y\n" + "\n".join(",".join(f"{v:.4f}" for v in r) + f",{int(r[0] > 0)}" for r in x)
    )
    url = f"sqlite:///{tmp_path / 'confirm.db'}"
    args = ["--dataset", "csv", "--data-path", str(path), "--label-column", "y"]
    args += ["--model", "logreg", "--epsilon", "1", "--json", *FAST]
    p = run(*args, db=url)
    assert p.returncode == 1 and not p.stdout, p.stderr
    said = " ".join(p.stderr.split())  # rich wraps lines
    assert f"to the lifetime budget of 'csv:{path}'" in said and "--yes" in said
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            assert session.scalar(select(func.count()).select_from(Dataset)) == 0
    finally:
        engine.dispose()
    p = run(*args, "--yes", db=url)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["ledger"]["epsilon_charged"] > 0
    p = run("--dataset", "digits", "--model", "logreg", "--epsilon", "1", "--json", *FAST, db=url)
    assert p.returncode == 0 and "confirmed" not in p.stderr, p.stderr


def test_train_charges_the_ledger_and_respects_the_cap(tmp_path: Path) -> None:
    from sweeper.datasets.identity import ledger_key_of
    from sweeper.privacy.ledger.budget_ledger import BudgetLedger
    from sweeper.privacy.ledger.rows import EntryKind
    from sweeper.store.engine import make_engine

    url = f"sqlite:///{tmp_path / 'l.db'}"
    args = ["--dataset", "digits", "--model", "logreg", "--epsilon", "1.0", "--json", *FAST]
    p = run(*args, db=url)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    charged = out["ledger"]["epsilon_charged"]
    assert charged == pytest.approx(out["epsilon"]) and 0.9 < charged <= 1.0
    engine = make_engine(url)
    key = ledger_key_of(engine, "digits")
    ledger = BudgetLedger(engine)
    assert float(ledger.summary(key).epsilon_spent) == charged
    charges = [e for e in ledger.entries(key) if e.kind == EntryKind.CHARGE]
    assert [e.sweep_id for e in charges] == [out["ledger"]["run"]]
    # A cap that the next run would exceed refuses it before it trains; nothing is charged.
    ledger.set_cap(key, epsilon_cap=charged + 0.5)
    p = run(*args, db=url)
    assert p.returncode == 1 and "cap" in p.stderr, p.stderr
    assert float(ledger.summary(key).epsilon_spent) == charged
    engine.dispose()


def test_train_refuses_a_delta_above_one_over_n(tmp_path: Path) -> None:
    p = run("--dataset", "digits", "--epsilon", "1", "--delta", "0.001", *FAST)
    assert p.returncode == 2
    assert "--delta 0.001 is >= 1/N for a dataset of N = 1797 (its records" in p.stderr


def test_strategy_flags_come_from_the_descriptors() -> None:
    """Every hyperparameter a registered strategy declares is a `train` flag, typed by its
    kind; none is restated by hand (a plug-in's hyperparameters get flags too)."""
    from api.cli.arguments import strategy_flags
    from workers.strategies import descriptor_names, get_descriptor

    flags = {dest: (flag, kind) for flag, dest, kind, _ in strategy_flags()}
    for name in descriptor_names():
        for hp_name, hp in get_descriptor(name).hyperparameters.items():
            flag, kind = flags[hp_name]
            assert flag == "--" + hp_name.replace("_", "-")
            assert kind is {"float": float, "int": int}.get(hp.kind, str)
