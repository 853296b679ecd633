"""Packed linear layers: ghost norms and one batched matmul per weighted sum.

Linear layers use the exact "ghost" identity ``||g_i a_i^T||^2 = ||g_i||^2 ||a_i||^2`` and one
batched matmul for the weighted sum, so the private step costs about what the non-private step
costs. They use the ``[K, B, ...]`` ("kb") layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dpsweep.errors import ConfigError
from workers.group_norms import gram_is_cheaper, group_sq
from workers.packed.layer import Act, ParamLayer
from workers.packed.registry import register_packed_layer


@dataclass
class _LinearInfo:
    a: Tensor  # [K, B, in] (one position per example) or [K, B, T, in]
    g: Tensor  # [K, B, out] or [K, B, T, out]
    ps: Tensor | None  # materialised per-sample weight gradients [K, B, out, in] (some T > 1)


class PLinear(ParamLayer):
    def __init__(self, m: nn.Linear) -> None:
        self.in_f, self.out_f = m.in_features, m.out_features
        self.bias = m.bias is not None
        self.param_shapes = ((self.out_f, self.in_f),) + (((self.out_f,),) if self.bias else ())

    def bind(self, views: list[Tensor]) -> None:
        super().bind(views)
        # Parameters are updated in place, so these views stay valid for the pack's lifetime.
        self._w_t = views[0].transpose(1, 2)
        self._b_row = views[1].unsqueeze(1) if self.bias else None

    def compute(self, x: Act) -> tuple[Tensor, Tensor]:
        a = x.as_kb()
        a3 = a if a.dim() == 3 else a.reshape(a.shape[0], -1, self.in_f)
        if self._b_row is not None:
            z = torch.baddbmm(self._b_row, a3, self._w_t)
        else:
            z = torch.bmm(a3, self._w_t)
        return a, z

    def wrap(self, z: Tensor, x: Act) -> Act:
        return Act(z.view(*x.as_kb().shape[:-1], self.out_f), "kb", x.k)

    def compute_perturbed(self, x: Act, info: _LinearInfo, scale: Tensor) -> tuple[Tensor, Tensor]:
        a, z = self.compute(x)
        if a.dim() != 3 or info.a.dim() != 3:
            raise ConfigError("per-example perturbation (bam) needs one position per example")
        # (W + s g a0^T) x + (b + s g) = W x + b + s (a0 . x + 1) g: a rank-one update per
        # example, from the first pass's input a0 and output gradient g.
        coef = torch.linalg.vecdot(info.a, a)
        if self.bias:
            coef = coef + 1.0
        return a, z + (scale * coef).unsqueeze(-1) * info.g

    def grad_info(self, a: Tensor, g: Tensor, k: int) -> _LinearInfo:
        if a.dim() == 3:
            return _LinearInfo(a, g.view(a.shape[0], a.shape[1], self.out_f), None)
        b = a.shape[1]
        a4 = a.reshape(k, b, -1, self.in_f)
        g4 = g.reshape(k, b, -1, self.out_f)
        t = a4.shape[2]
        ps = None
        # With extra positions (sequences) pick the cheaper exact form: ghost costs T^2 (in+out),
        # materialising costs T*in*out per sample.
        if t * (self.in_f + self.out_f) >= self.in_f * self.out_f:
            ps = torch.matmul(g4.transpose(2, 3), a4)
        return _LinearInfo(a4, g4, ps)

    def sq_norms(self, info: _LinearInfo) -> Tensor:
        a, g = info.a, info.g
        if a.dim() == 3:
            # Ghost norm: ||g_i a_i^T||^2 + ||g_i||^2 = ||g_i||^2 (||a_i||^2 + 1).
            gg = _sq_rows(g)
            aa = _sq_rows(a)
            return gg.mul_(aa.add_(1.0)) if self.bias else gg.mul_(aa)
        if info.ps is not None:
            sq = info.ps.pow(2).sum(dim=(2, 3))
        else:
            aa = torch.matmul(a, a.transpose(2, 3))
            gg = torch.matmul(g, g.transpose(2, 3))
            sq = (aa * gg).sum(dim=(2, 3))
        if self.bias:
            sq = sq + g.sum(dim=2).pow(2).sum(dim=2)
        return sq

    def weighted_sum(self, info: _LinearInfo, w: Tensor) -> list[Tensor]:
        out = [
            torch.empty(w.shape[0], *s, device=w.device, dtype=info.a.dtype)
            for s in self.param_shapes
        ]
        self._weighted_sum(info, w, out)
        return out

    def weighted_sum_into(self, info: _LinearInfo, w: Tensor, out: list[Tensor]) -> None:
        if all(o.is_contiguous() for o in out):
            # A pack of one: its views of the flat buffer are contiguous, so the matmuls write
            # straight into the gradient buffer.
            self._weighted_sum(info, w, out)
        else:
            super().weighted_sum_into(info, w, out)

    def weighted_sums_into(
        self, info: _LinearInfo, ws: list[Tensor], outs: list[list[Tensor]]
    ) -> None:
        if len(ws) == 1 or info.a.dim() != 3:
            super().weighted_sums_into(info, ws, outs)
            return
        # Stack the weightings along the output axis: one matmul reads the activations once
        # for every release (OSO-DPSGD's two queries share one pass over ``a``).
        g = info.g
        stacked = torch.cat([g * w.unsqueeze(2) for w in ws], dim=2)
        sums = torch.bmm(stacked.transpose(1, 2), info.a)
        bias = torch.bmm(torch.stack(ws, dim=1), g) if self.bias else None
        for j, out in enumerate(outs):
            out[0].copy_(sums[:, j * self.out_f : (j + 1) * self.out_f])
            if bias is not None:
                out[1].copy_(bias[:, j])

    def split_sums_into(
        self,
        info: _LinearInfo,
        w_main: Tensor,
        w_extra: Tensor,
        rows: tuple[Tensor, Tensor],
        coef: float,
        outs: list[list[Tensor]],
    ) -> None:
        """See :meth:`PackedModel.split_sums_into` (pack of one, one position per example)."""
        (r_main, r_extra), (main, extra) = rows, outs
        if len(r_main) == 0:
            # Every example is on the extra side (often: all clipped): main = coef * extra.
            self._weighted_sum(info, w_extra, extra)
            for m, e in zip(main, extra, strict=True):
                torch.mul(e, coef, out=m)
            return
        if len(r_extra) == 0:
            for e in extra:
                e.zero_()
            self._weighted_sum(info, w_main, main)
            return
        g_e = info.g[:, r_extra] * w_extra[:, r_extra].unsqueeze(2)
        g_m = info.g[:, r_main] * w_main[:, r_main].unsqueeze(2)
        torch.bmm(g_e.transpose(1, 2), info.a[:, r_extra], out=extra[0])
        torch.bmm(g_m.transpose(1, 2), info.a[:, r_main], out=main[0])
        main[0].add_(extra[0], alpha=coef)
        if self.bias:
            extra[1].copy_(g_e.sum(dim=1))
            main[1].copy_(g_m.sum(dim=1)).add_(extra[1], alpha=coef)

    def _weighted_sum(self, info: _LinearInfo, w: Tensor, out: list[Tensor]) -> None:
        k, b = w.shape
        if info.ps is not None:
            torch.bmm(
                w.unsqueeze(1),
                info.ps.reshape(k, b, -1),
                out=out[0].view(k, 1, self.out_f * self.in_f),
            )
        elif info.a.dim() == 3:
            # sum_i w_i g_i a_i^T: scale whichever side is narrower (one pass less memory).
            if self.in_f < self.out_f:
                torch.bmm(info.g.transpose(1, 2), info.a * w.unsqueeze(2), out=out[0])
            else:
                torch.bmm((info.g * w.unsqueeze(2)).transpose(1, 2), info.a, out=out[0])
        else:
            t = info.a.shape[2]
            g_scaled = info.g * w.view(k, b, 1, 1)
            torch.bmm(
                g_scaled.reshape(k, b * t, self.out_f).transpose(1, 2),
                info.a.reshape(k, b * t, self.in_f),
                out=out[0],
            )
        if self.bias:
            g_pos = info.g if info.g.dim() == 3 else info.g.sum(dim=2)
            torch.bmm(w.unsqueeze(1), g_pos, out=out[1].unsqueeze(1))

    def group_sq_norms(self, info: _LinearInfo, share: Tensor, rows: int) -> Tensor:
        a, g = info.a, info.g
        # A group's positions: its rows' (times their sequence positions, if any).
        positions = 1 if a.dim() == 3 else a.shape[2]
        if info.ps is not None and not gram_is_cheaper(rows * positions, self.in_f, self.out_f):
            return super().group_sq_norms(info, share, rows)  # the rows' gradients are built
        if a.dim() == 3:
            a, g = a.unsqueeze(2), g.unsqueeze(2)
        return group_sq(a, g, share, rows, bias=self.bias)

    def per_sample_grads(self, info: _LinearInfo) -> list[Tensor]:
        if info.ps is not None:
            ps = info.ps
        elif info.a.dim() == 3:
            ps = info.g.unsqueeze(3) * info.a.unsqueeze(2)
        else:
            ps = torch.matmul(info.g.transpose(2, 3), info.a)
        out = [ps]
        if self.bias:
            out.append(info.g if info.g.dim() == 3 else info.g.sum(dim=2))
        return out


def _sq_rows(t: Tensor) -> Tensor:
    """``||t[..., :]||^2`` over the last axis in one fused pass over ``t`` (vecdot would first
    write every product: two more passes over the largest activations of a step).

    A strided ``t`` (a transposed activation) is made contiguous first, so that a trial's
    norms round the same in a pack of any size.
    """
    return torch.linalg.vector_norm(t.contiguous(), dim=-1).square_()


register_packed_layer(nn.Linear)(PLinear)
