"""Privacy units (issue 54): the rows of a person, and the sampler that draws persons.

With a privacy unit (``dataset.privacy_unit``, e.g. ``patient_id``) every epsilon protects a
whole unit, all its rows (user-level DP; Chua et al. 2024, "Mind the privacy unit"). A step
Poisson-samples *units* at q = b / N_units, each trial from its own secret sample stream, and
each sampled unit contributes one vector of norm at most the strategy's sensitivity
(:mod:`workers.unit_step`), so the accountant runs over units with the same q, sigma and T.

A sampled unit uses at most R = ``rows_per_unit`` of its rows: all of them when it has R or
fewer, else R chosen uniformly at random without replacement, from the *same secret stream*
as the units (never from the public seed, except in the labelled reproducible mode, which the
stream itself implements). Which rows were chosen is as private as which units were sampled.

The rows are chosen by Floyd's algorithm, R draws per large unit whatever its size, so the
work a step does depends on how many units were sampled (as the row-level engine's does on
its realised batch) but not on how many rows those units have.

Layout: a step's rows are ``[K, U_max, R]`` row slots flattened to ``[K, U_max * R]``: unit j
of trial k owns slots ``j*R .. j*R + R - 1``, its used rows first; padding slots (rows a unit
does not have, units a trial did not sample) hold example 0 with mask 0, as the engine pads.

Nothing here is logged or shown: unit sizes, counts and ids are private.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dpsweep.errors import ConfigError
from workers.randomness import RandomStream
from workers.sampling import poisson_sample, poisson_sample_pack
from workers.unit_rows_jit import choose_rows_kernel

#: ``TrainingConfig.rows_per_unit``'s range.
MIN_ROWS_PER_UNIT, MAX_ROWS_PER_UNIT = 1, 1024
_UNIT_FIELD = "dataset.privacy_unit"


@dataclass(frozen=True)
class UnitIndex:
    """The training rows grouped by unit (compressed sparse rows).

    Attributes:
        order: ``[n_rows]`` int64 row indices, unit 0's rows first, then unit 1's, ...
        offsets: ``[n_units + 1]`` int64: unit u's rows are ``order[offsets[u]:offsets[u+1]]``.
    """

    order: np.ndarray
    offsets: np.ndarray

    @property
    def n_units(self) -> int:
        """The number of units (private: the engine samples over it, nothing shows it)."""
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray:
        """``[n_units]`` rows of each unit (private)."""
        return np.diff(self.offsets)

    def __repr__(self) -> str:
        # Sizes and counts are private: never in a log line or a traceback's locals summary.
        return "UnitIndex(<private>)"

    @classmethod
    def from_ids(cls, ids: np.ndarray | Tensor, *, n_rows: int | None = None) -> UnitIndex:
        """The index of dense unit ids, one per row (``0 .. U-1``, every id used).

        Args:
            ids: ``[n_rows]`` integer unit ids (``Dataset.units_train``).
            n_rows: the training rows' number the ids must match, if given.

        Raises:
            ConfigError: ids that are not one integer per row in ``0 .. U-1`` (field
                ``dataset.privacy_unit``; the message names no count or id).
        """
        arr = ids.detach().cpu().numpy() if isinstance(ids, Tensor) else np.asarray(ids)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ConfigError(
                "the privacy unit must be one integer unit id per training row", field=_UNIT_FIELD
            )
        if n_rows is not None and len(arr) != n_rows:
            raise ConfigError(
                "the privacy unit's ids do not match the training rows one for one",
                field=_UNIT_FIELD,
            )
        arr = arr.astype(np.int64, copy=False)
        if len(arr) and int(arr.min()) < 0:
            raise ConfigError("the privacy unit's ids must be dense, from 0", field=_UNIT_FIELD)
        n_units = int(arr.max()) + 1 if len(arr) else 0
        sizes = np.bincount(arr, minlength=n_units)
        if n_units and not (sizes > 0).all():
            # Not a privacy problem (an empty unit contributes nothing), but the loader's
            # contract is dense ids: a gap means the ids were not what it promised.
            raise ConfigError("the privacy unit's ids must be dense, from 0", field=_UNIT_FIELD)
        offsets = np.zeros(n_units + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return cls(order=np.argsort(arr, kind="stable").astype(np.int64), offsets=offsets)


def check_rows_per_unit(rows_per_unit: int) -> int:
    """``rows_per_unit`` as an int in 1..1024.

    Raises:
        ConfigError: out of range or not a whole number (field ``training.rows_per_unit``).
    """
    ok = isinstance(rows_per_unit, int | np.integer) and not isinstance(rows_per_unit, bool)
    if not ok or not MIN_ROWS_PER_UNIT <= int(rows_per_unit) <= MAX_ROWS_PER_UNIT:
        raise ConfigError(
            f"rows_per_unit must be a whole number in {MIN_ROWS_PER_UNIT}..{MAX_ROWS_PER_UNIT}; "
            f"got {rows_per_unit!r}",
            field="training.rows_per_unit",
        )
    return int(rows_per_unit)


def choose_rows(
    index: UnitIndex, units: np.ndarray, *, rows_per_unit: int, stream: RandomStream
) -> tuple[np.ndarray, np.ndarray]:
    """The rows each sampled unit uses: all of a unit with at most R rows, else R distinct
    rows chosen uniformly at random from ``stream`` (the trial's secret sample stream).

    Args:
        index: the units' rows.
        units: ``[B]`` the sampled units' ids.
        rows_per_unit: R.
        stream: the trial's sample stream; R words are drawn per unit with more than R rows.

    Returns:
        ``rows`` ``[B, R]`` int64 (unit j's used rows first; 0 in its unused slots) and
        ``counts`` ``[B]`` int64, the rows each unit uses (``min(size, R)``).
    """
    r = int(rows_per_unit)
    units = np.asarray(units, dtype=np.int64)
    starts = index.offsets[units]
    sizes = index.offsets[units + 1] - starts
    n_big = int(np.count_nonzero(sizes > r))
    # R words per unit larger than R, drawn in one call, in the units' order (_floyd's).
    words = stream.words(n_big * r).view(np.uint64) if n_big else np.empty(0, dtype=np.uint64)
    return choose_rows_kernel(starts, sizes, index.order, np.ascontiguousarray(words), r)


@dataclass
class UnitBatch:
    """A step's sampled units for a pack: row slots ``[K, U * R]`` (see the module docstring).

    Attributes:
        idx: ``[K, U*R]`` int64 row indices (example 0 in padding slots).
        mask: ``[K, U*R]`` float32, 1.0 on a used row, 0.0 on padding.
        counts: ``[K, U]`` float32, each unit's used rows m_u (0.0: not a sampled unit).
        rows_per_unit: R, the slots per unit.
    """

    idx: Tensor
    mask: Tensor
    counts: Tensor
    rows_per_unit: int

    def __repr__(self) -> str:
        return "UnitBatch(<private>)"

    @property
    def n_slots(self) -> int:
        """U, the unit slots per trial (the pack's most sampled units, or a padded number)."""
        return int(self.counts.shape[1])

    def row_share(self) -> Tensor:
        """``[K, U*R]``: 1/m_u on each used row of unit u, 0.0 on padding slots."""
        r = self.rows_per_unit
        inv = torch.where(self.counts > 0, 1.0 / self.counts.clamp(min=1.0), 0.0)
        return inv.repeat_interleave(r, dim=1) * self.mask

    def unit_mask(self) -> Tensor:
        """``[K, U]``: 1.0 for a sampled unit, 0.0 for a padding slot."""
        return (self.counts > 0).to(self.mask.dtype)

    def units(self, a: int, b: int) -> UnitBatch:
        """Unit slots ``a .. b-1`` (a physical chunk), contiguous."""
        r = self.rows_per_unit
        return UnitBatch(
            idx=self.idx[:, a * r : b * r].contiguous(),
            mask=self.mask[:, a * r : b * r].contiguous(),
            counts=self.counts[:, a:b].contiguous(),
            rows_per_unit=r,
        )

    def padded(self, n_slots: int) -> UnitBatch:
        """The batch with padding unit slots (example 0, mask 0) up to ``n_slots``."""
        extra = n_slots - self.n_slots
        if extra <= 0:
            return self
        k, r = self.idx.shape[0], self.rows_per_unit
        return UnitBatch(
            idx=torch.cat([self.idx, self.idx.new_zeros(k, extra * r)], dim=1),
            mask=torch.cat([self.mask, self.mask.new_zeros(k, extra * r)], dim=1),
            counts=torch.cat([self.counts, self.counts.new_zeros(k, extra)], dim=1),
            rows_per_unit=r,
        )

    def to(self, device: torch.device) -> UnitBatch:
        """The batch on ``device``."""
        if device.type == "cpu":
            return self
        return UnitBatch(
            idx=self.idx.to(device, non_blocking=True),
            mask=self.mask.to(device, non_blocking=True),
            counts=self.counts.to(device, non_blocking=True),
            rows_per_unit=self.rows_per_unit,
        )


def sample_units(
    index: UnitIndex, *, sample_rate: float, rows_per_unit: int, stream: RandomStream
) -> tuple[np.ndarray, np.ndarray]:
    """One trial's step: Poisson-sampled units at ``sample_rate``, then their rows.

    Returns:
        ``rows`` ``[B, R]`` and ``counts`` ``[B]`` (:func:`choose_rows`) of the B sampled units.
    """
    units = poisson_sample(index.n_units, sample_rate=sample_rate, stream=stream).numpy()
    return choose_rows(index, units, rows_per_unit=rows_per_unit, stream=stream)


def sample_units_pack(
    index: UnitIndex,
    *,
    sample_rate: float,
    rows_per_unit: int,
    streams: Sequence[RandomStream],
) -> UnitBatch:
    """Independent unit samples for the K trials of a pack, padded to the pack's largest.

    Trial k's units and rows are exactly :func:`sample_units` with ``streams[k]``: each stream
    gives its units' Poisson gaps first (:func:`workers.sampling.poisson_sample_pack`, which
    reads each stream as :func:`~workers.sampling.poisson_sample` does), then its rows.
    """
    r = int(rows_per_unit)
    n = index.n_units
    if len(streams) == 1:
        picks = [poisson_sample(n, sample_rate=sample_rate, stream=streams[0]).numpy()]
    else:
        idx, mask = poisson_sample_pack(n, sample_rate=sample_rate, streams=list(streams))
        keep = mask.numpy() > 0
        picks = [row[k] for row, k in zip(idx.numpy(), keep, strict=True)]
    chosen = [
        choose_rows(index, units, rows_per_unit=r, stream=stream)
        for units, stream in zip(picks, streams, strict=True)
    ]
    u_max = max((len(c) for _, c in chosen), default=0)
    k = len(streams)
    rows = np.zeros((k, u_max, r), dtype=np.int64)
    counts = np.zeros((k, u_max), dtype=np.int64)
    for t, (rw, ct) in enumerate(chosen):
        rows[t, : len(ct)] = rw
        counts[t, : len(ct)] = ct
    mask_np = (np.arange(r) < counts[:, :, None]).astype(np.float32)
    return UnitBatch(
        idx=torch.from_numpy(rows.reshape(k, u_max * r)),
        mask=torch.from_numpy(mask_np.reshape(k, u_max * r)),
        counts=torch.from_numpy(counts.astype(np.float32)),
        rows_per_unit=r,
    )


__all__ = [
    "MAX_ROWS_PER_UNIT",
    "MIN_ROWS_PER_UNIT",
    "UnitBatch",
    "UnitIndex",
    "check_rows_per_unit",
    "choose_rows",
    "sample_units",
    "sample_units_pack",
]
