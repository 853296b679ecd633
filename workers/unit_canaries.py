"""An audit's gradient canaries on data with a privacy unit (issue 54): canary *units*.

At the row level a gradient canary is one more record (:mod:`workers.engine`). With a privacy
unit it is one more unit: the audit's claim is the plan's epsilon per unit, so the canary must
be what that epsilon protects. Each included canary is unit ``N_units + i`` of the unit sampler
(:mod:`workers.units`), with ``unit_rows`` rows (``n_data + i * unit_rows ..``), sampled at the
unit rate by the same code as every unit, its rows chosen by the same code too. Every row of a
canary unit carries the canary's gradient ``G u``, and the rows go through the unit step's own
bounding (:mod:`workers.unit_step`):

* ``mean``: each row is clipped by the strategy, then weighed 1/m_u, so the unit contributes
  the mean of its rows' clipped gradients: exactly the clipped canary, whatever m_u;
* ``capped``: the rows' gradients are averaged (the very mean the unit step takes of a unit's
  exact per-row gradients), then clipped once: again exactly the clipped canary.

A bug in either (a missing 1/m_u, a sum for a mean) makes a canary unit of several rows
contribute several times its bound, which the audit's scores show. Canary rows are read as
example 0 with a zero mask, as the row-level engine reads a canary slot: their gradient is the
canary's, never computed from an input.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from workers.strategies.base import ClipResult, StepContext
from workers.units import UnitBatch, UnitIndex

if TYPE_CHECKING:
    from workers.engine import DPEngine


def index_with_canaries(
    units: np.ndarray | Tensor, *, n_rows: int, canary_units: int, canary_rows: int
) -> UnitIndex:
    """The data's units followed by ``canary_units`` canary units of ``canary_rows`` rows each
    (rows ``n_rows ..``, units ``N_units ..``).

    Raises:
        ConfigError: the data's unit ids are not dense (:meth:`UnitIndex.from_ids`).
    """
    base = UnitIndex.from_ids(units, n_rows=n_rows)  # the data's ids checked on their own
    ids = units.detach().cpu().numpy() if isinstance(units, Tensor) else np.asarray(units)
    extra = base.n_units + np.repeat(np.arange(canary_units, dtype=np.int64), canary_rows)
    return UnitIndex.from_ids(np.concatenate([ids.astype(np.int64), extra]))


def data_row_shares(index: UnitIndex, n_data: int) -> Tensor:
    """``[n_data]``: 1 / (rows of the row's unit) for each data row.

    What a row weighs in its unit's expected contribution under ``mean`` (and, as a
    prediction only, under ``capped``): used by a public dataset's audit alone, whose
    adversary knows every other record (:meth:`workers.engine.DPEngine.expected_data_release`).
    """
    sizes = index.sizes
    share = np.empty(len(index.order), dtype=np.float32)
    share[index.order] = np.repeat(1.0 / np.maximum(sizes, 1), sizes)
    return torch.from_numpy(share[:n_data])


@dataclass
class CanaryRows:
    """A step's canary rows.

    Attributes:
        data: the batch with its canary rows read as example 0 at mask 0 (the data's rows).
        slots: ``[K, S]`` bool, the sampled canary rows (None: none sampled).
        ids: ``[K, S]`` the canary of each row (anything where not a slot).
        raw_norm: ``[K]`` the canaries' raw norm this step (set once chosen).
        placed: the rows' gradients are in the dense per-row gradients already (``capped``).
    """

    data: UnitBatch
    slots: Tensor | None
    ids: Tensor
    raw_norm: Tensor | None = None
    placed: bool = False

    def __repr__(self) -> str:
        return "CanaryRows(<secret>)"

    @classmethod
    def of(cls, engine: DPEngine, batch: UnitBatch) -> CanaryRows:
        """The canary rows of ``batch`` (rows ``engine.n_data`` and up)."""
        can = engine.canaries
        assert can is not None  # only called in an audit
        idx, mask = batch.idx, batch.mask
        if can.n_included == 0 or idx.shape[1] == 0:
            return cls(data=batch, slots=None, ids=idx)
        slots = (idx >= engine.n_data) & (mask > 0)
        unit = torch.div((idx - engine.n_data).clamp(min=0), can.unit_rows, rounding_mode="floor")
        ids = can.ids_in[unit.clamp(max=can.n_included - 1)]
        data = replace(
            batch,
            idx=torch.where(slots, torch.zeros_like(idx), idx),
            mask=mask * slots.logical_not().to(mask.dtype),
        )
        return cls(data=data, slots=slots if bool(slots.any()) else None, ids=ids)

    def choose_norm(self, engine: DPEngine, clip: ClipResult, ctx: StepContext) -> Tensor:
        """The canaries' raw norm this step, from the strategy's own weights (every step, as
        the adversary's per-step shift is recorded every step)."""
        can = engine.canaries
        assert can is not None
        self.raw_norm = can.choose_norm(
            engine.strategy, StepContext, sensitivity=clip.sensitivity, ctx=ctx
        )
        return self.raw_norm

    def clip_rows(
        self, engine: DPEngine, clip: ClipResult, ctx: StepContext, sq: Tensor | None
    ) -> tuple[ClipResult, Tensor | None]:
        """``mean``: the strategy's per-row weights with the canary rows as rows of the batch,
        and the squared norms with theirs (which the per-row and per-unit checks then see)."""
        can = engine.canaries
        assert can is not None
        raw = self.choose_norm(engine, clip, ctx)
        if self.slots is None or sq is None:
            return clip, sq
        sq = torch.where(self.slots.unsqueeze(-1), can.slot_norms(raw, self.ids), sq)
        mask = ctx.mask + self.slots.to(ctx.mask.dtype)
        ctx = StepContext(
            sq_norms=sq, mask=mask, expected_batch_size=ctx.expected_batch_size, noise=ctx.noise
        )
        return engine.strategy.clip(ctx), sq

    def place(
        self, engine: DPEngine, grads: Tensor, row_mask: Tensor, columns: Any, clip: ClipResult,
        ctx: StepContext,
    ) -> Tensor:  # fmt: skip
        """``capped``: the canary rows' gradients written into the dense per-row gradients
        ``grads`` ``[K, S, P]``; the row mask with the canary rows counted again."""
        can = engine.canaries
        assert can is not None
        raw = self.choose_norm(engine, clip, ctx)
        if self.slots is None:
            return row_mask
        can.place_rows(grads, self.slots, self.ids, raw, columns)
        self.placed = True
        return row_mask + self.slots.to(row_mask.dtype)

    def add_into(self, engine: DPEngine, bufs: list[Tensor], weights: list[Tensor]) -> None:
        """``mean``: the sampled canary rows' weighted gradients added to every vector release
        (their weights carry the strategy's clip, 1/m_u and 1/b)."""
        can = engine.canaries
        if can is None or self.slots is None or self.placed or self.raw_norm is None:
            return
        for buf, w in zip(bufs, weights, strict=True):
            can.add_into(buf, w, self.slots, self.ids, self.raw_norm)


__all__ = ["CanaryRows", "data_row_shares", "index_with_canaries"]
