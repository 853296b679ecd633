"""A logical (Poisson) batch processed in physical chunks, noised once.

``training.batch_size`` is the expected logical batch b = qN; ``training.physical_batch_size``
bounds how many examples' per-example work is held at once. Every strategy's per-example
weights depend only on that example's norms and the strategy's state (fixed within a step), so
each chunk's weighted (clipped) sums, and the per-example values of its scalar releases (the
quantile count), are summed over the chunks; the noise is drawn once, from the totals, exactly
as the one-piece step draws it. The result equals the one-piece step up to float summation
order.

The chunk count does not follow the realised (private) batch size: the sampled indices
``[K, B]`` are padded to a *public* bound (:func:`logical_bound`, b + 6 sqrt(b) + 8, the bound
the packer sizes memory for) rounded up to whole chunks, and every chunk is processed, padded
slots included (they are example 0 with mask 0: a zero loss, so a zero gradient). A batch
above the bound (probability below 1e-9 per step) takes more chunks; docs/privacy.md says
what that leaves. Nothing about the chunks is logged or measured: the step returns only the
noised releases.

In a pack of K trials each trial has its own Poisson mask; chunking is over the padded column
range, so each chunk holds, for every trial, its own sampled examples of that range.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from dpsweep.spec_training import AugmentConfig
from workers.augment import Augmenter, DenseGrads
from workers.release_checks import _check_scalar, _check_sensitivity
from workers.settings import WorkerSettings

if TYPE_CHECKING:
    from workers.datasets.records import Dataset
    from workers.engine import DPEngine
    from workers.training.specs import PackSpec


def logical_bound(expected_batch_size: float) -> int:
    """A public bound on a Poisson batch of mean b: b + 6 sqrt(b) + 8 (exceeded w.p. < 1e-9)."""
    b = float(expected_batch_size)
    return int(b + 6.0 * math.sqrt(b) + 8)


def chunk_count(realised_max: int, *, physical: int, expected_batch_size: float) -> int:
    """Chunks for a step: whole chunks over the public bound (more only above it)."""
    bound = logical_bound(expected_batch_size)
    return max(-(-bound // physical), -(-realised_max // physical), 1)


def augment_of(spec: PackSpec) -> AugmentConfig | None:
    """The pack's ``training.augment`` (None: no augmentation)."""
    if spec.augment_multiplicity is None:
        return None
    return AugmentConfig(multiplicity=spec.augment_multiplicity, ops=list(spec.augment_ops))


def augmenter_for(spec: PackSpec) -> Augmenter | None:
    """The pack's augmenter, each trial's from its public seed (None: no augmentation)."""
    if spec.augment_multiplicity is None:
        return None
    return Augmenter(
        multiplicity=spec.augment_multiplicity,
        ops=spec.augment_ops,
        seeds=[t.seed for t in spec.trials],
    )


