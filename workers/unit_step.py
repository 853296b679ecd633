"""One DP-SGD step whose privacy unit is a person, not a row (issue 54).

The engine (:class:`workers.engine.DPEngine`) samples units (:mod:`workers.units`); this module
turns their rows into one contribution per unit, of norm at most the strategy's sensitivity S,
and releases ``(sum over sampled units + sigma S xi) / b`` with b = q N_units, as the row-level
step releases a sum over rows. Adding or removing a whole unit therefore moves every release
by at most its sensitivity, which is what the accountant, run over units at the same q, sigma
and T, assumes (Chua et al. 2024).

Two ways to bound a unit (``training.unit_bounding``):

* ``mean``: every row gets the strategy's per-row weight from its own norms (checked against
  S per row, as the row-level step checks), then every weight of a unit's rows is divided by
  m_u, its used rows: the unit contributes the mean of its rows' clipped gradients, of norm
  <= S by the triangle inequality. The same 1/m_u divides every extra release's weights and
  every scalar release's per-row values (the quantile count), and the per-unit bound is
  checked in code (the sum of the unit's row contributions' norms, an upper bound on the norm
  of their sum) before anything is released.
* ``capped``: the mean of the unit's rows' exact gradients is clipped once; the strategy sees
  the units as its examples (norms of those means, one mask entry per unit). The means are
  never built: their norms come from the rows' infos (:mod:`workers.group_norms`: Gram
  matrices over the unit's rows where they cost less, else the rows' gradients), and each
  row then weighs its unit's weight times its share, so the rows' weighted sum is the sum of
  the clipped means. (An audit's canary units are placed among the rows' gradients, so an
  audit builds the means densely.) The sensitivity is checked per unit.

A row whose gradient (or loss) is not finite gets weight 0 as in the row-level step, so a
hostile unit cannot make a run fail; its m_u still counts it, which only shrinks the unit's
contribution.

Logical batches (``physical_batch_size``) are processed at unit granularity: max(1, P // R)
units per chunk, the chunk count from a public bound on the sampled units
(:func:`workers.chunked_step.logical_bound` of b), padded slots included; the noise is drawn
once from the totals. Without a physical batch the step runs in one piece.

Nothing computed from the private batch leaves without noise: errors name the release and the
trial, never a count, a size or a norm.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from dpsweep.errors import ConfigError, PrivacyError
from dpsweep.spec_training import UNIT_BOUNDINGS
from workers.augment import DenseGrads, layer_columns
from workers.chunked_step import chunk_count, noised_totals, units_per_chunk, weighted_sums
from workers.release_checks import _ENFORCED, _check_scalar, _check_sensitivity
from workers.strategies.base import ClippingStrategy, ClipResult, StepContext
from workers.unit_canaries import CanaryRows, index_with_canaries
from workers.units import UnitBatch, UnitIndex, check_rows_per_unit, sample_units_pack

if TYPE_CHECKING:
    from workers.engine import DPEngine
    from workers.randomness import RandomStream


@dataclass(frozen=True)
class UnitSampling:
    """A pack's privacy units: their rows, R = rows per unit, and the bounding mode."""

    index: UnitIndex
    rows_per_unit: int
    bounding: str

    def __repr__(self) -> str:
        return f"UnitSampling(rows_per_unit={self.rows_per_unit}, bounding={self.bounding!r})"

    @classmethod
    def build(
        cls,
        units: np.ndarray | Tensor,
        *,
        n_rows: int,
        bounding: str,
        rows_per_unit: int,
        strategy: ClippingStrategy,
        augmented: bool,
        canary_units: int = 0,
        canary_rows: int = 1,
    ) -> UnitSampling:
        """Check what a unit-level run supports, before any step, and index the units.

        ``canary_units`` units of ``canary_rows`` rows each follow the data's (an audit's
        included gradient canaries, :mod:`workers.unit_canaries`): sampled at the same rate by
        the same code.

        Raises:
            ConfigError: naming the field: augmentation multiplicity (``training.augment``),
                an unknown bounding (``training.unit_bounding``), a two-pass strategy with
                ``capped`` (``strategy``), ``rows_per_unit`` out of 1..1024
                (``training.rows_per_unit``), unit ids that are not dense
                (``dataset.privacy_unit``).
        """
        if augmented:
            raise ConfigError(
                "augmentation multiplicity (training.augment) cannot be used with a privacy "
                "unit: a unit's rows are averaged instead",
                field="training.augment",
            )
        if bounding not in UNIT_BOUNDINGS:
            raise ConfigError(
                f"unit_bounding must be one of {list(UNIT_BOUNDINGS)}; got {bounding!r}",
                field="training.unit_bounding",
            )
        if bounding == "capped" and strategy.describe().gradient_passes > 1:
            raise ConfigError(
                f"strategy {strategy.name!r} perturbs each example's own gradient: with a "
                "privacy unit it needs unit_bounding 'mean'",
                field="strategy",
            )
        r = check_rows_per_unit(rows_per_unit)
        if canary_units:
            index = index_with_canaries(
                units, n_rows=n_rows, canary_units=canary_units, canary_rows=canary_rows
            )
        else:
            index = UnitIndex.from_ids(units, n_rows=n_rows)
        return cls(index=index, rows_per_unit=r, bounding=bounding)

    def sample(
        self, sample_rate: float, streams: list[RandomStream], device: torch.device
    ) -> UnitBatch:
        """The pack's units and rows of one step, each trial from its own sample stream."""
        batch = sample_units_pack(
            self.index, sample_rate=sample_rate, rows_per_unit=self.rows_per_unit, streams=streams
        )
        return batch.to(device)


