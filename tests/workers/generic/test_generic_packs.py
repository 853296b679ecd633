"""A generic pack runs its K trials as one vmap or one after another: the same gradients either
way (bench/generic_packs.py decides which is faster per architecture; the descriptor says)."""

from __future__ import annotations

import pytest
import torch

from tests.workers.generic.nets import token_problem, transformers
from workers.engine import per_sample_loss
from workers.generic import GenericModel
from workers.models.descriptors import DESCRIPTORS

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


def test_batched_and_sequential_trials_give_the_same_per_example_gradients() -> None:
    x, y = token_problem(n=6)
    k = 3
    xs, ys = x.unsqueeze(0).expand(k, *x.shape), y.unsqueeze(0).expand(k, *y.shape)
    grads = {}
    for batched in (True, False):
        model = GenericModel(transformers(k), batched_trials=batched)
        out, cap = model.forward(xs, capture=True)
        assert cap is not None
        infos = model.layer_grads(per_sample_loss(out, ys, "classification").sum(), cap)
        grads[batched] = model.per_sample_grads(infos)
        # BAM's perturbed pass: each example at its own point, both ways.
        scale = torch.full((k, x.shape[0]), 0.1)
        pert, _ = model.forward(xs, perturb=(infos, scale))
        grads[(batched, "perturbed")] = pert
    torch.testing.assert_close(grads[True], grads[False], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        grads[(True, "perturbed")], grads[(False, "perturbed")], rtol=1e-5, atol=1e-6
    )


def test_every_generic_builtin_declares_how_its_packs_run() -> None:
    for d in DESCRIPTORS.values():
        assert d.generic_packs in ("batched", "sequential")
