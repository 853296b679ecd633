"""Model cards of real finished sweeps (real SQLite, real Ray): the releases a model belongs to
as the summary states them, the labels, the papernot-steinke omissions, canonical bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, selectinload

from dpsweep.errors import IllegalState
from sweeper.artifacts.cards import (
    NOT_PRIVATE_WARNING,
    POSITION_KEYS,
    card_bytes,
    model_card,
    render_card_markdown,
)
from sweeper.datasets.identity import content_identity
from sweeper.driver.loop import run_sweep
from sweeper.driver.ray_backend import ray_session
from sweeper.settings import SweeperSettings
from sweeper.store import Trial, TrialResultRow, TrialState
from sweeper.store.engine import make_engine
from sweeper.store.schema import upgrade
from sweeper.sweeps.create import create_sweep
from sweeper.sweeps.released import released_records, trial_record
from sweeper.sweeps.stored import load_sweep
from sweeper.sweeps.summary import summarize
from tests.sweeper.driver.test_ps_secrecy import create_with_runs, ps_spec
from tests.sweeper.sweeps.test_sweep import tiny_spec
from workers.randomness import REPRODUCIBLE_WARNING

ONE_ARM = [{"strategy": "fixed", "grid": {"lr": [0.5], "clip": [1.0]}}]
# Keys that would tell when, or how many runs beside it, a papernot-steinke model trained.
TIMING_KEYS = {*POSITION_KEYS, "created_at", "worker", "step_time_ms_median", "planned_trials"}


@dataclasses.dataclass
class Sweeps:
    url: str
    engine: Any
    compose: str  # secret randomness, two grids (levels 2 and 6)
    reproducible: str  # one grid, DP evaluation
    ps: str  # papernot-steinke, one grid of exactly 3 runs


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> Any:
    url = f"sqlite:///{tmp_path_factory.mktemp('cards') / 'c.db'}"
    upgrade(url)
    engine = make_engine(url)
    compose = create_sweep(engine, tiny_spec(arms=ONE_ARM))
    repro = create_sweep(
        engine,
        tiny_spec(
            arms=ONE_ARM,
            privacy={"budgets": [2], "delta": 1e-5, "reproducible": True},
            eval={"mode": "dp"},
        ),
    )
    ps = create_with_runs(engine, ps_spec(privacy=ps_spec()["privacy"] | {"budgets": [3]}), runs=3)
    with ray_session(SweeperSettings(), workers=1):
        for sid in (compose, repro, ps):
            assert run_sweep(engine, sid).state == "done"
    yield Sweeps(url, engine, compose, repro, ps)
    engine.dispose()


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    """A real logistic regression's model_info, weights hash and size (digits: 64 -> 10)."""
    from workers.checkpoints import model_info, weights_bytes
    from workers.models.descriptors import ModelSpec
    from workers.models.registry import build_model

    module = build_model(ModelSpec("logreg", {}), input_shape=(64,), num_classes=10, seed=0)
    data = weights_bytes(module)
    info = model_info(
        module, name="logreg", options={}, input_shape=(64,), num_classes=10, engine_path="packed"
    )
    return {
        "model": info,
        "weights_sha256": hashlib.sha256(data).hexdigest(),
        "weights_size_bytes": len(data),
    }


def _trials(engine: Any, sid: str) -> list[Trial]:
    with Session(engine, expire_on_commit=False) as s:
        rows = list(
            s.scalars(
                sa.select(Trial).where(Trial.sweep_id == sid).options(selectinload(Trial.result))
            )
        )
        s.expunge_all()
    return rows