def unit_releases(engine: DPEngine, batch: UnitBatch) -> dict[str, Tensor]:
    """One step's noised releases from the sampled units ``batch`` (one piece, or chunks)."""
    return noised_totals(engine, *unit_sums(engine, batch))


def unit_sums(engine: DPEngine, batch: UnitBatch) -> tuple[Any, list[Tensor], list[Tensor]]:
    """The step's checked, pre-noise sums: the last chunk's clip (its sensitivities and noise
    multipliers, the strategy's state), every vector release's weighted sum over b (``[K, P]``
    each, the gradient first) and every scalar release's summed values (``[K, 1]`` each).
    Private: only :func:`~workers.chunked_step.noised_totals` may read them."""
    units = engine.units
    assert units is not None  # the engine calls this only with units
    b = engine.expected_batch_size
    if engine.physical_batch_size is None:
        per = max(batch.n_slots, 1)
        n_chunks = 1
    else:
        per = units_per_chunk(engine.physical_batch_size, units.rows_per_unit)
        # The chunk count follows a public bound on the sampled units, not their number.
        n_chunks = chunk_count(batch.n_slots, physical=per, expected_batch_size=b)
        batch = batch.padded(n_chunks * per)
    private = engine.strategy.private
    # The non-private baseline averages over the realised units (no noise, no guarantee).
    realised = batch.unit_mask().sum(dim=1).clamp(min=1.0).view(-1, 1, 1)
    totals: list[Tensor] = []
    scalar_totals: list[Tensor] = []
    clip: Any = None
    for c in range(n_chunks):
        part = batch.units(c * per, (c + 1) * per) if n_chunks > 1 else batch
        clip, infos, canary = _unit_clip(engine, part, units.bounding)
        if private:
            weights = [clip.weights / b] + [e.weights / b for e in clip.extra]
        else:
            weights = [clip.weights / realised]
        if n_chunks == 1:
            # One piece: the sums go straight into the engine's release buffers.
            totals = _release_bufs(engine, clip, len(weights))
            weighted_sums(engine, totals, infos, weights)
            if canary is not None:
                canary.add_into(engine, totals, weights)
            scalar_totals = [sc.values.sum(dim=1, keepdim=True) for sc in clip.scalars]
            return clip, totals, scalar_totals
        if not totals:
            totals = [torch.zeros_like(engine.grad) for _ in weights]
            scalar_totals = [torch.zeros(engine.k, 1, device=engine.device) for _ in clip.scalars]
        sums = [torch.empty_like(engine.grad) for _ in weights]
        weighted_sums(engine, sums, infos, weights)
        if canary is not None:
            canary.add_into(engine, sums, weights)
        for total, s in zip(totals, sums, strict=True):
            total += s
        for total_sc, sc in zip(scalar_totals, clip.scalars, strict=True):
            total_sc += sc.values.sum(dim=1, keepdim=True)
        del infos, sums
    return clip, totals, scalar_totals


