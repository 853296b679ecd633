"""Packed models: K same-architecture trials as one batched computation.

A :class:`PackedModel` is compiled from K ``nn.Sequential`` models of the same architecture
(one per trial, each initialised from its own seed). Every tensor carries a leading trial
dimension: parameters live in one flat ``[K, P]`` buffer (layers hold views into it), and
activations are ``[K, B, ...]``. A single trial is a pack of one.

Per-sample gradients never go through autograd's parameter gradients. Parameters do not require
grad; the forward records each parametrised layer's input ``a`` and output ``z``, one
``autograd.grad`` call returns ``dL/dz`` for every layer, and each layer turns ``(a, dL/dz)``
into what DP-SGD needs:

* per-sample squared gradient norms, and
* weighted sums ``sum_i w_i g_i`` for per-sample weights ``w`` chosen by a clipping strategy.

Linear layers use the exact "ghost" identity ``||g_i a_i^T||^2 = ||g_i||^2 ||a_i||^2`` and one
batched matmul for the weighted sum, so the private step costs about what the non-private step
costs. Convolutions materialise exact per-sample gradients with one grouped weight-gradient call
(each example its own group): as many FLOPs as the ordinary weight gradient, and on the models
here (few channels, many positions) far cheaper than the ghost form, whose cost grows with the
square of the number of positions, and about 5x faster than unfold + batched matmul.

Convolutions run as grouped convolutions over the trial dimension, in the layout
``[B, K*C, H, W]`` ("bk"); linear layers use ``[K, B, ...]`` ("kb"). Activations carry their
layout along so consecutive convolutions never reshuffle memory.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from dpsweep.errors import ConfigError
from workers.packed.layer import Act, CompositeLayer, PackedLayer, ParamLayer, param_layers_of
from workers.packed.linear import PLinear
from workers.packed.registry import SUPPORTED, convert_layer


@dataclass
class Captured:
    """What a capturing forward leaves for the backward pass."""

    acts: list[Tensor]
    outs: list[Tensor]


class PackedModel:
    """K trials of one architecture, with parameters in a flat ``[K, P]`` buffer.

    Args:
        modules: one ``nn.Sequential`` per trial, all of the same architecture. Their current
            parameter values become the pack's initial parameters.
        device: where the pack lives.
    """

    SUPPORTED: ClassVar[str] = SUPPORTED

    def __init__(self, modules: Sequence[nn.Sequential], device: torch.device | str = "cpu"):
        if not modules:
            raise ValueError("a pack needs at least one trial")
        self.k = len(modules)
        self.device = torch.device(device)
        self.template = modules[0]
        self.layers: list[PackedLayer] = [self._convert(m) for m in modules[0]]
        # Composite layers (workers.packed.layer.CompositeLayer) contribute their inner ones.
        self.param_layers: list[ParamLayer] = [p for ly in self.layers for p in param_layers_of(ly)]
        shapes = [s for ly in self.param_layers for s in ly.param_shapes]
        ref = [tuple(p.shape) for p in modules[0].parameters()]
        if [tuple(s) for s in shapes] != ref:
            raise ConfigError(f"model has parameters outside supported layers ({self.SUPPORTED})")
        if any(not p.requires_grad for p in modules[0].parameters()):
            # The packed layers train every parameter; frozen ones take the generic path
            # (workers.generic.dispatch), which keeps them out of the noise.
            raise ConfigError("the packed path trains every parameter; this model has frozen ones")
        self.numel = sum(math.prod(s) for s in shapes)
        # Every parameter is trained here (the generic path's counts, for the plan and card).
        self.trained_numel = self.total_numel = self.numel
        self.flat = torch.empty(self.k, self.numel, device=self.device)
        for i, m in enumerate(modules):
            params = list(m.parameters())
            if [tuple(p.shape) for p in params] != ref:
                raise ValueError("all modules in a pack must share one architecture")
            self.flat[i] = torch.cat([p.detach().reshape(-1) for p in params]).to(self.device)
        self._views_key: tuple[int, torch.Size] | None = None
        self._views: list[list[Tensor]] = []
        # Views per layer into the flat buffer (and, via view_like, into any [K, P] buffer).
        self.slices: list[list[tuple[int, int, tuple[int, ...]]]] = []
        off = 0
        for ly in self.param_layers:
            sl = []
            for s in ly.param_shapes:
                n = math.prod(s)
                sl.append((off, off + n, s))
                off += n
            self.slices.append(sl)
            ly.bind(self.view_like(self.flat, len(self.slices) - 1))

    @staticmethod
    def _convert(m: nn.Module) -> PackedLayer:
        return convert_layer(m)

    @property
    def n_param_layers(self) -> int:
        return len(self.param_layers)

    def view_like(self, buf: Tensor, layer: int) -> list[Tensor]:
        """Views ``[K, *shape]`` of ``buf`` (any ``[K, P]`` tensor) for one layer's params."""
        return [buf[:, a:b].view(self.k, *s) for a, b, s in self.slices[layer]]

    # -- forward ------------------------------------------------------------------------------

    def forward(
        self,
        x: Tensor,
        *,
        capture: bool = False,
        perturb: tuple[list[Any], Tensor] | None = None,
    ) -> tuple[Tensor, Captured | None]:
        """Run all trials on ``x`` ``[K, B, ...]``; returns output ``[K, B, ...]``.

        With ``capture``, also returns each parametrised layer's input and output so that
        :meth:`layer_grads` can recover per-sample gradients. With ``perturb=(infos, scale)``,
        example i runs at parameters ``theta + scale_i * g_i`` (``infos`` from a first pass).
        """
        h = Act(x, "kb", self.k)
        cap = Captured([], []) if capture else None
        li = 0

        def apply(ly: PackedLayer, h: Act) -> Act:
            nonlocal li
            if isinstance(ly, ParamLayer):
                if perturb is None:
                    a, z = ly.compute(h)
                else:
                    a, z = ly.compute_perturbed(h, perturb[0][li], perturb[1])
                li += 1
                if cap is not None:
                    if not z.requires_grad:
                        # First parametrised layer: parameters never require grad, so mark its
                        # output as the root of the backward graph (no wasted input gradient).
                        z.requires_grad_(True)
                    cap.acts.append(a)
                    cap.outs.append(z)
                return ly.wrap(z, h)
            if isinstance(ly, CompositeLayer):
                # The block runs its inner layers through this same function (capture, perturb).
                return ly.run(h, apply)  # noqa: F821 (the cell is cleared after the pass)
            return ly.forward(h)

        for ly in self.layers:
            h = apply(ly, h)
        # ``apply`` refers to itself (composite blocks call it back): a reference cycle that would
        # keep this pass's activations alive until the garbage collector runs. Clearing the cell
        # frees them as soon as the caller drops them (a logical batch in many physical chunks
        # would otherwise hold many chunks' activations at once).
        del apply
        return h.as_kb(), cap

    def layer_grads(self, loss_sum: Tensor, cap: Captured) -> list[Any]:
        """Backpropagate ``loss_sum`` (sum of per-sample losses) and build per-layer grad info."""
        gs = torch.autograd.grad(loss_sum, cap.outs)
        return [
            ly.grad_info(a.detach(), g, self.k)
            for ly, a, g in zip(self.param_layers, cap.acts, gs, strict=True)
        ]

    def sq_norms(self, infos: list[Any]) -> Tensor:
        """Per-sample, per-layer squared gradient norms ``[K, B, L]``."""
        return torch.stack(
            [ly.sq_norms(inf) for ly, inf in zip(self.param_layers, infos, strict=True)], dim=-1
        )

    def group_sq_norms(self, infos: list[Any], share: Tensor, rows: int) -> Tensor:
        """Per-group, per-layer squared norms ``[K, B / rows, L]`` of ``sum_r share_r g_r``
        over each group of ``rows`` consecutive examples (a privacy unit's row slots; see
        :meth:`ParamLayer.group_sq_norms`): a capped unit's mean gradient, never built."""
        return torch.stack(
            [
                ly.group_sq_norms(inf, share, rows)
                for ly, inf in zip(self.param_layers, infos, strict=True)
            ],
            dim=-1,
        )

    def weighted_sum_into(self, out: Tensor, infos: list[Any], weights: Tensor) -> None:
        """Write ``sum_i w_i g_i`` into ``out`` ``[K, P]``.

        ``weights`` is ``[K, B, R]``: R = 1 applies one weight per example to every layer,
        R = L gives each layer its own weight (layerwise clipping).
        """
        r = weights.shape[-1]
        views = self._cached_views(out)
        w = weights[..., 0] if r == 1 else None
        for li, (ly, inf) in enumerate(zip(self.param_layers, infos, strict=True)):
            ly.weighted_sum_into(inf, w if w is not None else weights[..., li], views[li])

    def weighted_sums_into(
        self, outs: list[Tensor], infos: list[Any], weights: list[Tensor]
    ) -> None:
        """:meth:`weighted_sum_into` for several ``[K, B, R]`` weightings in one pass."""
        if len(outs) == 1:
            self.weighted_sum_into(outs[0], infos, weights[0])
            return
        views = [[self.view_like(o, li) for o in outs] for li in range(len(self.param_layers))]
        for li, (ly, inf) in enumerate(zip(self.param_layers, infos, strict=True)):
            ws = [w[..., 0 if w.shape[-1] == 1 else li] for w in weights]
            ly.weighted_sums_into(inf, ws, views[li])

    def split_sums_into(
        self,
        main: Tensor,
        extra: Tensor,
        infos: list[Any],
        w_main: Tensor,
        w_extra: Tensor,
        coef: Tensor,
    ) -> None:
        """Two releases whose weights cover disjoint rows, for a pack of one.

        ``w_main`` equals ``coef * w_extra`` wherever ``w_extra`` is non-zero. Then
        ``main = sum_{w_extra = 0} w_main g + coef * extra``: each example's gradient enters one
        matmul only. Layers without a cheaper split fall back to both weighted sums.
        """
        if self.k != 1 or w_main.shape[-1] != 1 or w_extra.shape[-1] != 1:
            self.weighted_sums_into([main, extra], infos, [w_main, w_extra])
            return
        wm, we = w_main[..., 0], w_extra[..., 0]
        on_extra = we[0] != 0
        rows = (on_extra.logical_not().nonzero().squeeze(1), on_extra.nonzero().squeeze(1))
        c = float(coef[0])
        for li, (ly, inf) in enumerate(zip(self.param_layers, infos, strict=True)):
            outs = [self.view_like(main, li), self.view_like(extra, li)]
            if isinstance(ly, PLinear) and inf.a.dim() == 3:
                ly.split_sums_into(inf, wm, we, rows, c, outs)
            else:
                ly.weighted_sums_into(inf, [wm, we], outs)

    def _cached_views(self, buf: Tensor) -> list[list[Tensor]]:
        # The engine reuses one gradient buffer per release; building its per-layer views once
        # saves a few dozen tiny ops per step (which matters for small models on CPU).
        key = (buf.data_ptr(), buf.shape)
        if self._views_key != key:
            self._views_key = key
            self._views = [self.view_like(buf, li) for li in range(len(self.param_layers))]
        return self._views

    def per_sample_grads(self, infos: list[Any]) -> Tensor:
        """Flat per-sample gradients ``[K, B, P]`` (for tests and small diagnostics only)."""
        parts = []
        for ly, inf in zip(self.param_layers, infos, strict=True):
            for t in ly.per_sample_grads(inf):
                parts.append(t.reshape(t.shape[0], t.shape[1], -1))
        return torch.cat(parts, dim=-1)

    # -- export -------------------------------------------------------------------------------

    def to_module(self, trial: int, flat_row: Tensor | None = None) -> nn.Sequential:
        """A standalone ``nn.Sequential`` holding trial ``trial``'s (or ``flat_row``'s) weights."""
        m = copy.deepcopy(self.template).to(self.device)
        row = self.flat[trial] if flat_row is None else flat_row
        torch.nn.utils.vector_to_parameters(row.detach().clone(), m.parameters())
        return m