def _card(engine: Any, trial_id: str, model: dict[str, Any]) -> dict[str, Any]:
    with Session(engine) as s:
        trial = s.scalars(
            sa.select(Trial).where(Trial.id == trial_id).options(selectinload(Trial.result))
        ).one()
        return model_card(s, trial, **model)


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_compose_card_states_the_releases_as_the_summary_does(
    sweeps: Sweeps, model: dict[str, Any]
) -> None:
    summary = summarize(sweeps.engine, sweeps.compose)
    records = {
        r["id"]: r
        for r in released_records(
            load_sweep(sweeps.engine, sweeps.compose), metric="accuracy", mode="max"
        )
    }
    trials = _trials(sweeps.engine, sweeps.compose)
    assert len(trials) == 2
    for t in trials:
        card = _card(sweeps.engine, t.id, model)
        assert card["format"] == "dpsweep-model-card" and card["card_version"] == 2
        p = card["privacy"]
        assert p["private"] is True and p["warning"] is None
        # The grid's release: its budget is the trial's level, its epsilon the plan's.
        (grid,) = [
            g for g in summary["privacy"]["grids"] if g["epsilon_budget"] == t.epsilon_budget
        ]
        assert p["grid"]["epsilon_budget"] == t.epsilon_budget
        assert p["grid"].items() >= grid.items()
        assert p["epsilon"] == grid["epsilon"] <= t.epsilon_budget
        assert p["delta"] == grid["delta"] and "every trial of this grid" in p["covers"]
        # The sweep's statement is the summary's, word for word.
        assert p["sweep"] == summary["privacy"]["sweep"]
        assert "composed tightly" in p["sweep"]["covers"]
        (planned,) = [g for g in summary["plan"] if g["epsilon_budget"] == t.epsilon_budget]
        assert p["accountant"] == planned["accountant"] == "pld"
        assert p["accounting"] == "compose"
        assert p["verification"]["verified_by"] == planned["verified_by"]
        assert p["verification"]["epsilon_verified"] == planned["epsilon_verified"]
        assert (p["noise_multiplier"], p["sample_rate"], p["steps"]) == (
            planned["noise_multiplier"],
            planned["sample_rate"],
            planned["steps_per_trial"],
        )
        # A run's own epsilon is labelled as such (one run per grid here: the grid's).
        single = p["single_run_epsilon"]
        assert single["epsilon"] == records[t.id]["single_run_epsilon"] <= p["epsilon"]
        assert "not what was spent" in single["note"]
        # Evaluation: the summary's statement; metrics: the released record's.
        assert card["evaluation"].items() >= summary["privacy"]["evaluation"].items()
        assert card["evaluation"]["protected"] is False
        assert card["metrics"]["values"] == records[t.id]["metrics"]
        assert {"accuracy", "loss", "ece", "mce"} <= set(card["metrics"]["values"])
        assert (card["metrics"]["metric"], card["metrics"]["mode"]) == ("accuracy", "max")
        assert card["metrics"]["best_step"] == records[t.id]["best_step"] is not None
        # The trial as released, with its timestamps (not a papernot-steinke grid).
        tr = card["trial"]
        assert tr["hyperparameters"] == t.params and tr["hyperparameters"]["lr"] == 0.5
        assert tr["seed"] == t.seed and "initial weights" in tr["seed_seeds"]
        assert tr["sweep_name"] == "tiny" and tr["steps"] == 20
        assert tr["finished_at"] is not None and tr["train_seconds"] is not None
        assert datetime.fromisoformat(card["created_at"]).tzinfo == UTC
        # The model, with its weights' hash; the dataset by name, sized as the plan says.
        assert card["model"]["name"] == "logreg" and card["model"]["parameters"] == 650
        assert card["model"]["weights"] == {
            "format": "safetensors",
            "sha256": model["weights_sha256"],
            "size_bytes": model["weights_size_bytes"],
        }
        assert card["dataset"]["name"] == "digits"
        assert (card["dataset"]["n_train"], card["dataset"]["n_eval"]) == (1438, 359)
        assert card["privacy"]["randomness"] == "secret" and card["warnings"] == []
        # The records' identity is operator-only: never on a card.
        assert card["dataset"]["identity"] is None
        assert content_identity(sweeps.engine, "digits") not in card_bytes(card).decode()


def test_reproducible_cards_are_labelled(sweeps: Sweeps, model: dict[str, Any]) -> None:
    (t,) = _trials(sweeps.engine, sweeps.reproducible)
    card = _card(sweeps.engine, t.id, model)
    assert card["privacy"]["randomness"] == "reproducible"
    assert card["privacy"]["randomness_warning"] == REPRODUCIBLE_WARNING
    assert card["warnings"] == [REPRODUCIBLE_WARNING]
    assert "Poisson batches and the noise" in card["trial"]["seed_seeds"]
    assert REPRODUCIBLE_WARNING in render_card_markdown(card)