def _release_bufs(engine: DPEngine, clip: ClipResult, n: int) -> list[Tensor]:
    """The engine's buffers of the gradient and of the strategy's extra releases (the first
    ``n``: the non-private baseline has the gradient only)."""
    bufs = [engine.grad]
    for extra in clip.extra[: n - 1]:
        buf = engine._extra_bufs.get(extra.name)
        if buf is None:
            buf = engine._extra_bufs[extra.name] = torch.empty_like(engine.grad)
        bufs.append(buf)
    return bufs


def _unit_clip(
    engine: DPEngine, batch: UnitBatch, bounding: str
) -> tuple[ClipResult, Any, CanaryRows | None]:
    """The chunk's per-unit weights (checked, within each release's sensitivity), the
    gradients they weigh: the model's per-row infos (``mean``) or one dense mean per unit
    (``capped``), and an audit's canary rows (None without an audit)."""
    # An audit's canary units (workers.unit_canaries): their rows read no input.
    canary = CanaryRows.of(engine, batch) if engine.canaries is not None else None
    infos, sq, ctx = _row_norms(engine, batch if canary is None else canary.data)
    if bounding == "capped":
        clip, dense = _capped(engine, batch, infos, ctx.mask, canary)
        return clip, dense, canary
    clip = engine.strategy.clip(ctx)
    if canary is not None:
        # The canary rows weighed as rows of the batch; the checks below see their norms.
        clip, sq = canary.clip_rows(engine, clip, ctx, sq)
    private = engine.strategy.private
    if private and sq is not None:
        # Per row first, exactly the row-level step's check of the strategy's claim.
        _check_sensitivity("grad", sq, clip.weights, clip.sensitivity)
        for extra in clip.extra:
            _check_sensitivity(extra.name, sq, extra.weights, extra.sensitivity)
    if private:
        for sc in clip.scalars:
            _check_scalar(sc.name, sc.values, sc.sensitivity)
    clip = _shared_by_unit(clip, batch.row_share())
    if private and sq is not None:
        r = batch.rows_per_unit
        _check_unit_sum("grad", sq, clip.weights, clip.sensitivity, r)
        for extra in clip.extra:
            _check_unit_sum(extra.name, sq, extra.weights, extra.sensitivity, r)
    if private:
        for sc in clip.scalars:
            _check_unit_scalar(sc.name, sc.values, sc.sensitivity, batch.rows_per_unit)
    return clip, infos, canary


def _row_norms(engine: DPEngine, batch: UnitBatch) -> tuple[Any, Tensor | None, StepContext]:
    """The batch's rows through the engine's per-example code (non-finite rows removed there),
    unused slots reading a zero input: example 0 in every padding slot would let one hostile
    row (a non-finite input) put NaN into every step's sums (0 * NaN is NaN)."""
    idx, mask = batch.idx, batch.mask
    if idx.shape[1] == 0:
        return engine._norms(idx, mask, mask)
    flat = idx.view(-1)
    xb = engine.x.index_select(0, flat).view(*idx.shape, *engine.x.shape[1:])
    used = (mask > 0).view(*mask.shape, *([1] * (xb.dim() - 2)))
    xb.masked_fill_(used.logical_not(), 0)  # index_select's own copy
    target = xb
    if engine.y is not None:
        target = engine.y.index_select(0, flat).view(*idx.shape, *engine.y.shape[1:])
    return engine.per_sample(xb, target, mask)


