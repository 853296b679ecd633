"""The injected faults of the audit tests and of ``bench/audit.py``: patches, never options.

* ``halved_noise``: every release gets half its noise;
* ``shared_noise``: every trial of a pack draws trial 0's noise;
* ``unclipped_example``: each step one sampled example (at random) keeps its raw gradient (the
  engine's sensitivity check is disabled, as a bug that slipped past it would be);
* ``doubled_rate``: Poisson sampling at 2q.

:func:`scale_noise` is the subtler fault of issue 49: noise at a fraction of its planned scale.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import workers.engine as engine_module
from workers.randomness import NoiseSource, add_snapped_noise
from workers.strategies import get_strategy

FAULTS = ("halved_noise", "shared_noise", "unclipped_example", "doubled_rate")


def scale_noise(scale: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch the engine so that every release gets ``scale`` times its planned noise."""
    original = engine_module.DPEngine._add_noise

    def add_noise(self: Any, buf: torch.Tensor, sensitivity: torch.Tensor, mult: Any) -> Any:
        return original(self, buf, sensitivity, mult * scale)

    monkeypatch.setattr(engine_module.DPEngine, "_add_noise", add_noise)


def inject(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch the engine with fault ``name`` (undone with ``monkeypatch``)."""
    if name == "halved_noise":
        scale_noise(0.5, monkeypatch)
    elif name == "shared_noise":

        def shared(self: NoiseSource, buf: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
            z = self.standard_normal(buf.shape[1]).clone()
            z[1:] = z[0]
            return add_snapped_noise(buf, z, std)

        monkeypatch.setattr(NoiseSource, "add_noise", shared)
    elif name == "unclipped_example":
        monkeypatch.setattr(engine_module, "_check_sensitivity", lambda *a, **k: None)
        cls = get_strategy("fixed")
        clip0 = cls.clip
        rng = np.random.default_rng()

        def clip(self: Any, ctx: Any) -> Any:
            result = clip0(self, ctx)
            for k in range(ctx.mask.shape[0]):
                sampled = (ctx.mask[k] > 0).nonzero().flatten()
                if sampled.numel():
                    result.weights[k, sampled[int(rng.integers(sampled.numel()))]] = 1.0
            return result

        monkeypatch.setattr(cls, "clip", clip)
    elif name == "doubled_rate":
        one, pack = engine_module.poisson_sample, engine_module.poisson_sample_pack
        monkeypatch.setattr(
            engine_module,
            "poisson_sample",
            lambda n, *, sample_rate, stream: one(
                n, sample_rate=min(1.0, 2 * sample_rate), stream=stream
            ),
        )
        monkeypatch.setattr(
            engine_module,
            "poisson_sample_pack",
            lambda n, *, sample_rate, streams: pack(
                n, sample_rate=min(1.0, 2 * sample_rate), streams=streams
            ),
        )
    else:
        raise ValueError(f"unknown fault {name!r}; one of {FAULTS}")