def test_dp_evaluation_card_holds_only_the_noisy_metrics(
    sweeps: Sweeps, model: dict[str, Any]
) -> None:
    (t,) = _trials(sweeps.engine, sweeps.reproducible)
    card = _card(sweeps.engine, t.id, model)
    summary = summarize(sweeps.engine, sweeps.reproducible)
    (record,) = released_records(
        load_sweep(sweeps.engine, sweeps.reproducible), metric="accuracy", mode="max"
    )
    ev = card["evaluation"]
    assert ev.items() >= summary["privacy"]["evaluation"].items()
    assert ev["mode"] == "dp" and ev["protected"] is True and "noisy counts" in ev["statement"]
    assert ev["eval_releases"] == 3 and ev["eval_noise_multiplier"] > 0
    assert 0 < ev["epsilon_eval"] < card["privacy"]["epsilon"]
    # What the result row holds, nothing more: a noisy accuracy, no loss or calibration.
    values = card["metrics"]["values"]
    assert values == record["metrics"] and 0.0 <= values["accuracy"] <= 1.0
    assert values.get("ece") is None and values.get("loss") is None
    # The split the workers used: the content-keyed split of mode dp, with the spec's seed.
    split = card["dataset"]["split"]
    assert split["eval_mode"] == "dp" and "hashed with split_seed" in split["method"]
    assert (split["split_seed"], split["test_fraction"]) == (0, 0.2)


def test_the_split_section_is_the_sweeps_dataset_view(
    sweeps: Sweeps, model: dict[str, Any]
) -> None:
    t = _trials(sweeps.engine, sweeps.compose)[0]
    card = _card(sweeps.engine, t.id, model)
    split = card["dataset"]["split"]
    spec = load_sweep(sweeps.engine, sweeps.compose).spec["dataset"]
    assert split["loader"] == spec["name"] == "digits"
    for key in ("split_seed", "test_fraction", "input_bounds", "feature_clip", "options"):
        assert split[key] == spec[key], key
    assert split["eval_mode"] == "carve-out" and split["eval_dataset"] is None
    assert split["classes"] is None  # a built-in: its records' sorted labels
    text = render_card_markdown(card)
    assert "## Dataset and evaluation split" in text
    assert "Split seed 0, test fraction 0.2." in text and "--check" in text


def test_papernot_steinke_card_is_the_selected_trials_and_untimed(
    sweeps: Sweeps, model: dict[str, Any]
) -> None:
    summary = summarize(sweeps.engine, sweeps.ps)
    (released,) = summary_records = released_records(
        load_sweep(sweeps.engine, sweeps.ps), metric="accuracy", mode="max"
    )
    assert len(summary_records) == 1
    card = _card(sweeps.engine, released["id"], model)
    p = card["privacy"]
    assert p["accounting"] == "papernot-steinke" and p["selected_trial"] is True
    assert "selected trial" in p["selection"] and "selected trial" in p["covers"]
    assert p["epsilon"] == summary["privacy"]["grids"][0]["epsilon"]
    assert p["sweep"] == summary["privacy"]["sweep"]
    # Nothing that would bound the secret number of runs.
    assert not _keys(card) & TIMING_KEYS
    assert card["trial"]["hyperparameters"] == released["params"]
    # No timestamps: the same trial always gets the same bytes.
    assert card_bytes(card) == card_bytes(_card(sweeps.engine, released["id"], model))
    # The grid's other runs have no model, and the refusal names no count or other trial.
    others = [t for t in _trials(sweeps.engine, sweeps.ps) if t.id != released["id"]]
    assert len(others) == 2
    for t in others:
        with pytest.raises(IllegalState) as exc:
            _card(sweeps.engine, t.id, model)
        message = str(exc.value).replace(t.id, "")
        assert released["id"] not in message and not any(c.isdigit() for c in message)


