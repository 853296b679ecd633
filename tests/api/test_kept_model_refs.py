"""Kept models are found from every listing of a sweep's trials (issue 37, item 6): a real
``dpsweep run`` of a tiny sweep (SQLite, local Ray) that keeps one model of two trials, then
``dpsweep show`` (text and ``--json``), ``dpsweep export`` (JSON and CSV) and the API's trial
list (a real ``dpsweep serve`` on the same database) each name the kept model, null/empty for
the trial without one; each reference fetches the very file recorded (``dpsweep model`` with
the listed command, the API's listed URL); and a caller who may not download the model does
not get its reference either.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.orm import Session

from api.cli import main
from api.cli.run import LIVE_WIDTH
from api.testing.server import start_server
from sweeper.store import ModelArtifact, Trial, TrialState
from sweeper.store.engine import make_engine

SPEC = {
    "name": "model-refs",
    "dataset": {"name": "digits"},
    "model": {"name": "logreg"},
    "training": {"steps": 10, "batch_size": 64, "eval_every": 5},
    "privacy": {"budgets": [2], "delta": 1e-5},
    # One grid of two configurations: best_per_grid (the default) keeps one model of the two.
    "arms": [
        {
            "strategy": "quantile",
            "name": "quantile-clipping-with-a-long-descriptive-arm-name",
            "grid": {"lr": [0.05, 0.5]},
        }
    ],
}
REF_KEYS = {"sha256", "size_bytes", "reproducible", "url", "card_url"}


@dataclass
class Ran:
    url: str
    root: Path
    sweep_id: str
    kept: str
    not_kept: str
    sha256: str
    size_bytes: int
    run_err: str


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    root = tmp_path_factory.mktemp("model-refs")
    url = f"sqlite:///{root / 'run.db'}"
    spec = root / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    with pytest.MonkeyPatch.context() as mp:
        # The default store, beside the SQLite file (the server below finds it there too).
        mp.delenv("DPSWEEP_ARTIFACT_URL", raising=False)
        mp.delenv("DPSWEEP_ARTIFACT_QUOTA_MB", raising=False)
        # A wide terminal: the live display still keeps to 80 columns.
        mp.setenv("COLUMNS", "160")
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            argv = ["run", str(spec), "--db", url, "--workers", "1"]
            assert main([*argv, "--plots", str(root / "plots")]) == 0
        engine = make_engine(url)
        with Session(engine) as s:
            done = list(s.scalars(sa.select(Trial.id).where(Trial.state == TrialState.done)))
            rows = list(s.scalars(sa.select(ModelArtifact)))
            sweep_id = str(s.scalar(sa.select(Trial.sweep_id)))
        engine.dispose()
        assert len(done) == 2 and len(rows) == 1
        row = rows[0]
        yield Ran(
            url,
            root,
            sweep_id,
            row.trial_id,
            next(t for t in done if t != row.trial_id),
            row.sha256,
            int(row.size_bytes),
            err.getvalue(),
        )


def _cli(capsys: Any, *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return str(capsys.readouterr().out)


def _check_ref(ran: Ran, ref: dict[str, Any]) -> None:
    """A CLI output's model reference: the listing's fields, its trial, the command (and,
    in ``models``, the trial's grid and objective)."""
    if "arm" in ref:  # a summary's ``models``: the grid and objective, no hash
        assert set(ref) == REF_KEYS - {"sha256"} | {"trial", "cli", "arm", "strategy"} | {
            "epsilon_budget",
            "objective",
        }
    else:
        assert set(ref) == REF_KEYS | {"trial", "cli"}
        assert ref["sha256"] == ran.sha256
    assert ref["trial"] == ran.kept
    assert ref["size_bytes"] == ran.size_bytes
    assert ref["reproducible"] is False
    assert ref["url"] == f"/api/v1/trials/{ran.kept}/model"
    assert ref["card_url"] == f"/api/v1/trials/{ran.kept}/model-card"
    assert ref["cli"] == f"dpsweep model {ran.kept} -o DIR"


@pytest.mark.slow
def test_the_run_lists_its_kept_model_and_its_live_display_fits(ran: Ran) -> None:
    err = ran.run_err
    assert "kept 1 model(s) in " in err and f"trial {ran.kept}" in err
    # The live display's last frame (off a terminal, rich prints it when the run ends) keeps
    # to 80 columns although the console is 160 wide, its header on one line.
    lines = err.splitlines()
    head = lines.index("best accuracy so far")
    frame = lines[head - 1 : head + 4]
    assert re.match(
        r"model-refs +done 2/2 +running 0 +failed 0 +elapsed \S+ +ETA 0s$", lines[head - 1]
    )
    assert lines[head + 1].split() == ["arm", "accuracy"]
    assert lines[head + 2].split()[0] == SPEC["arms"][0]["name"]  # type: ignore[index]
    assert max(len(line) for line in frame) <= LIVE_WIDTH


@pytest.mark.slow
def test_show_json_and_text_name_the_kept_model(ran: Ran, capsys: Any) -> None:
    shown = json.loads(_cli(capsys, "show", ran.sweep_id, "--db", ran.url, "--json"))
    (model,) = shown["models"]
    _check_ref(ran, model)
    # A summary names no hash (the records' identity is hash-derived; none is ever shown).
    assert "sha256" not in json.dumps(shown)
    assert model["arm"] == SPEC["arms"][0]["name"]  # type: ignore[index]
    assert model["strategy"] == "quantile" and model["epsilon_budget"] == 2.0
    # Its objective is the trial's released accuracy, as the results show it.
    (best,) = shown["results"]
    assert best["best_trial"] == ran.kept
    assert model["objective"] == pytest.approx(best["objective_mean"])

    text = " ".join(_cli(capsys, "show", ran.sweep_id, "--db", ran.url).split())
    assert (
        f"kept 1 model(s): quantile-clipping-with-a-long-descriptive-arm-name@2: trial {ran.kept}"
        in text
    )
    assert "`dpsweep model TRIAL -o DIR` writes one out" in text
    assert ran.not_kept not in text


@pytest.mark.slow
def test_export_json_and_csv_carry_each_trials_model(ran: Ran, capsys: Any) -> None:
    data = json.loads(_cli(capsys, "export", ran.sweep_id, "--db", ran.url, "--format", "json"))
    by_id = {t["id"]: t for t in data["trials"]}
    assert set(by_id) == {ran.kept, ran.not_kept}
    _check_ref(ran, by_id[ran.kept]["model"])
    assert by_id[ran.not_kept]["model"] is None
    assert [m["trial"] for m in data["sweep"]["models"]] == [ran.kept]
    _check_ref(ran, data["sweep"]["models"][0])

    text = _cli(capsys, "export", ran.sweep_id, "--db", ran.url, "--format", "csv")
    rows = {r["id"]: r for r in csv.DictReader(io.StringIO(text))}
    kept, other = rows[ran.kept], rows[ran.not_kept]
    assert kept["model_url"] == f"/api/v1/trials/{ran.kept}/model"
    assert kept["model_card_url"] == f"/api/v1/trials/{ran.kept}/model-card"
    assert kept["model_sha256"] == ran.sha256
    assert int(kept["model_size_bytes"]) == ran.size_bytes
    assert kept["model_cli"] == f"dpsweep model {ran.kept} -o DIR"
    assert all(other[k] == "" for k in kept if k.startswith("model_"))


@pytest.mark.slow
def test_the_listed_command_writes_the_recorded_model(
    ran: Ran, capsys: Any, tmp_path: Path
) -> None:
    shown = json.loads(_cli(capsys, "show", ran.sweep_id, "--db", ran.url, "--json"))
    command = shown["models"][0]["cli"].replace("DIR", str(tmp_path / "out")).split()
    assert command[:2] == ["dpsweep", "model"]
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("DPSWEEP_ARTIFACT_URL", raising=False)
        _cli(capsys, *command[1:], "--db", ran.url)
    data = (tmp_path / "out" / "model.safetensors").read_bytes()
    assert hashlib.sha256(data).hexdigest() == ran.sha256 and len(data) == ran.size_bytes


@pytest.mark.slow
def test_the_api_trial_list_carries_the_model_and_its_url_serves_it(
    ran: Ran, tmp_path: Path, capsys: Any
) -> None:
    export = json.loads(_cli(capsys, "export", ran.sweep_id, "--db", ran.url, "--format", "json"))
    local_ref = next(t["model"] for t in export["trials"] if t["id"] == ran.kept)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("DPSWEEP_ARTIFACT_URL", raising=False)
        server = start_server(ran.url, tmp_path, scheduler=False)
    try:
        with server.client(server.token("root", admin=True)) as c:
            r = c.get(f"/api/v1/sweeps/{ran.sweep_id}/trials")
            assert r.status_code == 200, r.text
            by_id = {t["id"]: t for t in r.json()["items"]}
            ref = by_id[ran.kept]["model"]
            assert by_id[ran.not_kept]["model"] is None
            # The API's reference is the CLI's, less the trial (the item is the trial) and
            # the local command.
            assert ref == {k: v for k, v in local_ref.items() if k not in ("trial", "cli")}
            model = c.get(ref["url"])
            assert model.status_code == 200
            assert hashlib.sha256(model.content).hexdigest() == ref["sha256"] == ran.sha256
            card = c.get(ref["card_url"])
            assert card.status_code == 200
            assert card.json()["model"]["weights"]["sha256"] == ran.sha256
            # The trial's own page carries the same reference.
            assert c.get(f"/api/v1/trials/{ran.kept}").json()["model"] == ref
        # Someone who may not download the model does not see its reference either: the
        # sweep, its trial list and the model are all "not found" to them.
        with server.client(server.token("mallory")) as c:
            assert c.get(f"/api/v1/sweeps/{ran.sweep_id}/trials").status_code == 404
            assert c.get(ref["url"]).status_code == 404
            assert c.get(ref["card_url"]).status_code == 404
    finally:
        server.stop()