def _shared_by_unit(clip: ClipResult, share: Tensor) -> ClipResult:
    """Every release's per-row weights (and scalar values) times 1/m_u: each unit then moves
    each release by the mean of its rows' bounded contributions."""
    w = share.unsqueeze(-1)
    return replace(
        clip,
        weights=clip.weights * w,
        # An extra's grad_coef promise (grad weights = coef * its weights where non-zero)
        # survives: both sides are scaled by the same 1/m_u.
        extra=tuple(replace(e, weights=e.weights * w) for e in clip.extra),
        scalars=tuple(replace(s, values=s.values * share) for s in clip.scalars),
    )


def _capped(
    engine: DPEngine,
    batch: UnitBatch,
    infos: Any,
    row_mask: Tensor,
    canary: CanaryRows | None = None,
) -> tuple[ClipResult, Any]:
    """``capped``: each unit's mean row gradient, clipped once by the strategy (an audit's
    canary rows placed among the rows before the mean).

    On a model that computes a group's norm from its rows' infos (both engine paths), the
    means are never built: the strategy clips the units by those norms, and each row then
    weighs its unit's weight times its share, so the rows' weighted sum is the sum of the
    clipped unit means. With an audit's canaries the means are built densely.
    """
    if (
        canary is None
        and infos is not None
        and batch.n_slots > 0
        and hasattr(engine.model, "group_sq_norms")
    ):
        share = batch.row_share() * row_mask
        sq = engine.model.group_sq_norms(infos, share, batch.rows_per_unit)
        clip, _ = _clip_units(engine, batch, sq)
        _check_units(engine, clip, sq)
        return _unit_weights_on_rows(clip, share, batch.rows_per_unit), infos
    return _capped_dense(engine, batch, infos, row_mask, canary)


def _capped_dense(
    engine: DPEngine,
    batch: UnitBatch,
    infos: Any,
    row_mask: Tensor,
    canary: CanaryRows | None = None,
) -> tuple[ClipResult, Any]:
    """:func:`_capped` from each unit's mean gradient built densely (``[K, U, P]``)."""
    k, u = engine.k, batch.n_slots
    columns = layer_columns(engine.model)
    if infos is None or u == 0:
        n = sum(b - a for ranges in columns for a, b in ranges)
        dense = DenseGrads(torch.zeros(k, u, n, device=engine.device), columns)
        sq = dense.sq_norms()
        clip, ctx = _clip_units(engine, batch, sq)
        if canary is not None:
            canary.choose_norm(engine, clip, ctx)  # nothing sampled: the step's shift only
    else:
        g = engine.model.per_sample_grads(infos)  # [K, U*R, P], exact on both paths
        dense = _unit_means(batch, g, row_mask, columns)
        sq = dense.sq_norms()
        clip, ctx = _clip_units(engine, batch, sq)
        if canary is not None:
            row_mask = canary.place(engine, g, row_mask, columns, clip, ctx)
            if canary.placed:
                dense = _unit_means(batch, g, row_mask, columns)
                sq = dense.sq_norms()
                clip, ctx = _clip_units(engine, batch, sq)
    _check_units(engine, clip, sq)
    return clip, dense


def _check_units(engine: DPEngine, clip: ClipResult, sq: Tensor) -> None:
    """The units are the strategy's examples: the row-level check of its claim, per unit."""
    if not engine.strategy.private:
        return
    _check_sensitivity("grad", sq, clip.weights, clip.sensitivity)
    for extra in clip.extra:
        _check_sensitivity(extra.name, sq, extra.weights, extra.sensitivity)
    for sc in clip.scalars:
        _check_scalar(sc.name, sc.values, sc.sensitivity)


