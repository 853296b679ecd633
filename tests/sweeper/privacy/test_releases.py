"""One epsilon per release: grid, sweep (composed tightly) and dataset lifetime, each saying
what it covers, with the evaluation statement, in `dpsweep show --json` and the trial pages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from api.cli import main
from sweeper.datasets.identity import ledger_key_of
from sweeper.driver.loop import run_sweep
from sweeper.driver.ray_backend import ray_session
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.settings import SweeperSettings
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from tests.sweeper.sweeps.test_sweep import tiny_spec
from workers.accounting.audit.prv import prv_compose_epsilon


@pytest.fixture(scope="module")
def local_ray() -> Any:
    import ray

    with ray_session(SweeperSettings(), workers=2):
        yield ray


def test_show_json_states_each_release_and_what_it_covers(
    tmp_path: Path, local_ray: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    upgrade(url)
    engine = make_engine(url)
    sid = create_sweep(engine, tiny_spec())  # two arms at two epsilon levels: four grids
    assert run_sweep(engine, sid).state == "done"

    assert main(["show", sid, "--json", "--db", url]) == 0
    s = json.loads(capsys.readouterr().out)
    p = s["privacy"]
    grids = p["grids"]
    assert len(grids) == 4
    for g, planned in zip(grids, s["plan"], strict=True):
        assert g["epsilon"] == planned["epsilon_total"] <= planned["epsilon_budget"]
        assert "every trial of this grid" in g["covers"]

    # The sweep's epsilon composes its grids tightly: below their sum, and inside the bounds
    # of an independent composition of the same mechanisms (prv-accountant).
    sweep = p["sweep"]
    summed = sum(g["epsilon"] for g in grids)
    assert sweep["epsilon_summed"] == pytest.approx(summed)
    assert sweep["epsilon"] < 0.9 * summed
    assert sweep["delta"] == pytest.approx(sum(g["delta"] for g in s["plan"]))
    bounds = prv_compose_epsilon(
        [
            (g["noise_multiplier"], g["sample_rate"], g["trials"] * g["steps_per_trial"])
            for g in s["plan"]
        ],
        target_delta=sweep["delta"],
    )
    assert bounds.lower <= sweep["epsilon"] <= bounds.upper * 1.01
    assert "composed tightly" in sweep["covers"]

    # The dataset's lifetime: what its ledger holds (this sweep's charges).
    key = ledger_key_of(engine, "digits")
    spent = float(BudgetLedger(engine).summary(key).epsilon_spent)
    assert p["dataset_lifetime"]["epsilon_spent"] == pytest.approx(spent) and spent > 0
    assert "key" not in json.dumps(p["dataset_lifetime"])
    assert "sha256" not in json.dumps(s)  # the records' hash is never shown

    ev = p["evaluation"]
    n_train, n_eval = s["plan"][0]["n_train"], s["plan"][0]["n_eval"]
    assert (n_train, n_eval) == (1438, 359)
    assert ev["mode"] == "carve-out" and ev["protected"] is False
    assert ev["statement"].startswith(
        f"ε covers the {n_train} training records; the {n_eval} evaluation records"
    )
    assert "without DP" in ev["statement"]

    # A trial's own epsilon is only ever labelled as a single run's.
    assert main(["export", sid, "--format", "json", "--db", url]) == 0
    trials = json.loads(capsys.readouterr().out)["trials"]
    assert trials and all("epsilon" not in t for t in trials)
    assert all(t["single_run_epsilon"] < t["epsilon_budget"] for t in trials)

    assert main(["show", sid, "--db", url]) == 0
    text = capsys.readouterr().out
    assert "for the whole sweep" in text and "over the dataset's lifetime" in text
    assert f"ε covers the {n_train} training records" in text
    engine.dispose()
