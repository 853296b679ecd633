"""Augmentation multiplicity (De et al. 2022): each sampled image's gradient is the mean of
the gradients of K augmented copies of it, clipped afterwards.

One example still contributes one vector, the mean of its copies' gradients, and the strategy
clips that vector: the per-example bound and so the sensitivity, q and epsilon are those of the
plain step (docs/privacy.md). Nothing here reads which examples were sampled: the engine hands
in the (already sampled) images, and the augmentations' randomness comes from a generator
seeded by each trial's *public* seed. The crop offsets and flips are public choices, like the
architecture; sampling and noise keep their secret per-trial streams.

The per-example mean gradient is exact on both engine paths: the copies' per-example gradients
are materialised (``per_sample_grads``, which both models implement exactly), averaged over
each example's copies and held densely per layer (:class:`DenseGrads`); the engine's norms and
weighted sums then read them. A physical chunk therefore holds ``chunk x multiplicity`` copies'
gradients: choose ``training.physical_batch_size`` with that in mind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from workers.augment_check import AUGMENT_NAMES, augment_ops, check_augment
from workers.strategies.base import StepContext


@dataclass(frozen=True)
class AugmentOp:
    """An augmentation: ``draw(n, generator)`` its random parameters for n images (public
    randomness), ``apply(images [N, C, H, W], params)`` the augmented images, same shape."""

    draw: Callable[[int, torch.Generator], Tensor]
    apply: Callable[[Tensor, Tensor], Tensor]


_OPS: dict[str, AugmentOp] = {}
CROP_PADDING = 4


def register_augment(name: str, op: AugmentOp) -> None:
    """Add an augmentation (plug-ins); its name may then appear in ``training.augment.ops``."""
    _OPS[name] = op
    AUGMENT_NAMES.add(name)


def _crop_offsets(n: int, gen: torch.Generator) -> Tensor:
    return torch.randint(0, 2 * CROP_PADDING + 1, (n, 2), generator=gen)


def random_crop(x: Tensor, offsets: Tensor) -> Tensor:
    """Each image cropped at its ``[dy, dx]`` after zero padding of 4 on every side."""
    n, _, h, w = x.shape
    p = CROP_PADDING
    padded = torch.nn.functional.pad(x, (p, p, p, p))
    offsets = offsets.to(x.device)
    rows = (offsets[:, 0, None] + torch.arange(h, device=x.device))[:, :, None]  # [N, H, 1]
    cols = (offsets[:, 1, None] + torch.arange(w, device=x.device))[:, None, :]  # [N, 1, W]
    ni = torch.arange(n, device=x.device)[:, None, None]
    # Advanced indexing on dims 0, 2, 3 puts the channel last: [N, H, W, C].
    return padded.permute(0, 2, 3, 1)[ni, rows, cols].permute(0, 3, 1, 2)


def _flip_bits(n: int, gen: torch.Generator) -> Tensor:
    return torch.rand(n, generator=gen) < 0.5


def random_flip(x: Tensor, flip: Tensor) -> Tensor:
    """The images whose bit is set flipped horizontally (probability 1/2 each)."""
    return torch.where(flip.to(x.device).view(-1, 1, 1, 1), x.flip(-1), x)


register_augment("crop", AugmentOp(_crop_offsets, random_crop))
register_augment("flip", AugmentOp(_flip_bits, random_flip))


class Augmenter:
    """K augmented copies of sampled images, one public generator per trial.

    The random parameters of a step's copies are drawn at its start for a public number of
    columns (:meth:`begin_step`: the logical batch's bound), by column, so a copy's
    augmentation does not depend on how the batch is chunked; columns beyond it (a batch above
    the bound, or a last chunk's padding) get theirs drawn when they are reached.

    Args:
        multiplicity: copies per example.
        ops: registered augmentation names, applied in order.
        seeds: each trial's public seed (the generator of trial k's augmentations).
    """

    def __init__(self, *, multiplicity: int, ops: Sequence[str], seeds: Sequence[int]) -> None:
        self.multiplicity = int(multiplicity)
        self.ops = [_OPS[o] for o in ops]
        # Public randomness: seeded from the public seed and the step, never from the secret
        # streams (augmentation draws nothing a sampling or noise stream would have produced).
        self.seeds = [int(s) for s in seeds]
        self.steps = 0
        self.gens = [torch.Generator() for _ in seeds]
        self._params: list[list[Tensor]] = []
        self._cursor = 0

    def begin_step(self, width: int) -> None:
        """Draw the augmentations of a step's first ``width`` columns, for every trial."""
        n = width * self.multiplicity
        for gen, seed in zip(self.gens, self.seeds, strict=True):
            # A generator per step: the draws of one step's extra columns never shift the next.
            gen.manual_seed((seed * 1_000_003 + self.steps) % 2**62 ^ 0x5A17_A06E)
        self.steps += 1
        self._params = [[op.draw(n, gen) for op in self.ops] for gen in self.gens]
        self._cursor = 0

    def _extend(self, copies: int) -> None:
        """Draw the parameters of columns beyond those drawn so far (after the public bound)."""
        have = int(self._params[0][0].shape[0]) if self._params and self.ops else 0
        if copies <= have:
            return
        if not self._params:
            self._params = [[] for _ in self.gens]
        for gen, params in zip(self.gens, self._params, strict=True):
            if not params:
                params.extend(op.draw(copies, gen) for op in self.ops)
                continue
            for j, op in enumerate(self.ops):
                params[j] = torch.cat([params[j], op.draw(copies - have, gen)])

    def copies(self, xb: Tensor, target: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The next columns' copies: images ``[K, B*M, ...]`` (example i's copies at
        ``i*M .. i*M+M-1``), their targets and mask."""
        m = self.multiplicity
        x = xb.repeat_interleave(m, dim=1)
        a, b = self._cursor * m, (self._cursor + xb.shape[1]) * m
        self._cursor += int(xb.shape[1])
        if self.ops:
            self._extend(b)
            rows = []
            for k, params in enumerate(self._params):
                xk = x[k]
                for op, prm in zip(self.ops, params, strict=True):
                    xk = op.apply(xk, prm[a:b])
                rows.append(xk)
            x = torch.stack(rows)
        t = target.repeat_interleave(m, dim=1) if target is not xb else x
        return x, t, mask.repeat_interleave(m, dim=1)


def layer_columns(model: Any) -> list[list[tuple[int, int]]]:
    """Each clipping layer's flat ``[a, b)`` ranges, in ``per_sample_grads`` column order."""
    if isinstance(model.slices, dict):  # generic: slices by parameter name
        return [[model.slices[n] for n in names] for names in model.layer_params]
    return [[(a, b) for a, b, _ in sl] for sl in model.slices]


class DenseGrads:
    """Per-example gradients ``[K, B, P]`` held densely (the mean over augmented copies).

    Implements what the engine asks of a model's layer infos: per-layer squared norms and
    weighted sums into ``[K, P]`` buffers, with weights ``[K, B, R]`` (R = 1 or per layer).
    """

    def __init__(self, grads: Tensor, columns: list[list[tuple[int, int]]]) -> None:
        self.grads = grads
        self.columns = columns
        self.layer_cols: list[tuple[int, int]] = []
        c = 0
        for ranges in columns:
            n = sum(b - a for a, b in ranges)
            self.layer_cols.append((c, c + n))
            c += n

    @classmethod
    def mean_of_copies(
        cls, model: Any, infos: list[Any], *, k: int, batch: int, multiplicity: int
    ) -> DenseGrads:
        """The mean over each example's ``multiplicity`` copies of their exact gradients."""
        g = model.per_sample_grads(infos)  # [K, B*M, P] exact on both paths
        g = g.view(k, batch, multiplicity, g.shape[-1]).mean(dim=2)
        return cls(g, layer_columns(model))

    def sq_norms(self) -> Tensor:
        """``[K, B, L]`` squared norms of each example's mean gradient, per layer."""
        return torch.stack(
            [self.grads[..., a:b].pow(2).sum(dim=-1) for a, b in self.layer_cols], dim=-1
        )

    def weighted_sum_into(self, out: Tensor, weights: Tensor) -> None:
        """``out = sum_i w_i g_i`` over the examples, ``out`` ``[K, P]`` in flat order."""
        r = weights.shape[-1]
        for li, ((c0, _), ranges) in enumerate(zip(self.layer_cols, self.columns, strict=True)):
            w = weights[..., 0 if r == 1 else li].unsqueeze(1)  # [K, 1, B]
            c = c0
            for a, b in ranges:
                out[:, a:b] = torch.bmm(w, self.grads[..., c : c + b - a]).squeeze(1)
                c += b - a


def augmented_per_sample(
    engine: Any, xb: Tensor, target: Tensor, mask: Tensor
) -> tuple[DenseGrads, Tensor | None, Any]:
    """The sampled examples' mean-over-copies gradients, their norms and the strategy's context.

    The copies go through the engine's own per-example code (non-finite copies removed there);
    each example keeps its own mask: it contributes one vector, whatever its copies did.
    """
    aug: Augmenter = engine.augmenter
    xa, ta, ma = aug.copies(xb, target, mask)
    infos, _, _ = engine.per_sample(xa, ta, ma)
    dense = DenseGrads.mean_of_copies(
        engine.model, infos, k=engine.k, batch=int(xb.shape[1]), multiplicity=aug.multiplicity
    )
    sq = dense.sq_norms() if engine.strategy.needs_norms else None
    ctx = StepContext(
        sq_norms=sq, mask=mask, expected_batch_size=engine.expected_batch_size, noise=engine.noise
    )
    return dense, sq, ctx


__all__ = [
    "AugmentOp",
    "Augmenter",
    "DenseGrads",
    "augment_ops",
    "augmented_per_sample",
    "check_augment",
    "layer_columns",
    "register_augment",
]
