"""The packed engine: K same-architecture trials as one batched computation.

* :mod:`workers.packed.layer`: activations with a layout, and the layer kinds (parameter-free,
  with parameters, composite);
* :mod:`workers.packed.registry`: the hook that maps an ``nn.Module`` type to its packed layer;
* :mod:`workers.packed.linear`, :mod:`workers.packed.conv`, :mod:`workers.packed.ws_conv`,
  :mod:`workers.packed.parameter_free`: the built-in layer kinds;
* :mod:`workers.packed.model`: :class:`PackedModel`, the flat ``[K, P]`` parameters, the
  capturing forward and the per-sample gradient algebra over all layers.

Adding a layer kind (e.g. a residual block for issue 22) is one file with its packed class
(a :class:`CompositeLayer` subclass for a block of layers) and one
``register_packed_layer(ModuleType)(PackedClass)`` entry; see :mod:`workers.packed.registry`.
"""

from __future__ import annotations

from workers.packed.layer import Act, CompositeLayer, PackedLayer, ParamLayer, param_layers_of
from workers.packed.model import Captured, PackedModel
from workers.packed.registry import (
    CONVERTERS,
    convert_layer,
    load_builtin_layers,
    register_packed_layer,
)

# The built-in layer kinds register themselves on import.
load_builtin_layers()

__all__ = [
    "CONVERTERS",
    "Act",
    "Captured",
    "CompositeLayer",
    "PackedLayer",
    "PackedModel",
    "ParamLayer",
    "convert_layer",
    "load_builtin_layers",
    "param_layers_of",
    "register_packed_layer",
]