def _unit_weights_on_rows(clip: ClipResult, share: Tensor, rows: int) -> ClipResult:
    """Each row's weight: its unit's times its share of the unit's mean (0 for unused rows),
    ``[K, U*R, *]`` from ``[K, U, *]``. The scalar releases stay per unit."""
    s = share.unsqueeze(-1)
    return replace(
        clip,
        weights=clip.weights.repeat_interleave(rows, dim=1) * s,
        # An extra's grad_coef promise survives: both sides are expanded and scaled alike.
        extra=tuple(
            replace(e, weights=e.weights.repeat_interleave(rows, dim=1) * s) for e in clip.extra
        ),
    )


def _unit_means(batch: UnitBatch, g: Tensor, row_mask: Tensor, columns: Any) -> DenseGrads:
    """Each unit's mean row gradient from the per-row gradients ``g`` ``[K, U*R, P]``."""
    k, u, r = g.shape[0], batch.n_slots, batch.rows_per_unit
    # Rows not used (padding) or removed (non-finite) weigh 0; zeroing them keeps a NaN in
    # an unused slot from reaching the sum (0 * NaN is NaN).
    share = (batch.row_share() * row_mask).to(g.dtype)
    g.masked_fill_(share.unsqueeze(-1) <= 0, 0.0)  # g is per_sample_grads' own copy
    mean = torch.bmm(share.view(k * u, 1, r), g.view(k * u, r, -1)).view(k, u, -1)
    return DenseGrads(mean, columns)


def _clip_units(engine: DPEngine, batch: UnitBatch, sq: Tensor) -> tuple[ClipResult, StepContext]:
    """The strategy's clip of the units' mean gradients, of squared norms ``sq`` ``[K, U, L]``
    (the units are its examples)."""
    ctx = StepContext(
        sq_norms=sq if engine.strategy.needs_norms else None,
        mask=batch.unit_mask(),
        expected_batch_size=engine.expected_batch_size,
        noise=engine.noise,
    )
    return engine.strategy.clip(ctx), ctx


def _check_unit_sum(
    name: str, sq_norms: Tensor, weights: Tensor, sensitivity: Tensor, rows_per_unit: int
) -> None:
    """Fail closed: each unit's rows' weighted contributions, summed by norm (an upper bound
    on the norm of the unit's contribution, by the triangle inequality), are within the
    claimed sensitivity. Like :func:`~workers.release_checks._check_sensitivity`, non-finite
    norms (a diverged trial) make no claim false; the message names no norm or count."""
    if weights.shape[-1] == 1:
        contrib = weights[..., 0].abs() * sq_norms.sum(dim=-1).sqrt()
    else:
        contrib = (weights.pow(2) * sq_norms).sum(dim=-1).sqrt()
    k, slots = contrib.shape
    per_unit = contrib.view(k, slots // rows_per_unit, rows_per_unit)  # [K, U, R], U may be 0
    _refuse_excess(name, per_unit.sum(dim=-1), per_unit, sensitivity)


def _check_unit_scalar(name: str, values: Tensor, sensitivity: Tensor, rows_per_unit: int) -> None:
    """Fail closed: each unit's total contribution to a scalar release is within its
    sensitivity."""
    k, slots = values.shape
    per_unit = values.abs().view(k, slots // rows_per_unit, rows_per_unit)
    _refuse_excess(f"scalar {name}", per_unit.sum(dim=-1), per_unit, sensitivity)


def _refuse_excess(name: str, total: Tensor, parts: Tensor, sensitivity: Tensor) -> None:
    bound = sensitivity.unsqueeze(1) * _ENFORCED
    bad = ~(total <= bound)  # also catches NaN
    if bad.any():
        finite = torch.isfinite(parts).all(dim=-1)
        if (bad & finite).any():
            k = int((bad & finite).any(dim=1).nonzero()[0])
            raise PrivacyError(
                f"release {name!r} of trial {k}: a unit's contribution exceeds the strategy's "
                "claimed sensitivity (a bug); refusing to release"
            )


__all__ = ["UnitSampling", "unit_releases"]
