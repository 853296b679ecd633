"""Which trials may share a pack: their pack key (torch-free, so that the driver can group a
sweep's trials without importing torch; :mod:`workers.packing` sizes the packs).

Trials share a pack only if everything but their per-trial knobs (lr, seed, noise multiplier,
delta and the strategy's per-trial hyperparameters) is equal: dataset and split, model,
strategy and its *shared* hyperparameters (e.g. clip style), batch size, step count, optimizer,
evaluation cadence, accountant, device and the plan the worker enforces. The model includes
its checkpoint (digest) and what is trained, LoRA's rank too: trials of an arm's ``lora_r``
axis have different architectures, so each rank forms its own packs
(:func:`sweeper.driver.packs.pack_spec` takes the rank out of the strategy's params and into
the pack's model).
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from typing import TYPE_CHECKING

from workers.strategies import get_descriptor

if TYPE_CHECKING:
    from workers.training.specs import PackSpec


def pack_key(spec: PackSpec) -> str:
    """A canonical string that is equal exactly for specs whose trials may share a pack."""
    strategy = get_descriptor(spec.strategy)
    shared = {
        name: [strategy.validate(t.params)[name] for t in spec.trials]
        for name in strategy.shared_hyperparameters()
    }
    if any(len({json.dumps(v) for v in vals}) > 1 for vals in shared.values()):
        raise ValueError("a pack spec already mixes trials with different shared hyperparameters")
    fields = asdict(replace(spec, trials=[]))
    fields["shared_params"] = {name: vals[0] for name, vals in shared.items() if vals}
    return json.dumps(fields, sort_keys=True, default=str)
