"""Sweep spec: YAML/JSON/dict loading, grid expansion, and errors that name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpsweep.errors import ConfigError
from dpsweep.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
BASE = {
    "name": "t",
    "dataset": {"name": "digits"},
    "model": {"name": "mlp"},
    "privacy": {"budgets": [1, 3], "delta": 1e-5},
    "arms": [
        {"strategy": "fixed", "grid": {"lr": {"logspace": [-2, 0], "k": 3}, "clip": [0.1, 1.0]}},
        {"strategy": "online", "grid": {"lr": [0.1, 1.0]}},
    ],
    "seeds": 2,
}


def test_loads_from_dict_yaml_file_and_json_text(tmp_path: Path) -> None:
    a = load_spec(BASE)
    b = load_spec(json.dumps(BASE))
    path = tmp_path / "s.yaml"
    path.write_text((ROOT / "examples" / "digits-clipping.yaml").read_text())
    c = load_spec(path)
    assert a == b and c.name == "digits-clipping" and len(c.arms) == 3


def test_grid_expansion_and_trials_per_grid() -> None:
    spec = load_spec(BASE)
    fixed, online = spec.arms
    pts = fixed.points()
    assert len(pts) == 6
    assert sorted({p["lr"] for p in pts}) == pytest.approx([0.01, 0.1, 1.0])
    assert spec.trials_per_grid(fixed) == 12  # 6 points x 2 charged seeds
    assert spec.trials_per_grid(online) == 4
    free = load_spec({**BASE, "privacy": {**BASE["privacy"], "charge_repeats": False}})
    assert free.trials_per_grid(free.arms[0]) == 6
    rnd = load_spec({**BASE, "search": {"method": "random", "n": 10}})
    assert rnd.trials_per_grid(rnd.arms[0]) == 20


@pytest.mark.parametrize(
    "patch,field,message",
    [
        ({"privacy": {"budgets": [0], "delta": 1e-5}}, "privacy.budgets", "finite number > 0"),
        ({"privacy": {"budgets": [1], "delta": 1.5}}, "privacy.delta", "less than 1"),
        (
            {"privacy": {"budgets": [1], "delta": 1e-5, "accounting": "magic"}},
            "privacy.accounting",
            "compose",
        ),
        (
            {"privacy": {"budgets": [1], "delta": 1e-5, "accounting": "papernot-steinke"}},
            "privacy",
            "needs a distribution",
        ),
        (
            {
                "privacy": {
                    "budgets": [1],
                    "delta": 1e-5,
                    "accounting": "papernot-steinke",
                    "distribution": {"name": "logarithmic"},
                },
                "search": {"method": "tpe", "n": 5},
            },
            "",
            "tpe is adaptive",
        ),
        ({"search": {"method": "random"}}, "search", "needs n"),
        ({"colour": "blue"}, "colour", "Extra inputs are not permitted"),
        (
            {"arms": [{"strategy": "fixed", "grid": {"lr": {"logspace": [-2, 0]}}}]},
            "arms.0.grid",
            "grid axis 'lr': k: Field required",
        ),
        ({"arms": [{"strategy": "fixed"}, {"strategy": "fixed"}]}, "", "arm names must be unique"),
        # Issue 39: levels that write alike would share one grid key (arm@level).
        ({"privacy": {"budgets": [1, 1], "delta": 1e-5}}, "privacy.budgets", "must differ"),
        (
            {"privacy": {"budgets": [2, 2.0000001], "delta": 1e-5}},
            "privacy.budgets",
            "same level (2) to six significant digits",
        ),
    ],
)
def test_errors_name_the_field(patch: dict, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_spec({**BASE, **patch})
    assert message in str(exc.value)
    assert (exc.value.field or "").startswith(field)


def test_bad_text_and_missing_file() -> None:
    with pytest.raises(ConfigError, match="not valid YAML or JSON"):
        load_spec("name: [unclosed\n")
    with pytest.raises(ConfigError, match="spec file not found"):
        load_spec("/nonexistent/spec.yaml")
