"""Book-keeping / ghost clipping on the generic path: per-example norms without a vmap per example.

:class:`BookkeepingModel` is a :class:`~workers.generic.model.GenericModel` (same interface,
same flat ``[K, P]`` parameters, same layers) whose capturing forward runs the module on the
real batch, one trial after another, with hooks that record each layer's input ``a`` and
output ``z``. One ``autograd.grad`` of the loss gives every ``g = dL/dz`` (and ``v = dL/dout``)
at once, and per layer (Li et al. 2022, ghost norm; Bu et al. 2023, book-keeping):

* ``nn.Linear`` (any ``[B, ..., d]`` input): over positions, the per-example gradients
  ``a_i^T g_i`` are materialised (one batched matmul, as costly as the weight gradient
  itself), and the weighted sum is then a cheap ``[B] x [B, P]`` product; a layer whose
  per-example gradients would be too large in memory takes the ghost norm instead, from the
  Gram matrices ``(a_i a_i^T) . (g_i g_i^T)``, with the weighted sum ``sum_i w_i a_i^T g_i``
  as one matmul. A layer on a single position always takes the ghost norm (exact and cheapest);
* ``nn.Embedding``: the same Gram trick with ``[id_t == id_s]`` as the input Gram, and the
  weighted sum an ``index_add``;
* ``nn.Conv1d`` / ``nn.Conv2d``: either the ghost norm over the input patches (``unfold``),
  where ``L (d_in + d_out) < d_in d_out`` (small late feature maps), with the weighted sum as
  the convolution's own weight gradient; or every example's gradient at once, as one
  convolution whose groups are the examples (no ``unfold`` copy);
* ``nn.LayerNorm`` / ``nn.GroupNorm``: their per-example gradients are cheap, computed directly;
* attention built from ``nn.Linear`` layers is covered by the Linear rule.

Every other parametrised layer (``nn.MultiheadAttention``, custom parameters, a rule layer used
in a way its rule does not cover) falls back to the materialised ``torch.func`` per-example
gradients, for its parameters only. Fail closed:

* a ``TorchFunctionMode`` watches every op that touches a rule layer's parameter: each must be
  used exactly once, by its own module's own op (``F.linear`` for a Linear, ...), and the module
  called once per forward; tied weights, a parameter read by a parent, or a module called twice
  send that layer to the fallback;
* a layer whose recorded input or output was modified in place afterwards falls back too;
* the first capturing forward checks that the batched output equals the per-example one (a
  module that mixes examples, which the per-example ``vmap`` would hide, turns book-keeping off
  for the model).

BAM's perturbed pass (per-example parameters) runs on the materialised path.

Frozen parameters (``requires_grad == False``) are no layer at all: no hook records them, the
watch ignores them, and the one backward computes only the activation gradients that flow
through them to the trained layers (LoRA's low-rank ``nn.Linear`` pair, a head, LayerNorm,
embeddings), so a frozen backbone costs its forward and its activation backward, nothing per
example.

Which layers have a rule, and the watch on how their parameters are used, are
:mod:`workers.generic.layer_rules`; each rule layer's norms and weighted sums from its records
are :mod:`workers.generic.ghost`. This module holds the model: the hooks that record, the
capturing forward and its checks, and the per-layer infos with their fallback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from workers.generic.ghost import (
    _GhostConv,
    _GhostLinear,
    as_materialised,
    conv_info,
    group_info_sq,
    info_sq,
)
from workers.generic.layer_rules import RULE_OPS, UsageMode, rule_of
from workers.generic.model import GenericCaptured, GenericModel

# A Linear layer over positions materialises its per-example gradients up to this many elements
# (256 MiB in float32); above it, the ghost norm's Gram matrices save the memory.
_MATERIALISE_MAX = 1 << 26


@dataclass
class _Call:
    """One trial's call of a rule layer: its input, its output (a graph node), versions."""

    a: Tensor
    z: Tensor
    a_version: int
    z_version: int


@dataclass
class BookkeepingCaptured(GenericCaptured):
    """A capturing forward's record: the layers' calls per trial, and which layers are covered."""

    calls: list[list[_Call]] = field(default_factory=list)  # [layer][trial]
    covered: list[bool] = field(default_factory=list)  # per layer: the rule applies this step