def physical_batch(spec: PackSpec, data: Dataset, *, audit: bool = False) -> int | None:
    """Examples per physical chunk: the spec's, else the whole batch (None) when the pack fits
    its memory budget, else the largest power of two that does (public: from the spec, the
    data's shape and the worker's budget only). An audit runs in one piece (None). With a
    privacy unit it counts row slots: the bound is R slots per unit of the public bound."""
    if audit:
        return None
    if spec.physical_batch_size is not None:
        return int(spec.physical_batch_size)
    # Deferred: workers.packing builds models to size packs (and imports this engine's module).
    from workers.packing import estimate_trial_bytes

    budget = WorkerSettings().pack_memory_mb * 2**20 / max(1, len(spec.trials))
    shape = tuple(int(d) for d in data.input_shape)

    def cost(batch: int) -> int:
        one = replace(spec, batch_size=1, physical_batch_size=batch, trials=spec.trials[:1])
        return estimate_trial_bytes(one, input_shape=shape, num_classes=int(data.num_classes))

    bound = logical_bound(spec.batch_size)
    if getattr(data, "has_units", False):
        # batch_size counts privacy units, each up to R row slots (workers.unit_step).
        bound *= int(spec.rows_per_unit)
    # The estimate is affine in the chunk above the diagnostics' floor (DIAGNOSTIC_BATCH).
    per = max(1, (cost(2048) - cost(1024)) // 1024)
    fixed = cost(1024) - per * 1024
    if fixed + per * bound <= budget:
        return None if spec.augment_multiplicity is None else bound
    best = 1
    while best * 2 < bound and fixed + per * (best * 2) <= budget:
        best *= 2
    return best


def units_per_chunk(physical: int, rows_per_unit: int) -> int:
    """Privacy units per physical chunk (:mod:`workers.unit_step`): as many whole units of R
    row slots as ``physical`` rows hold, at least one."""
    return max(1, int(physical) // int(rows_per_unit))


def _padded(idx: Tensor, mask: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """``idx`` and ``mask`` padded with example 0 at mask 0 to ``width`` columns."""
    extra = width - idx.shape[1]
    if extra <= 0:
        return idx, mask
    idx = torch.cat([idx, idx.new_zeros(idx.shape[0], extra)], dim=1)
    mask = torch.cat([mask, mask.new_zeros(mask.shape[0], extra)], dim=1)
    return idx, mask


def weighted_sums(engine: DPEngine, bufs: list[Tensor], infos: Any, weights: list[Tensor]) -> None:
    """``bufs[j] = sum_i weights[j]_i g_i`` from a model's infos or :class:`DenseGrads`."""
    if isinstance(infos, DenseGrads):
        for buf, w in zip(bufs, weights, strict=True):
            infos.weighted_sum_into(buf, w)
    elif infos is None:
        for buf in bufs:
            buf.zero_()
    else:
        engine.model.weighted_sums_into(bufs, infos, weights)


def chunked_releases(engine: DPEngine, idx: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """One logical step's noised releases, its per-example work done in physical chunks."""
    strategy = engine.strategy
    p = int(engine.physical_batch_size or logical_bound(engine.expected_batch_size))
    n_chunks = chunk_count(
        int(idx.shape[1]), physical=p, expected_batch_size=engine.expected_batch_size
    )
    idx, mask = _padded(idx, mask, n_chunks * p)
    if engine.augmenter is not None:
        # By column, for the public bound's columns: chunking changes no copy.
        engine.augmenter.begin_step(logical_bound(engine.expected_batch_size))
    # The non-private baseline averages over the realised batch (no noise, no guarantee).
    realised = mask.sum(dim=1, keepdim=True).clamp(min=1.0).unsqueeze(-1)
    totals: list[Tensor] = []
    scalar_totals: list[Tensor] = []
    clip: Any = None
    for c in range(n_chunks):
        ci = idx[:, c * p : (c + 1) * p].contiguous()
        cm = mask[:, c * p : (c + 1) * p].contiguous()
        infos, sq, ctx = engine._norms(ci, cm, cm)
        clip = strategy.clip(ctx)
        if not strategy.private:
            weights = [clip.weights / realised]
        else:
            if sq is not None:
                _check_sensitivity("grad", sq, clip.weights, clip.sensitivity)
                for extra in clip.extra:
                    _check_sensitivity(extra.name, sq, extra.weights, extra.sensitivity)
            for sc in clip.scalars:
                _check_scalar(sc.name, sc.values, sc.sensitivity)
            b = engine.expected_batch_size
            weights = [clip.weights / b] + [e.weights / b for e in clip.extra]
        if not totals:
            totals = [torch.zeros_like(engine.grad) for _ in weights]
            scalar_totals = [torch.zeros(engine.k, 1, device=engine.device) for _ in clip.scalars]
        parts = [torch.empty_like(engine.grad) for _ in weights]
        weighted_sums(engine, parts, infos, weights)
        for total, part in zip(totals, parts, strict=True):
            total += part
        for total_sc, sc in zip(scalar_totals, clip.scalars, strict=True):
            total_sc += sc.values.sum(dim=1, keepdim=True)
        del infos, parts
    return noised_totals(engine, clip, totals, scalar_totals)


def noised_totals(
    engine: DPEngine, clip: Any, totals: list[Tensor], scalar_totals: list[Tensor]
) -> dict[str, Tensor]:
    """The releases from a step's totals over its chunks (weighted sums already over b, and
    the scalar releases' summed values), noised once as the one-piece step noises them."""
    engine.grad.copy_(totals[0])
    if not engine.strategy.private:
        return {"grad": engine.grad}
    bufs = [engine.grad]
    for extra, total in zip(clip.extra, totals[1:], strict=True):
        buf = engine._extra_bufs.get(extra.name)
        if buf is None:
            buf = engine._extra_bufs[extra.name] = torch.empty_like(engine.grad)
        bufs.append(buf.copy_(total))
    # Sensitivities and noise multipliers are the strategy's state, equal in every chunk; the
    # scalar releases' per-example values are replaced by their totals over the chunks.
    scalars = tuple(
        replace(sc, values=total) for sc, total in zip(clip.scalars, scalar_totals, strict=True)
    )
    return engine._noised(replace(clip, scalars=scalars), bufs)


__all__ = [
    "augment_of",
    "augmenter_for",
    "chunk_count",
    "chunked_releases",
    "logical_bound",
    "noised_totals",
    "physical_batch",
    "units_per_chunk",
    "weighted_sums",
]
