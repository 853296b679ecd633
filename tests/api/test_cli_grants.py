"""``dpsweep datasets grant | revoke | grants | audit | policy`` on a real SQLite database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session

from api.cli import main
from sweeper.datasets.uploads import store_upload
from sweeper.privacy import release_log
from sweeper.privacy.ledger.amounts import ZERO
from sweeper.store import Sweep
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.store.tokens import create_token
from sweeper.sweeps.create import create_sweep


@pytest.fixture
def setup(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    upgrade(url)
    engine = make_engine(url)
    rng = np.random.default_rng(0)
    x = np.round(rng.normal(size=(200, 3)), 3)
    lines = ["a,b,c,label"] + [
        ",".join(repr(float(v)) for v in row) + f",{int(row[0] > 0)}" for row in x
    ]
    ds = store_upload(
        engine,
        owner="olga",
        content=("\n".join(lines) + "\n").encode(),
        fmt="csv",
        data_dir=tmp_path,
        label_column="label",
        declare_counted=True,
    )["id"]
    yield engine, url, ds
    engine.dispose()


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_grant_list_policy_audit_and_revoke(setup: Any, capsys: pytest.CaptureFixture[str]) -> None:
    engine, url, ds = setup
    db = ["--db", url]
    grant = ["datasets", "grant", ds, "ana", "--epsilon", "2", "--note", "study", *db]
    # No token at all (local use): a name is granted only when confirmed, and nothing is kept.
    assert main(grant) == 1
    err = capsys.readouterr().err
    assert "no API token exists yet" in err and "--confirm" in err and "token create" in err
    assert _json(capsys, "datasets", "grants", ds, "--json", *db) == []
    assert main([*grant, "--confirm"]) == 0
    assert "granted ana" in capsys.readouterr().out
    (g,) = _json(capsys, "datasets", "grants", ds, "--json", *db)
    assert g["analyst"] == "ana" and g["active"] and g["epsilon_allowance"] == 2.0
    assert g["epsilon_used"] == 0 and g["note"] == "study"
    assert main(["datasets", "grants", ds, *db]) == 0
    assert "ana" in capsys.readouterr().out

    policy = ["datasets", "policy", ds, "--json", *db]
    p = _json(capsys, *policy, "--analyst-eval-modes", "dp", "--label-names", "neg,pos")
    assert p["analyst_eval_modes"] == ["dp"] and p["public_info"] == {"label_names": ["neg", "pos"]}
    p = _json(capsys, *policy, "--description", "three features")
    assert p["public_info"] == {"label_names": ["neg", "pos"], "description": "three features"}
    assert _json(capsys, *policy) == p
    # The owner's view of the records: analysts' specs cannot change it.
    p = _json(capsys, *policy, "--input-bounds=-5,5", "--split-seed", "3", "--n-examples", "250")
    assert p["view"] == {
        "test_fraction": 0.2,
        "split_seed": 3,
        "input_bounds": [-5.0, 5.0],
        "feature_clip": 5.0,
        "n_examples": 250,
        "classes": ["0", "1"],
        "input_shape": [3],
        "declared": ["n_examples", "classes", "input_shape"],
    }
    # Declared by value: a shape that is not the records' is refused, saying which it is.
    assert main(["datasets", "policy", ds, "--input-shape", "4", *db]) == 1
    assert "[3]" in capsys.readouterr().err
    p = _json(capsys, *policy, "--classes", "0,1,2", "--input-shape", "3")
    assert p["view"]["classes"] == ["0", "1", "2"] and len(p["view"]["declared"]) == 3
    assert main(["datasets", "policy", ds, "--input-bounds", "lo,hi", *db]) == 1
    assert "--input-bounds takes LO,HI" in capsys.readouterr().err
    assert main(["datasets", "policy", ds, "--n-examples", "1", *db]) == 1
    assert "n_examples" in capsys.readouterr().err
    assert main(["datasets", "policy", ds, *db]) == 0
    assert "split seed 3" in capsys.readouterr().out
    assert main(["datasets", "policy", ds, "--analyst-eval-modes", "raw", *db]) == 1
    assert "unknown evaluation mode" in capsys.readouterr().err

    # A release to the analyst, as the driver logs it; the CLI reads the log, never edits it.
    assert _json(capsys, "datasets", "audit", ds, "--json", *db) == []
    spec = {
        "name": "s",
        "dataset": {"name": ds, "input_bounds": [-5.0, 5.0]},
        "model": {"name": "logreg"},
        "training": {"steps": 4, "batch_size": 32, "eval_every": 2},
        "privacy": {"budgets": [1], "delta": 1e-5},
        "eval": {"mode": "dp"},
        "arms": [{"strategy": "fixed", "grid": {"lr": [0.1], "clip": [1.0]}}],
    }
    sid = create_sweep(engine, spec, owner="ana")
    with Session(engine) as s, s.begin():
        sweep = s.get(Sweep, sid)
        assert sweep is not None
        release_log.record(
            s, sweep, trial_id="t1", kind="model", grid=None, epsilon=ZERO, delta=ZERO
        )
    (entry,) = _json(capsys, "datasets", "audit", ds, "--json", *db)
    assert entry["principal"] == "ana" and entry["sweep_id"] == sid and entry["kind"] == "model"
    assert _json(capsys, "datasets", "audit", ds, "--analyst", "bea", "--json", *db) == []
    assert main(["datasets", "audit", ds, *db]) == 0
    assert sid in capsys.readouterr().out
    (g,) = _json(capsys, "datasets", "grants", ds, "--json", *db)
    assert 0.9 < g["epsilon_used"] <= 1.0

    assert main(["datasets", "revoke", ds, "ana", *db]) == 0
    assert "revoked ana" in capsys.readouterr().out
    assert main(["datasets", "revoke", ds, "ana", *db]) == 1
    assert "no active grant" in capsys.readouterr().err
    assert _json(capsys, "datasets", "grants", ds, "--json", *db)[0]["active"] is False


def test_clear_errors_for_unknown_datasets_and_bad_grants(
    setup: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _, url, ds = setup
    db = ["--db", url]
    for argv in (
        ["grant", "ds_nope", "ana", "--epsilon", "1"],
        ["grants", "ds_nope"],
        ["audit", "ds_nope"],
        ["policy", "ds_nope"],
        ["revoke", "ds_nope", "ana"],
    ):
        assert main(["datasets", *argv, *db]) == 1, argv
        assert "no dataset 'ds_nope'" in capsys.readouterr().err
    assert main(["datasets", "grant", ds, "olga", "--epsilon", "1", *db]) == 1
    assert "owns dataset" in capsys.readouterr().err
    assert main(["datasets", "grant", ds, "ana", "--epsilon", "-1", *db]) == 1
    assert "epsilon_allowance" in capsys.readouterr().err


def test_a_grant_names_a_token_or_is_confirmed(
    setup: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    engine, url, ds = setup
    db = ["--db", url]
    create_token(engine, name="bea")
    # A token's name is granted as it is; a typo of it is refused, saying how to go on.
    assert main(["datasets", "grant", ds, "bea", "--epsilon", "1", *db]) == 0
    assert main(["datasets", "grant", ds, "baa", "--epsilon", "1", *db]) == 1
    err = capsys.readouterr().err
    assert "no API token has the name 'baa'" in err and "--confirm" in err
    assert [g["analyst"] for g in _json(capsys, "datasets", "grants", ds, "--json", *db)] == ["bea"]
    assert main(["datasets", "grant", ds, "baa", "--epsilon", "1", "--confirm", *db]) == 0
