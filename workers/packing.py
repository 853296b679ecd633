"""Forming packs: which trials may train together, and how many fit in memory.

Trials share a pack only if everything but their per-trial knobs (lr, seed, noise multiplier,
delta and the strategy's per-trial hyperparameters) is equal: dataset and split, model,
strategy and its *shared* hyperparameters (e.g. clip style), batch size, step count, optimizer,
evaluation cadence, accountant and device. Pack size is then capped by a memory budget.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import torch

from workers.datasets.descriptors import DATASET_DESCRIPTORS
from workers.datasets.records import DatasetSpec
from workers.generic.dispatch import packable
from workers.generic.memory import generic_trial_floats
from workers.models.registry import build_model
from workers.pack_keys import pack_key
from workers.packed.model import PackedModel
from workers.settings import WorkerSettings
from workers.strategies import get_descriptor
from workers.training.evaluation import DIAGNOSTIC_BATCH
from workers.training.specs import PackSpec

# The noise sampler's work buffers per parameter and release, in 4-byte units
# (workers/polar.py): the keystream words (about 1.28 words of 8 bytes per draw), the accepted
# pairs' u, v, s and ln s (4 x 0.5 x 8 bytes) and, where the release is not fused (on a GPU,
# or with the read-ahead), the draws themselves in float64 (8 bytes): about 34 bytes.
SAMPLER_FLOATS = 9


def estimate_trial_bytes(spec: PackSpec, *, input_shape: tuple[int, ...], num_classes: int) -> int:
    """A deliberately generous estimate of one trial's memory inside a pack, in bytes.

    Parameter-sized buffers (parameters, gradient, noise, extra releases, optimizer state,
    best checkpoint, the noise sampler's work buffers) plus activations and their gradients for
    the largest likely batch, plus materialised per-sample convolution gradients, for each of
    the strategy's gradient passes (its descriptor's ``gradient_passes``: BAM runs a second,
    perturbed pass).
    """
    module = build_model(spec.model, input_shape=input_shape, num_classes=num_classes, seed=0)
    b = spec.batch_size
    # With a privacy unit the batch counts units, each with up to rows_per_unit row slots.
    rows = spec.rows_per_unit if declares_units(spec.dataset) else 1
    b_max = max(int(b + 6 * math.sqrt(b) + 8) * rows, DIAGNOSTIC_BATCH)
    if spec.physical_batch_size is not None:
        # A logical batch in physical chunks holds one chunk's examples (and each example's
        # augmented copies) at a time (workers.chunked_step).
        b_max = max(spec.physical_batch_size * (spec.augment_multiplicity or 1), DIAGNOSTIC_BATCH)
    opt_state = {"sgd": 1 if spec.momentum else 0, "adam": 2}.get(spec.optimizer, 2)
    param_buffers = 8 + opt_state + SAMPLER_FLOATS
    passes = get_descriptor(spec.strategy).gradient_passes
    if not packable(module):
        # The generic path materialises every example's full gradient (workers.generic).
        return 4 * generic_trial_floats(
            module,
            input_shape=input_shape,
            batch=b_max,
            passes=passes,
            param_buffers=param_buffers,
        )
    model = PackedModel([module])
    with torch.no_grad():
        _, cap = model.forward(torch.zeros(1, 1, *input_shape), capture=True)
    assert cap is not None
    act_per_example = sum(t.numel() for t in cap.acts) + sum(t.numel() for t in cap.outs)
    conv_params = sum(
        math.prod(ly.param_shapes[0]) for ly in model.param_layers if len(ly.param_shapes[0]) > 2
    )
    floats = (
        param_buffers * model.numel
        + passes * 3 * act_per_example * b_max
        + passes * conv_params * b_max
    )
    if rows > 1 and spec.unit_bounding == "capped":
        # Capped units hold every row's full gradient at once (workers.unit_step).
        floats += model.numel * b_max
    return 4 * floats


def declares_units(dataset: DatasetSpec) -> bool:
    """Whether the pack's records have a privacy unit: the spec names one (every stored
    dataset with a unit does), or a shared set has its own (``mnist1d-people``)."""
    if dataset.privacy_unit is not None:
        return True
    d = DATASET_DESCRIPTORS.get(dataset.name)
    return d is not None and d.privacy_unit is not None


def max_pack_size(
    spec: PackSpec,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    settings: WorkerSettings | None = None,
) -> int:
    """How many of ``spec``'s trials fit one pack under the memory budget (at least 1).

    1 for a strategy whose descriptor is not ``packable``: its trials always run alone.
    """
    settings = settings or WorkerSettings()
    if not get_descriptor(spec.strategy).packable:
        return 1
    per_trial = estimate_trial_bytes(spec, input_shape=input_shape, num_classes=num_classes)
    budget = settings.pack_memory_mb * 2**20
    return max(1, min(settings.max_pack_size, int(budget // per_trial)))


def form_packs(
    specs: Iterable[PackSpec],
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    settings: WorkerSettings | None = None,
) -> list[PackSpec]:
    """Merge compatible specs and split them into packs that fit the memory budget.

    Trial order is kept within each group; every trial lands in exactly one pack, and a pack
    never mixes trials whose :func:`pack_key` differs. ``input_shape`` and ``num_classes``
    describe the (shared) dataset of the specs.
    """
    groups: dict[str, list[Any]] = {}
    first: dict[str, PackSpec] = {}
    for spec in specs:
        key = pack_key(spec)
        first.setdefault(key, spec)
        groups.setdefault(key, []).extend(spec.trials)
    packs: list[PackSpec] = []
    for key, trials in groups.items():
        base = first[key]
        size = max_pack_size(
            base, input_shape=input_shape, num_classes=num_classes, settings=settings
        )
        for start in range(0, len(trials), size):
            packs.append(replace(base, trials=list(trials[start : start + size])))
    return packs
