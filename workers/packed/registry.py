"""The packed engine's layer hook: which packed implementation runs each ``nn.Module`` type.

Every layer kind goes through this one registry, the built-in ones included
(:mod:`workers.packed.linear`, :mod:`workers.packed.conv`, :mod:`workers.packed.ws_conv`,
:mod:`workers.packed.parameter_free`),
and so do the Lipschitz layers (:mod:`workers.lipschitz.layers`). A new kind, such as a residual
block (a :class:`~workers.packed.layer.CompositeLayer`), is one file with its packed class and
one entry::

    register_packed_layer(ResidualBlock)(PResidualBlock)

Lookups are by exact type (a subclass of ``nn.Linear`` is not silently treated as one).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from torch import nn

from dpsweep.registry import Registry
from workers.packed.layer import PackedLayer

#: Builds a packed layer from one module (of the type it is registered for).
Converter = Callable[[Any], PackedLayer]

#: The built-in layer kinds, for error messages.
SUPPORTED = "Linear, Conv2d, WSConv2d, ConvTranspose2d, pooling, Flatten, activations"

#: The modules of the built-in layer kinds (each registers its kinds when imported).
BUILTIN_MODULES = ("linear", "conv", "ws_conv", "parameter_free")


def load_builtin_layers() -> None:
    """Import (and so register) every built-in layer kind."""
    for module in BUILTIN_MODULES:
        importlib.import_module(f"workers.packed.{module}")


def _unsupported(module_type: type[nn.Module]) -> str:
    return f"layer {module_type.__name__} is not supported in DP models; supported: {SUPPORTED}"


#: The packed implementation of each module type, by exact type; the built-in layer kinds are
#: imported on a miss.
CONVERTERS: Registry[type[nn.Module], Converter] = Registry(
    "layer", load=load_builtin_layers, unknown=_unsupported
)


def register_packed_layer(module_type: type[nn.Module]) -> Callable[[Converter], Converter]:
    """Teach the packer a new module type (e.g. a Lipschitz layer or a residual block).

    A type registered again gets the new implementation (a plug-in may replace a built-in's).
    """
    return CONVERTERS.registering(module_type, replace=True)


def convert_layer(m: nn.Module) -> PackedLayer:
    """The packed implementation of ``m``.

    Raises:
        ConfigError: no packed implementation is registered for ``type(m)``.
    """
    return CONVERTERS.lookup(type(m))(m)
