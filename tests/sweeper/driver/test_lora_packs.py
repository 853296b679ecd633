"""LoRA's rank (the ``lora_r`` grid axis) shapes the model, not the strategy: trials of
different ranks never share a pack, each builds its own rank, and the strategy never sees it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dpsweep.spec import SweepSpec
from sweeper.driver.packs import pack_spec
from workers.pack_keys import pack_key


def _spec(checkpoint: Path) -> SweepSpec:
    return SweepSpec.model_validate(
        {
            "name": "ranks",
            "dataset": {"name": "digits"},
            "model": {
                "name": "mlp",
                "options": {"hidden": [8]},
                "checkpoint": None,
                "trainable": "lora",
                "lora": {"r": 4, "target_modules": ["1"]},
            },
            "training": {"steps": 2, "batch_size": 16},
            "privacy": {"budgets": [4], "delta": 1e-5},
            "arms": [{"strategy": "fixed", "grid": {"lr": [0.5], "clip": [1.0], "lora_r": [2, 4]}}],
        }
    )


def _trial(rank: int | None, tid: str) -> SimpleNamespace:
    params = {"lr": 0.5, "clip": 1.0, **({"lora_r": rank} if rank is not None else {})}
    return SimpleNamespace(
        id=tid, arm="fixed", strategy="fixed", params=params, seed=0,
        noise_multiplier=1.0, target_delta=1e-5,
    )  # fmt: skip


def test_ranks_split_packs_and_stay_out_of_the_strategy(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    assert spec.arms[0].label == "fixed"
    p2 = pack_spec(spec, [_trial(2, "a"), _trial(2, "b")], dataset=None, accountant="pld")
    p4 = pack_spec(spec, [_trial(4, "c")], dataset=None, accountant="pld")
    assert p2.model.lora.r == 2 and p4.model.lora.r == 4  # each builds its own rank
    assert all("lora_r" not in t.params for t in p2.trials)  # the strategy never sees it
    assert pack_key(p2) != pack_key(p4)
    assert pack_key(pack_spec(spec, [_trial(2, "d")], dataset=None, accountant="pld")) == (
        pack_key(p2)
    )
    with pytest.raises(ValueError, match="mixes trials of LoRA ranks"):
        pack_spec(spec, [_trial(2, "e"), _trial(4, "f")], dataset=None, accountant="pld")
    # Without the axis, the model section's rank.
    assert pack_spec(spec, [_trial(None, "g")], dataset=None, accountant="pld").model.lora.r == 4
