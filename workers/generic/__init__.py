"""The generic DP path: any ``nn.Module``, per-example gradients by ``torch.func``.

* :mod:`workers.generic.validation`: the up-front check (Opacus's validators) that refuses
  layers breaking per-example DP, naming the layer and the fix;
* :mod:`workers.generic.model`: :class:`GenericModel`, the interface
  :class:`~workers.engine.DPEngine` uses, for K trials of any module;
* :mod:`workers.generic.bookkeeping`: :class:`BookkeepingModel`, ghost norms and book-keeping
  sums (one backward) for the layers with a rule, the default generic model;
* :mod:`workers.generic.layer_rules`: which layers have a book-keeping rule, and the fail-closed
  watch on how their parameters are used;
* :mod:`workers.generic.ghost`: a rule layer's per-example norms (ghost norms) and weighted sums
  from its recorded inputs and output gradients;
* :mod:`workers.generic.dispatch`: :func:`build_pack_model`, the packed path where it applies,
  else the generic one;
* :mod:`workers.generic.memory`: a generous per-trial memory estimate for the packer.
"""

from __future__ import annotations

from workers.generic.bookkeeping import BookkeepingModel
from workers.generic.dispatch import EnginePath, build_pack_model, packable
from workers.generic.memory import generic_trial_floats
from workers.generic.model import GenericCaptured, GenericModel
from workers.generic.validation import validate_module

__all__ = [
    "BookkeepingModel",
    "EnginePath",
    "GenericCaptured",
    "GenericModel",
    "build_pack_model",
    "generic_trial_floats",
    "packable",
    "validate_module",
]
