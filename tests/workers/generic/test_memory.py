"""The generic path's memory estimate counts per-example gradients and activations."""

from __future__ import annotations

from torch import nn

from tests.workers.generic.nets import TinyTransformer
from workers.generic.memory import activation_floats, generic_trial_floats


def test_activation_floats_of_a_known_model() -> None:
    # Linear (5) + ReLU (5) + the Sequential's own output (5), for one example.
    assert activation_floats(nn.Sequential(nn.Linear(4, 5), nn.ReLU()), (4,)) == 15


def test_models_taking_token_ids_are_measured_too() -> None:
    assert activation_floats(TinyTransformer(), (6,)) > 0


def test_estimate_grows_with_batch_and_passes() -> None:
    m = nn.Sequential(nn.Linear(4, 5), nn.ReLU())
    p = sum(q.numel() for q in m.parameters())
    one = generic_trial_floats(m, input_shape=(4,), batch=10, passes=1, param_buffers=8)
    assert one == 8 * p + 10 * (2 * p + 3 * 15)
    assert generic_trial_floats(m, input_shape=(4,), batch=10, passes=2, param_buffers=8) > one
