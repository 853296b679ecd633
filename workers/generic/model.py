"""The generic DP path: K trials of any ``nn.Module``, per-example gradients by ``torch.func``.

:class:`GenericModel` implements the interface :class:`~workers.engine.DPEngine` uses (the one
:class:`~workers.packed.model.PackedModel` implements), so every clipping strategy runs on it
unchanged. It trades the packed path's speed for generality:

* parameters live in one flat ``[K, P]`` buffer in ``named_parameters()`` order (the order
  ``to_module`` and the checkpoints use); ``functional_call`` runs the module on views of it,
  and ``vmap`` over the trial dimension runs the K trials at once (a pack shares one
  architecture);
* every example runs alone (``vmap`` over the batch of a single-example call), so examples can
  never mix, and its gradient is ``torch.func.grad`` of ``<f(theta, x_i), v_i>`` where
  ``v_i = dL/d out_i`` comes from the engine's own loss (mask included): the exact per-example
  gradient of whatever loss the engine builds, with no per-layer rule written by hand;
* clipping "layers" are the *parametrised submodules*: the modules that own parameters
  directly (``recurse=False``), in ``named_parameters()`` order. ``nn.MultiheadAttention`` is
  two layers (its own ``in_proj_*`` and its ``out_proj``);
* BAM's perturbed pass runs each example at its own ``theta + s_i g_i`` (a ``vmap`` over
  per-example parameters).

Frozen parameters (``requires_grad == False`` in the modules handed in, e.g. a pretrained
backbone under LoRA adapters or a new head) are constants of the pack: they are not in the
flat buffer (so they get no per-example gradient, no clipping and no noise: the engine noises
the ``[K, P]`` buffer, P the *trained* parameter count), they are held once when every trial
holds the same values (one checkpoint) and stacked per trial otherwise, and ``to_module`` puts
them back. Clipping layers are the submodules owning trained parameters. Noise and sampling stay
in the engine: nothing here draws randomness.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from dpsweep.errors import ConfigError
from workers.generic.validation import validate_module
from workers.group_norms import materialised_group_sq

# Per-layer info: the per-example gradients of the layer's parameters, each [K, B, *shape].
LayerInfo = list[Tensor]


@dataclass
class GenericCaptured:
    """What a capturing forward leaves for :meth:`GenericModel.layer_grads`."""

    x: Tensor  # [K, B, ...] the inputs
    params: dict[str, Tensor]  # [K, *shape], or [K, B, *shape] for a perturbed pass
    per_example: bool  # whether ``params`` carry the batch dimension
    out: Tensor  # [K, B, ...] the output, a graph root (its gradient is v)


class GenericModel:
    """K trials of one architecture (any ``nn.Module``), parameters in a flat ``[K, P]`` buffer.

    Args:
        modules: one module per trial, all of the same architecture. Their current parameter
            values become the pack's initial parameters.
        device: where the pack lives.
        batched_trials: run the K trials as one ``vmap`` over the trial dimension (True), or
            one after another in this worker (False); the results are the same.

    Attributes:
        numel / trained_numel: the trained parameter count P (the flat buffer's width, and so
            the dimension of the Gaussian noise).
        total_numel: every parameter of the model, frozen ones included.

    Raises:
        ConfigError: a layer that breaks per-example DP (see
            :func:`workers.generic.validation.validate_module`), or a model whose every
            parameter is frozen.
    """

    def __init__(
        self,
        modules: Sequence[nn.Module],
        device: torch.device | str = "cpu",
        *,
        batched_trials: bool = True,
    ):
        if not modules:
            raise ValueError("a pack needs at least one trial")
        validate_module(modules[0])
        self.k = len(modules)
        # vmap over the K trials, or one trial after another (same results): which is faster
        # depends on the architecture (bench/generic_packs.py; the model descriptor's
        # ``generic_packs``).
        self.batched_trials = batched_trials
        self.device = torch.device(device)
        self.template = copy.deepcopy(modules[0]).to(self.device).train()
        named = list(self.template.named_parameters())
        # Tied weights: one Parameter under several names counts once (named_parameters drops
        # the duplicates) and functional_call feeds every alias the same tensor, so torch.func
        # treats it as the one parameter it is. Book-keeping watches how each is used and sends
        # a tied one to the exact materialised path (workers.generic.bookkeeping).
        self.tied = tied_aliases(self.template)
        self.names = [n for n, p in named if p.requires_grad]
        self.frozen_names = [n for n, p in named if not p.requires_grad]
        if named and not self.names:
            raise ConfigError(
                "every parameter of the model is frozen (requires_grad=False): there is nothing "
                "to train; leave at least one part trainable (e.g. the head)",
                field="model.trainable",
            )
        every = {n: tuple(p.shape) for n, p in named}
        self.shapes = {n: every[n] for n in self.names}
        self.numel = sum(math.prod(s) for s in self.shapes.values())
        self.trained_numel = self.numel
        self.total_numel = sum(math.prod(s) for s in every.values())
        self.flat = torch.empty(self.k, self.numel, device=self.device)
        arch = [(n, every[n], n in self.shapes) for n, _ in named]
        buffers: list[dict[str, Tensor]] = []
        for i, m in enumerate(modules):
            mine = list(m.named_parameters())
            if [(n, tuple(p.shape), p.requires_grad) for n, p in mine] != arch:
                raise ValueError(
                    "all modules in a pack must share one architecture and one trained part"
                )
            trained = [p for _, p in mine if p.requires_grad]
            if trained:
                self.flat[i] = torch.cat([p.detach().reshape(-1) for p in trained])
            buffers.append({n: b.detach().to(self.device) for n, b in m.named_buffers()})
        self.buffers = {n: torch.stack([b[n] for b in buffers]) for n in buffers[0]}
        self.frozen, self.frozen_shared = _frozen_values(self.template, modules, self.frozen_names)
        # Trial dimension of each constant (frozen parameter or buffer) for vmap: None for
        # frozen values shared by every trial (one copy, broadcast), else 0.
        self.const_dims: dict[str, int | None] = {
            **{n: None if self.frozen_shared else 0 for n in self.frozen},
            **{n: 0 for n in self.buffers},
        }
        # Layers: consecutive trained parameters owned by the same submodule (one clipping
        # group each). A submodule whose parameters are all frozen is no layer: it has no
        # per-example gradient to clip.
        self.layer_names: list[str] = []
        self.layer_params: list[list[str]] = []
        for name in self.names:
            owner = name.rpartition(".")[0]
            if not self.layer_names or self.layer_names[-1] != owner:
                self.layer_names.append(owner)
                self.layer_params.append([])
            self.layer_params[-1].append(name)
        self.slices: dict[str, tuple[int, int]] = {}
        off = 0
        for name, s in self.shapes.items():
            self.slices[name] = (off, off + math.prod(s))
            off += math.prod(s)

    @property
    def n_param_layers(self) -> int:
        return len(self.layer_names)

    def params(self, buf: Tensor | None = None) -> dict[str, Tensor]:
        """Views ``[K, *shape]`` of ``buf`` (the flat trained parameters by default), by name."""
        src = self.flat if buf is None else buf
        return {n: src[:, a:b].view(self.k, *self.shapes[n]) for n, (a, b) in self.slices.items()}

    def consts(self) -> dict[str, Tensor]:
        """The pack's constants by name: frozen parameters (trial dimension per
        :attr:`const_dims`) and buffers (``[K, *shape]``)."""
        return {**self.frozen, **self.buffers}

    def consts_of(self, trial: int) -> dict[str, Tensor]:
        """Trial ``trial``'s constants (frozen parameters and buffers), without the trial dim."""
        return {n: t if self.const_dims[n] is None else t[trial] for n, t in self.consts().items()}

    # -- forward ------------------------------------------------------------------------------

    def _example_out(
        self, params: dict[str, Tensor], consts: dict[str, Tensor], x: Tensor
    ) -> Tensor:
        # One example as a batch of one: the module sees the shapes it was written for.
        out = functional_call(self.template, (params, consts), (x.unsqueeze(0),))
        if not isinstance(out, Tensor):
            raise TypeError("the generic DP path needs a module that returns one tensor")
        return out.squeeze(0)

    def _dot(
        self, params: dict[str, Tensor], consts: dict[str, Tensor], x: Tensor, v: Tensor
    ) -> Tensor:
        return (self._example_out(params, consts, x) * v).sum()

    def _over_trials(self, fn: Any, params: Any, *args: Any) -> Any:
        """``fn(params, consts, *args)`` for each trial, stacked: one ``vmap``, or a loop when
        trials run one by one. ``params`` and ``args`` (tensors and dicts of tensors) have the
        trial dimension first; the constants' is per :attr:`const_dims`."""
        if self.batched_trials:
            dims = (0, self.const_dims, *((0,) * len(args)))
            return vmap(fn, in_dims=dims)(params, self.consts(), *args)
        outs = [
            fn(_take(params, k), self.consts_of(k), *(_take(a, k) for a in args))
            for k in range(self.k)
        ]
        return _stack(outs)

    def _run(self, params: dict[str, Tensor], per_example: bool, x: Tensor) -> Tensor:
        inner = vmap(self._example_out, in_dims=(0 if per_example else None, None, 0))
        return self._over_trials(inner, params, x)

    def forward(
        self,
        x: Tensor,
        *,
        capture: bool = False,
        perturb: tuple[list[Any], Tensor] | None = None,
    ) -> tuple[Tensor, GenericCaptured | None]:
        """Run all trials on ``x`` ``[K, B, ...]``; returns output ``[K, B, ...]``.

        With ``capture``, the output is a graph root whose gradient :meth:`layer_grads` turns
        into per-example gradients. With ``perturb=(infos, scale)``, example i runs at
        ``theta + scale_i * g_i`` (``infos`` from a first pass on the same examples).
        """
        params = self.params()
        per_example = perturb is not None
        if perturb is not None:
            infos, scale = perturb
            params = dict(params)
            for names, info in zip(self.layer_params, infos, strict=True):
                for n, g in zip(names, info, strict=True):
                    s = scale.view(*scale.shape, *([1] * (g.dim() - 2)))
                    params[n] = params[n].unsqueeze(1) + s * g
        with torch.no_grad():
            out = self._run(params, per_example, x)
        if not capture:
            return out, None
        out.requires_grad_(True)
        return out, GenericCaptured(x, params, per_example, out)

    def layer_grads(self, loss_sum: Tensor, cap: GenericCaptured) -> list[LayerInfo]:
        """Per-example gradients of ``loss_sum`` (a sum of per-example losses), per layer."""
        (v,) = torch.autograd.grad(loss_sum, cap.out)
        per_b = vmap(grad(self._dot), in_dims=(0 if cap.per_example else None, None, 0, 0))
        g = self._over_trials(per_b, cap.params, cap.x, v.detach())
        return [[g[n] for n in names] for names in self.layer_params]

    def sq_norms(self, infos: list[LayerInfo]) -> Tensor:
        """Per-sample, per-layer squared gradient norms ``[K, B, L]``."""
        return torch.stack(
            [sum(t.pow(2).flatten(2).sum(dim=2) for t in info) for info in infos],  # type: ignore[misc]
            dim=-1,
        )

    def group_sq_norms(self, infos: list[LayerInfo], share: Tensor, rows: int) -> Tensor:
        """Per-group, per-layer squared norms ``[K, B / rows, L]`` of ``sum_r share_r g_r``
        over each group of ``rows`` consecutive examples (a privacy unit's row slots;
        :mod:`workers.group_norms`), from the per-example gradients."""
        return torch.stack([materialised_group_sq(info, share, rows) for info in infos], dim=-1)

    def weighted_sum_into(self, out: Tensor, infos: list[LayerInfo], weights: Tensor) -> None:
        """Write ``sum_i w_i g_i`` into ``out`` ``[K, P]``; ``weights`` is ``[K, B, R]``
        (R = 1: one weight per example, R = L: one per layer and example)."""
        r = weights.shape[-1]
        for li, (names, info) in enumerate(zip(self.layer_params, infos, strict=True)):
            w = weights[..., 0 if r == 1 else li].unsqueeze(1)  # [K, 1, B]
            for n, g in zip(names, info, strict=True):
                a, b = self.slices[n]
                out[:, a:b].copy_(torch.bmm(w, g.reshape(self.k, g.shape[1], -1)).squeeze(1))

    def weighted_sums_into(
        self, outs: list[Tensor], infos: list[LayerInfo], weights: list[Tensor]
    ) -> None:
        """:meth:`weighted_sum_into` for several ``[K, B, R]`` weightings."""
        for out, w in zip(outs, weights, strict=True):
            self.weighted_sum_into(out, infos, w)

    def split_sums_into(
        self,
        main: Tensor,
        extra: Tensor,
        infos: list[LayerInfo],
        w_main: Tensor,
        w_extra: Tensor,
        coef: Tensor,
    ) -> None:
        """Two releases (see :meth:`PackedModel.split_sums_into`): both weighted sums here."""
        self.weighted_sums_into([main, extra], infos, [w_main, w_extra])

    def per_sample_grads(self, infos: list[LayerInfo]) -> Tensor:
        """Flat per-sample gradients ``[K, B, P]`` (tests and small diagnostics)."""
        return torch.cat([t.flatten(2) for info in infos for t in info], dim=-1)

    # -- export -------------------------------------------------------------------------------

    def to_module(self, trial: int, flat_row: Tensor | None = None) -> nn.Module:
        """A standalone module holding trial ``trial``'s (or ``flat_row``'s) trained weights,
        its frozen values and its buffers: the whole model (``requires_grad`` flags kept)."""
        m = copy.deepcopy(self.template)
        row = (self.flat[trial] if flat_row is None else flat_row).detach()
        mine = dict(m.named_parameters())
        with torch.no_grad():
            for n, (a, b) in self.slices.items():
                mine[n].copy_(row[a:b].view(self.shapes[n]))
            if not self.frozen_shared:  # shared values are the template's own already
                for n, t in self.frozen.items():
                    mine[n].copy_(t[trial])
            for n, buf in m.named_buffers():
                buf.copy_(self.buffers[n][trial])
        return m