class BookkeepingModel(GenericModel):
    """:class:`GenericModel` with book-keeping per-example norms and sums (module docstring).

    Args: as :class:`GenericModel`. ``batched_trials`` applies to the materialised parts (the
    fallback layers, BAM's perturbed pass, evaluation); the book-keeping forward runs the
    trials one after another (a hooked forward cannot run under ``vmap``).
    """

    def __init__(
        self,
        modules: Sequence[nn.Module],
        device: torch.device | str = "cpu",
        *,
        batched_trials: bool = True,
    ) -> None:
        super().__init__(modules, device, batched_trials=batched_trials)
        mods = dict(self.template.named_modules())
        self.layer_modules = [mods[n] for n in self.layer_names]
        # A tied weight (one Parameter under several names, used by several modules) has no
        # rule: its per-example gradient sums every use, which only the materialised torch.func
        # path sees (the usage watch would catch it too; this says so up front).
        self.rules = [
            None if any(n in self.tied for n in names) else rule_of(m, names)
            for m, names in zip(self.layer_modules, self.layer_params, strict=True)
        ]
        # Off for good when the first check finds the module mixing examples.
        self.bookkeeping = any(r is not None for r in self.rules)
        self._checked = False
        self._verified = False
        self._stack: list[nn.Module] = []
        self._record: list[list[_Call]] | None = None
        self._index = {id(m): i for i, m in enumerate(self.layer_modules) if self.rules[i]}
        for m in self.template.modules():
            m.register_forward_pre_hook(self._push)
            m.register_forward_hook(self._pop)

    # -- hooks --------------------------------------------------------------------------------

    def _push(self, module: nn.Module, args: Any) -> None:
        if self._record is not None:
            self._stack.append(module)

    def _pop(self, module: nn.Module, args: Any, out: Any) -> Any:
        if self._record is None:
            return None
        self._stack.pop()
        li = self._index.get(id(module))
        if li is None or not args or not isinstance(args[0], Tensor) or not isinstance(out, Tensor):
            return None
        a = args[0]
        z = out
        ret = None
        if not z.requires_grad:
            # Nothing upstream needs a gradient (parameters don't, by design: their gradients
            # come from the records). A leaf stands in for the output; the clone keeps an
            # in-place op downstream off the leaf.
            z = z.detach().requires_grad_(True)
            ret = z.clone()
        self._record[li].append(_Call(a, z, a._version, z._version))
        return ret

    # -- forward ------------------------------------------------------------------------------

    def forward(
        self,
        x: Tensor,
        *,
        capture: bool = False,
        perturb: tuple[list[Any], Tensor] | None = None,
    ) -> tuple[Tensor, GenericCaptured | None]:
        """As :meth:`GenericModel.forward`; a plain capture records for book-keeping."""
        if perturb is not None:
            infos, scale = perturb
            return super().forward(
                x, capture=capture, perturb=([as_materialised(i) for i in infos], scale)
            )
        if not capture or not self.bookkeeping:
            return super().forward(x, capture=capture)
        params = self.params()
        record: list[list[_Call]] = [[] for _ in self.layer_names]
        covered = [r is not None for r in self.rules]
        outs = []
        self._record = record
        try:
            for k in range(self.k):
                pk = {n: t[k] for n, t in params.items()}
                # Only trained parameters are watched: a frozen one is a constant here.
                watched = {id(t): n for n, t in pk.items()}
                mode = UsageMode(watched, self._stack)
                n_before = [len(r) for r in record]
                with mode:
                    out_k = functional_call(self.template, (pk, self.consts_of(k)), (x[k],))
                if not isinstance(out_k, Tensor):
                    raise TypeError("the generic DP path needs a module that returns one tensor")
                outs.append(out_k)
                self._check_uses(mode.uses, record, n_before, covered)
        finally:
            self._record = None
            self._stack.clear()
        for li, calls in enumerate(record):
            if covered[li] and any(
                c.a._version != c.a_version or c.z._version != c.z_version for c in calls
            ):
                covered[li] = False  # modified in place after the layer: its records are stale
        out = torch.stack(outs)
        if not self._checked:
            self._checked = True
            with torch.no_grad():
                ref = super().forward(x)[0]
            scale = ref.abs().max().clamp_min(1.0)
            if not torch.allclose(out.detach(), ref, rtol=1e-3, atol=1e-4 * float(scale)):
                # The module mixes examples in the batch: only the per-example path is exact.
                self.bookkeeping = False
                return super().forward(x, capture=True)
        if not out.requires_grad:
            out.requires_grad_(True)
        cap = BookkeepingCaptured(x, params, False, out, calls=record, covered=covered)
        return out, cap

    def _check_uses(
        self,
        uses: list[tuple[str, Any, nn.Module | None]],
        record: list[list[_Call]],
        n_before: list[int],
        covered: list[bool],
    ) -> None:
        """Fail closed: a layer keeps its rule only if used exactly as the rule assumes."""
        by_name: dict[str, list[tuple[Any, nn.Module | None]]] = {}
        for name, func, mod in uses:
            by_name.setdefault(name, []).append((func, mod))
        for li, rule in enumerate(self.rules):
            if rule is None or not covered[li]:
                continue
            ops = RULE_OPS[rule]
            ops = ops if isinstance(ops, tuple) else (ops,)
            mod = self.layer_modules[li]
            ok = len(record[li]) - n_before[li] == 1
            for n in self.layer_params[li]:
                u = by_name.get(n, [])
                ok = ok and len(u) == 1 and u[0][1] is mod and any(u[0][0] is op for op in ops)
            if not ok:
                covered[li] = False

    # -- per-example quantities ---------------------------------------------------------------

    def layer_grads(self, loss_sum: Tensor, cap: GenericCaptured) -> list[Any]:
        """Per-layer infos: book-keeping records for covered layers, else materialised."""
        if not isinstance(cap, BookkeepingCaptured):
            return super().layer_grads(loss_sum, cap)
        zs: list[Tensor] = [cap.out]
        for li, calls in enumerate(cap.calls):
            if cap.covered[li]:
                zs.extend(c.z for c in calls)
        grads = torch.autograd.grad(loss_sum, zs, allow_unused=True)
        v = grads[0]
        assert v is not None
        pos = 1
        infos: list[Any] = [None] * len(self.layer_names)
        for li, calls in enumerate(cap.calls):
            if not cap.covered[li]:
                continue
            gs = [
                g if g is not None else torch.zeros_like(c.z)
                for c, g in zip(calls, grads[pos : pos + self.k], strict=True)
            ]
            pos += self.k
            b = cap.x.shape[1]
            if any(c.a.shape[:1] != (b,) or c.z.shape[:1] != (b,) for c in calls):
                continue  # not batch-first: the materialised fallback below
            infos[li] = self._info(li, [c.a.detach() for c in calls], [g.detach() for g in gs])
        fallback = [li for li in range(len(infos)) if infos[li] is None]
        if not self._verified:
            # Once per model: each rule's norms against the materialised path's. A layer whose
            # batch dimension is not its input's first (sequence-first attention, say) or that
            # the usage checks missed reads examples wrongly; it keeps the fallback for good.
            self._verified = True
            full = self._fallback_grads(self.names, cap, v.detach())
            ref = [[full[n] for n in names] for names in self.layer_params]
            for li, info in enumerate(infos):
                if info is None:
                    infos[li] = ref[li]
                    continue
                mine, theirs = info_sq(info), info_sq(ref[li])
                tol = 1e-3 * float(theirs.abs().max()) + 1e-12
                if not torch.allclose(mine, theirs, rtol=1e-3, atol=tol):
                    self.rules[li] = None
                    infos[li] = ref[li]
            return infos
        if fallback:
            names = [n for li in fallback for n in self.layer_params[li]]
            g = self._fallback_grads(names, cap, v.detach())
            for li in fallback:
                infos[li] = [g[n] for n in self.layer_params[li]]
        return infos

    def _fallback_grads(
        self, names: list[str], cap: GenericCaptured, v: Tensor
    ) -> dict[str, Tensor]:
        """Materialised per-example gradients of ``names`` only (``torch.func``, as the base)."""
        sub = {n: cap.params[n] for n in names}
        rest = {n: t for n, t in cap.params.items() if n not in sub}

        def dot(
            s: dict[str, Tensor], c: dict[str, Tensor], r: dict[str, Tensor], x: Tensor, vv: Tensor
        ) -> Tensor:
            return self._dot({**r, **s}, c, x, vv)

        per_b = vmap(grad(dot), in_dims=(None, None, None, 0, 0))
        return self._over_trials(per_b, sub, rest, cap.x, v)

    def _info(self, li: int, a_list: list[Tensor], g_list: list[Tensor]) -> Any:
        rule = self.rules[li]
        mod: Any = self.layer_modules[li]
        has_bias = len(self.layer_params[li]) == 2
        # A pack of one (the common case) needs no copy into a trial dimension.
        a = a_list[0].unsqueeze(0) if self.k == 1 else torch.stack(a_list)
        g = g_list[0].unsqueeze(0) if self.k == 1 else torch.stack(g_list)
        k, b = g.shape[:2]
        if rule == "linear":
            a3 = a.reshape(k, b, -1, a.shape[-1])
            g3 = g.reshape(k, b, -1, g.shape[-1])
            info = _GhostLinear("linear", a3, g3, has_bias)
            t, d_in, d_out = a3.shape[2], a3.shape[-1], g3.shape[-1]
            # Over positions (t > 1), materialising costs B t d_in d_out, no more than the
            # weighted sum alone costs on the Gram route (which adds B t^2 (d_in + d_out) for
            # the norms), and then the weighted sum is a cheap [B] x [B, P] product. The Gram
            # route is for layers whose per-example gradients would not fit in memory.
            if t > 1 and (k * b * d_in * d_out <= _MATERIALISE_MAX or t * t >= d_in * d_out):
                return info.materialise()
            return info
        if rule == "embedding":
            ids = a.reshape(k, b, -1)
            g3 = g.reshape(k, b, ids.shape[2], -1)
            return _GhostLinear(
                "embedding", ids, g3, False, padding_idx=mod.padding_idx, rows=mod.num_embeddings
            )
        if rule == "conv":
            return conv_info(mod, a, g, has_bias)
        if rule == "layernorm":
            ns = tuple(mod.normalized_shape)
            xhat = F.layer_norm(a, ns, None, None, mod.eps)
            dims = tuple(range(2, a.dim() - len(ns)))
            gw = (g * xhat).sum(dim=dims) if dims else g * xhat
            return [gw, g.sum(dim=dims) if dims else g] if has_bias else [gw]
        assert rule == "groupnorm"
        flat = a.reshape(k * b, *a.shape[2:])
        xhat = F.group_norm(flat, mod.num_groups, None, None, mod.eps).view_as(a)
        dims = tuple(range(3, a.dim()))
        return [(g * xhat).sum(dim=dims), g.sum(dim=dims)]

    def sq_norms(self, infos: list[Any]) -> Tensor:
        """Per-sample, per-layer squared gradient norms ``[K, B, L]``."""
        return torch.stack([info_sq(i) for i in infos], dim=-1)

    def group_sq_norms(self, infos: list[Any], share: Tensor, rows: int) -> Tensor:
        """Per-group, per-layer squared norms ``[K, B / rows, L]`` of ``sum_r share_r g_r``
        (:meth:`GenericModel.group_sq_norms`): Gram matrices over the group's positions for a
        book-keeping info where they cost less (:func:`group_info_sq`), else materialised."""
        return torch.stack([group_info_sq(i, share, rows) for i in infos], dim=-1)

    def weighted_sum_into(self, out: Tensor, infos: list[Any], weights: Tensor) -> None:
        """Write ``sum_i w_i g_i`` into ``out`` ``[K, P]``; ``weights`` is ``[K, B, R]``."""
        r = weights.shape[-1]
        for li, (names, info) in enumerate(zip(self.layer_params, infos, strict=True)):
            w = weights[..., 0 if r == 1 else li]
            if isinstance(info, _GhostLinear | _GhostConv):
                slices = [self.slices[n] for n in names]
                bufs = [
                    torch.empty(self.k, hi - lo, device=out.device, dtype=out.dtype)
                    for lo, hi in slices
                ]
                info.weighted_into(bufs, w.to(info.g.dtype))
                for (lo, hi), buf in zip(slices, bufs, strict=True):
                    out[:, lo:hi].copy_(buf)
                continue
            for n, g in zip(names, info, strict=True):
                lo, hi = self.slices[n]
                out[:, lo:hi].copy_(
                    torch.bmm(
                        w.unsqueeze(1).to(g.dtype), g.reshape(self.k, g.shape[1], -1)
                    ).squeeze(1)
                )

    def per_sample_grads(self, infos: list[Any]) -> Tensor:
        """Flat per-sample gradients ``[K, B, P]`` (tests and small diagnostics)."""
        return super().per_sample_grads([as_materialised(i) for i in infos])
