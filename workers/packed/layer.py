"""The layer protocol of the packed engine: activations with a layout, and the layer kinds.

Every packed layer acts on an :class:`Act` (a tensor plus its layout). Parameter-free layers
implement :meth:`PackedLayer.forward`; layers with parameters (:class:`ParamLayer`) implement
the per-sample gradient algebra; composite layers (:class:`CompositeLayer`, e.g. a residual
block) are made of other packed layers. Each kind is registered for the ``nn.Module`` type it
packs with :func:`workers.packed.registry.register_packed_layer`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor

from dpsweep.errors import ConfigError
from workers.group_norms import materialised_group_sq

Layout = Literal["kb", "bk"]


@dataclass
class Act:
    """An activation with its layout: ``kb`` = ``[K, B, ...]``; ``bk`` = ``[B, K*C, H, W]``."""

    t: Tensor
    layout: Layout
    k: int

    def as_kb(self) -> Tensor:
        if self.layout == "kb":
            return self.t
        b = self.t.shape[0]
        rest = self.t.shape[2:]
        return self.t.view(b, self.k, -1, *rest).transpose(0, 1)

    def as_bk(self) -> Tensor:
        if self.layout == "bk":
            return self.t
        k, b = self.t.shape[:2]
        c = self.t.shape[2]
        return self.t.transpose(0, 1).reshape(b, k * c, *self.t.shape[3:])


class PackedLayer:
    """A layer of a packed model. Parameter-free layers only implement :meth:`forward`."""

    param_shapes: tuple[tuple[int, ...], ...] = ()

    def forward(self, x: Act) -> Act:
        raise NotImplementedError

    @property
    def has_params(self) -> bool:
        return bool(self.param_shapes)


class ParamLayer(PackedLayer):
    """A layer with parameters. Subclasses implement the per-sample gradient algebra.

    ``bind`` receives views ``[K, *shape]`` into the flat parameter buffer. ``compute`` returns
    ``(a, z)``: the saved input and the raw output whose gradient ``autograd.grad`` returns;
    ``wrap`` turns ``z`` into the activation the next layer reads (views only), so that the
    model can mark ``z`` as a graph root *before* anything is derived from it.
    """

    params: list[Tensor]

    def bind(self, views: list[Tensor]) -> None:
        self.params = views

    def compute(self, x: Act) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def wrap(self, z: Tensor, x: Act) -> Act:
        raise NotImplementedError

    def forward(self, x: Act) -> Act:
        return self.wrap(self.compute(x)[1], x)

    def compute_perturbed(self, x: Act, info: Any, scale: Tensor) -> tuple[Tensor, Tensor]:
        """Like :meth:`compute`, with each example's parameters moved by ``scale_i * grad_i``.

        ``info`` is this layer's :meth:`grad_info` from a first pass on the same examples, so
        ``grad_i`` is example i's own gradient; ``scale`` is ``[K, B]``. Used by BAM (003).
        """
        raise ConfigError(f"{type(self).__name__} does not support per-example perturbation")

    def grad_info(self, a: Tensor, g: Tensor, k: int) -> Any:
        """Precompute whatever norms and weighted sums share (e.g. per-sample gradients)."""
        raise NotImplementedError

    def sq_norms(self, info: Any) -> Tensor:
        """Per-sample squared gradient norm of all this layer's parameters, ``[K, B]``."""
        raise NotImplementedError

    def weighted_sum(self, info: Any, w: Tensor) -> list[Tensor]:
        """``sum_i w[k, i] * grad_i`` for every parameter, each ``[K, *shape]``."""
        raise NotImplementedError

    def weighted_sum_into(self, info: Any, w: Tensor, out: list[Tensor]) -> None:
        """:meth:`weighted_sum` written into ``out`` (views of the flat gradient buffer)."""
        for dst, src in zip(out, self.weighted_sum(info, w), strict=True):
            dst.copy_(src)

    def weighted_sums_into(self, info: Any, ws: list[Tensor], outs: list[list[Tensor]]) -> None:
        """Several weightings of the same per-sample gradients at once (one per release)."""
        for w, out in zip(ws, outs, strict=True):
            self.weighted_sum_into(info, w, out)

    def per_sample_grads(self, info: Any) -> list[Tensor]:
        """Materialised per-sample gradients, each ``[K, B, *shape]`` (tests, diagnostics)."""
        raise NotImplementedError

    def group_sq_norms(self, info: Any, share: Tensor, rows: int) -> Tensor:
        """``||sum_r share_r grad_r||^2`` over each group of ``rows`` consecutive examples
        (a privacy unit's row slots), ``[K, B / rows]``.

        Examples whose share is 0 (padding, removed rows) count as zero gradients, whatever
        their info holds. This default materialises the layer's per-example gradients
        (:mod:`workers.group_norms`); a layer with a cheaper exact form overrides it.
        """
        return materialised_group_sq(self.per_sample_grads(info), share, rows)


class CompositeLayer(PackedLayer):
    """A packed layer made of other packed layers: the hook for composites (a residual block).

    The packed model treats the inner parametrised layers as its own: :meth:`param_layers`
    lists them in the order of the ``nn.Module``'s ``parameters()`` (the flat buffer's order),
    the model binds them to views of its flat buffer, and it captures their inputs and outputs
    for per-sample gradients exactly as it does for top-level layers. A subclass

    * converts its children in ``__init__`` with :func:`workers.packed.registry.convert_layer`
      and keeps them in :attr:`layers`;
    * implements :meth:`run`, calling ``apply(layer, x)`` for every inner layer (never
      ``layer.forward``), so that capture and BAM's per-example perturbation reach them.
      Whatever else the block computes (e.g. adding the skip connection) must act example by
      example, as every packed layer does, so that per-sample gradients stay exact;
    * is registered like any layer: ``register_packed_layer(MyBlock)(PMyBlock)``.
    """

    layers: list[PackedLayer]

    def param_layers(self) -> list[ParamLayer]:
        """The inner parametrised layers, nested composites flattened, in parameter order."""
        return [p for ly in self.layers for p in param_layers_of(ly)]

    def run(self, x: Act, apply: Callable[[PackedLayer, Act], Act]) -> Act:
        """The block's output; ``apply(layer, act)`` runs one inner layer as the model does."""
        raise NotImplementedError

    def forward(self, x: Act) -> Act:
        return self.run(x, _plain_forward)


def _plain_forward(layer: PackedLayer, x: Act) -> Act:
    return layer.forward(x)


def param_layers_of(layer: PackedLayer) -> list[ParamLayer]:
    """The parametrised layers a layer holds: itself, a composite's inner ones, or none."""
    if isinstance(layer, ParamLayer):
        return [layer]
    if isinstance(layer, CompositeLayer):
        return layer.param_layers()
    return []
