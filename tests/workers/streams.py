"""Public-seeded random streams for tests that compare the engine with a hand computation.

Production trials draw a fresh OS secret (:meth:`TrialRandomness.secret`); these use the
labelled reproducible mode so that a test can regenerate exactly what the engine drew.
"""

from __future__ import annotations

import torch

from workers.engine import _ENFORCED
from workers.randomness import RandomStream, TrialRandomness, add_snapped_noise


def sample_stream(seed: int) -> RandomStream:
    return TrialRandomness.reproducible(seed).sample


def noise_stream(seed: int) -> RandomStream:
    return TrialRandomness.reproducible(seed).noise


def normals(seed: int, *sizes: int) -> list[torch.Tensor]:
    """Consecutive standard normal draws of the noise stream of ``seed``, one per size."""
    stream = noise_stream(seed)
    return [torch.from_numpy(stream.standard_normal(n)) for n in sizes]


def noised(total: torch.Tensor, xi: torch.Tensor, std: float) -> torch.Tensor:
    """What the engine releases for the private sum ``total`` with draws ``xi`` at noise ``std``
    (the claimed sensitivity's std; the engine scales it to the sensitivity it enforces)."""
    out = total.detach().to(torch.float32).reshape(1, -1).clone()
    add_snapped_noise(
        out, xi.reshape(1, -1).to(torch.float64).clone(), torch.tensor([std * _ENFORCED])
    )
    return out.reshape(total.shape)