def test_position_keys_are_what_a_selected_record_masks(sweeps: Sweeps) -> None:
    t = max(_trials(sweeps.engine, sweeps.compose), key=lambda t: t.number)
    full, masked = trial_record(t), trial_record(t, selected_only=True)
    assert {k for k in full if full[k] != masked[k]} <= set(POSITION_KEYS)
    assert all(masked[k] in (None, 0) for k in POSITION_KEYS)
    assert full["finished_at"] is not None  # the comparison above saw something to mask


def test_card_bytes_are_canonical_json(sweeps: Sweeps, model: dict[str, Any]) -> None:
    t = _trials(sweeps.engine, sweeps.compose)[0]
    card = _card(sweeps.engine, t.id, model)
    data = card_bytes(card)
    assert data.endswith(b"}\n") and json.loads(data) == card
    # Key order and a JSON round trip change nothing.
    shuffled = dict(reversed(list(json.loads(data).items())))
    assert card_bytes(shuffled) == card_bytes(json.loads(data)) == data
    assert data.decode("utf-8").startswith('{\n  "card_version": 2,')
    with pytest.raises(ValueError):
        card_bytes(card | {"x": float("nan")})


def test_markdown_says_what_epsilon_covers(sweeps: Sweeps, model: dict[str, Any]) -> None:
    t = _trials(sweeps.engine, sweeps.compose)[0]
    card = _card(sweeps.engine, t.id, model)
    text = render_card_markdown(card)
    p = card["privacy"]
    assert text.startswith("# Model card: logreg")
    assert p["covers"] in text and p["sweep"]["covers"] in text
    assert f"σ = {p['noise_multiplier']:.4g}" in text and "T = 20 steps" in text
    assert card["evaluation"]["statement"] in text
    assert "| accuracy |" in text and "| ece |" in text
    assert model["weights_sha256"] in text
    assert "## Warnings" not in text


def test_a_non_private_model_says_so(tmp_path: Path, model: dict[str, Any]) -> None:
    # Sweeps refuse non-private arms; a trial row that trained without DP (its result has no
    # epsilon) is labelled all the same, never given its grid's epsilon.
    url = f"sqlite:///{tmp_path / 'np.db'}"
    upgrade(url)
    engine = make_engine(url)
    sid = create_sweep(engine, tiny_spec(arms=ONE_ARM, privacy={"budgets": [2], "delta": 1e-5}))
    with Session(engine) as s, s.begin():
        t = s.scalars(sa.select(Trial).where(Trial.sweep_id == sid)).one()
        t.strategy, t.state = "nonprivate", TrialState.done
        now = datetime.now(UTC)
        t.started_at, t.finished_at, t.train_seconds = now, now, 1.0
        s.add(
            TrialResultRow(
                trial_id=t.id,
                metrics={"accuracy": 0.9, "loss": 0.3},
                final_metrics={},
                steps=20,
                best_step=20,
                trajectories={},
                objective=0.9,
            )
        )
        tid = t.id
    card = _card(engine, tid, model)
    p = card["privacy"]
    assert p["private"] is False and p["epsilon"] is None and p["single_run_epsilon"] is None
    assert p["warning"] == NOT_PRIVATE_WARNING and card["warnings"][0] == NOT_PRIVATE_WARNING
    assert "grid" not in p and "sweep" not in p
    assert NOT_PRIVATE_WARNING in render_card_markdown(card)
    engine.dispose()


def test_building_a_card_imports_no_torch(sweeps: Sweeps, model: dict[str, Any]) -> None:
    t = _trials(sweeps.engine, sweeps.compose)[0]
    code = (
        "import json, sys\n"
        "import sweeper.artifacts.cards as c\n"
        "assert 'torch' not in sys.modules, 'import'\n"
        "from sqlalchemy.orm import Session\n"
        "from sweeper.store import Trial\n"
        "from sweeper.store.engine import make_engine\n"
        f"e = make_engine({sweeps.url!r})\n"
        "with Session(e) as s:\n"
        f"    card = c.model_card(s, s.get(Trial, {t.id!r}), **json.loads(sys.argv[1]))\n"
        "c.render_card_markdown(card); c.card_bytes(card)\n"
        "print([m for m in ('torch', 'ray') if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(model)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
