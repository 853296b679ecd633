"""``dpsweep plan`` of a spec with public pre-tuning: a line per tuned grid (its public dataset,
best point, score and centred axes), and ``--json`` carries the same fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from api.cli import main
from tests.sweeper.sweeps.test_public_tuning import _spec

pytest.importorskip("mnist1d")


def test_dpsweep_plan_says_which_grids_were_tuned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tuned.yaml"
    spec = _spec(tune_on="mnist1d-test")
    spec["privacy"]["budgets"] = [2, 8]
    path.write_text(yaml.safe_dump(spec))
    assert main(["plan", str(path), "--json"]) == 0
    grids = json.loads(capsys.readouterr().out)
    assert [g["tuned_on"] for g in grids] == ["mnist1d-test", "mnist1d-test"]
    assert all(len(g["tuned_grid"]["lr"]) == 3 for g in grids)

    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    for g in grids:
        where = f"fixed at ε {g['epsilon_budget']:g}: tuned on mnist1d-test"
        assert where in out
    assert "no epsilon spent" in out