def tied_aliases(module: nn.Module) -> dict[str, list[str]]:
    """Tied weights: each Parameter reachable under several names, by the name
    ``named_parameters()`` keeps (its first), with its other names."""
    first: dict[int, str] = {}
    aliases: dict[str, list[str]] = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        kept = first.setdefault(id(p), n)
        if kept != n:
            aliases.setdefault(kept, []).append(n)
    return aliases


def _frozen_values(
    template: nn.Module, modules: Sequence[nn.Module], names: list[str]
) -> tuple[dict[str, Tensor], bool]:
    """The frozen parameters' values, and whether every trial holds the same ones.

    Shared values (one checkpoint for the whole pack, the common case) are kept once: the
    template's own tensors (no copy); else they are stacked ``[K, *shape]``.
    """
    own = dict(template.named_parameters())
    per = [dict(m.named_parameters()) for m in modules]
    shared = all(
        torch.equal(per[0][n].detach(), p[n].detach().to(per[0][n].device))
        for p in per[1:]
        for n in names
    )
    if shared:
        return {n: own[n].detach() for n in names}, True
    device = own[names[0]].device
    return {n: torch.stack([p[n].detach().to(device) for p in per]) for n in names}, False


def _take(a: Any, k: int) -> Any:
    """Trial ``k``'s slice of a tensor or of a dict of tensors."""
    return {n: t[k] for n, t in a.items()} if isinstance(a, dict) else a[k]


def _stack(outs: list[Any]) -> Any:
    """Stack per-trial results (tensors, or dicts of tensors) along a new trial dimension."""
    if isinstance(outs[0], dict):
        return {n: torch.stack([o[n] for o in outs]) for n in outs[0]}
    return torch.stack(outs)
