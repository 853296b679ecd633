"""Gradient canaries: records that live in gradient space, for a white-box audit of DP-SGD.

Each of the ``m`` canaries is included in the training set independently with probability ½
(Steinke, Nasr & Jagielski 2023). An included canary is one more record of the dataset: the
engine's own Poisson sampling draws it (index ``N + i``), the strategy weighs it from its norms
like any other example, the engine's sensitivity check covers it, and it is added to every
vector release before the noise. Nothing of the step is re-implemented; the canary only
replaces the example's per-sample gradient by a vector the auditor chose:

* its direction ``u_j`` is a unit vector: uniformly random over all P parameters (or one
  coordinate, ``dirac``) for flat clipping, where it is as far from the other canaries as P
  allows; for layerwise clipping, the same norm ``1/sqrt(L)`` in each of the L clipping
  groups (one unit vector per layer, scaled), which is the worst-case record there;
* its raw norm ``G = f S`` is chosen per step from the strategy's own weights: the largest
  factor ``f`` in :data:`NORM_FACTORS` whose clipped contribution is the largest the strategy
  allows (``S`` for clipping strategies, whose weights bring ``1000 S`` down to ``S``; exactly
  ``S`` for clipless Lipschitz training, whose weights are 1). A canary above the threshold is
  what makes a clipping fault visible.

The white-box adversary sees every noised release: after each step, :meth:`observe` records
the projection of each trial's gradient release on each canary's direction, in units of the
release's noise (``z = b <r, u> / (sigma_g S')``). :mod:`workers.canary_audit.scores` turns
those into one score per canary.

The inclusion bits and the directions come from the OS CSPRNG, afresh for every audit.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from dpsweep.errors import ConfigError

Direction = Literal["auto", "random", "dirac"]

#: Candidate raw norms of a canary, as multiples of the step's sensitivity (largest first).
NORM_FACTORS = (1000.0, 100.0, 10.0, 4.0, 2.0, 1.0)


def layer_ranges(model: Any) -> list[tuple[int, int]]:
    """The flat-parameter range ``[a, b)`` of each clipping group, for both engine paths."""
    slices = model.slices
    if isinstance(slices, dict):  # GenericModel: parameter name -> (a, b), grouped by layer
        return [(slices[names[0]][0], slices[names[-1]][1]) for names in model.layer_params]
    return [(sl[0][0], sl[-1][1]) for sl in slices]  # PackedModel: per layer, (a, b, shape)


def resolve_direction(direction: Direction, *, m: int, room: int) -> Literal["random", "dirac"]:
    """``auto``: Dirac canaries where the model has ``room`` for ``m`` of them, else random.

    Dirac canaries are mutually orthogonal, random ones are not: at q = 1 every included
    canary is in every release, so a random canary's overlap with the others adds up over the
    steps like its own signal does, and drowns part of it (issue 49 measured the Gaussian
    estimate at 6.0-7.4 with random canaries and 6.4-7.1 with Dirac ones on an honest claim of
    8, and noise at 0.8 of its scale caught 2 of 5 against 5 of 5). At small q the two give
    the same bounds within the run-to-run spread.
    """
    if direction == "auto":
        return "dirac" if m <= room else "random"
    return direction


class GradientCanaries:
    """``m`` gradient canaries for one pack (every trial sees the same canary set).

    Args:
        m: the number of canaries.
        ranges: each clipping group's flat-parameter range (:func:`layer_ranges`).
        numel: the number of parameters P.
        device: where the pack trains.
        direction: ``random`` (a uniformly random unit vector per layer), ``dirac`` (one
            coordinate per layer, distinct between canaries) or ``auto``: ``dirac`` where the
            model has a coordinate for each canary, else ``random`` (:func:`resolve_direction`).
        knows_data: the adversary knows every other record (a public dataset): each step, the
            engine hands :meth:`observe` the data's expected contribution to subtract.
        per_layer: the strategy clips layerwise: equal norm in every clipping group.
        unit_rows: on data with a privacy unit, the rows of each canary unit (every row
            carries the canary's gradient, so a unit's one contribution is that gradient
            whatever its row count; :mod:`workers.unit_canaries`). Unused at the row level.
    """

    def __init__(
        self,
        m: int,
        *,
        ranges: Sequence[tuple[int, int]],
        numel: int,
        device: torch.device,
        direction: Direction = "auto",
        knows_data: bool = False,
        per_layer: bool = False,
        unit_rows: int = 1,
    ) -> None:
        if m < 2:
            raise ConfigError("an audit needs at least 2 canaries", field="canaries")
        sizes = [b - a for a, b in ranges]
        room = min(sizes) if per_layer else numel
        direction = resolve_direction(direction, m=m, room=room)
        if direction == "dirac" and m > room:
            raise ConfigError(
                f"{m} Dirac canaries need {m} distinct coordinates"
                + (" in every layer" if per_layer else "")
                + f", and there are {room}: lower canaries or use direction 'random'",
                field="canaries",
            )
        if not 1 <= unit_rows <= 1024:
            raise ConfigError("canary_rows must be between 1 and 1024", field="canary_rows")
        self.m = int(m)
        self.unit_rows = int(unit_rows)
        self.direction: Literal["random", "dirac"] = direction
        self.device = device
        self.knows_data = knows_data
        self.n_layers = len(ranges)
        # Secret until the audit is scored: the OS CSPRNG, a fresh generator per audit.
        rng = np.random.default_rng(secrets.randbits(128))
        self.included = rng.random(self.m) < 0.5
        self.ids_in = torch.from_numpy(np.flatnonzero(self.included)).to(device)
        u = torch.zeros(self.m, numel, dtype=torch.float32)
        rows = torch.arange(self.m)
        if per_layer:
            scale = 1.0 / math.sqrt(self.n_layers)
            for a, b in ranges:
                if direction == "dirac":
                    u[rows, torch.from_numpy(rng.permutation(b - a)[: self.m] + a)] = scale
                else:
                    g = torch.from_numpy(rng.standard_normal((self.m, b - a)).astype(np.float32))
                    u[:, a:b] = g / g.norm(dim=1, keepdim=True) * scale
        elif direction == "dirac":
            u[rows, torch.from_numpy(rng.permutation(numel)[: self.m])] = 1.0
        else:
            g = torch.from_numpy(rng.standard_normal((self.m, numel)).astype(np.float32))
            u = g / g.norm(dim=1, keepdim=True)
        # Each canary's squared norm in each clipping group (its per-layer "gradient norms").
        self.layer_sq = torch.stack([u[:, a:b].pow(2).sum(dim=1) for a, b in ranges], dim=1)
        self.layer_sq = (self.layer_sq / self.layer_sq.sum(dim=1, keepdim=True)).to(device)
        self.directions = u.to(device)
        # Which layer each coordinate belongs to (layerwise weights apply per layer).
        self.layer_of = torch.empty(numel, dtype=torch.long)
        for i, (a, b) in enumerate(ranges):
            self.layer_of[a:b] = i
        self.layer_of = self.layer_of.to(device)
        self.z: list[Tensor] = []  # per step: [K, m] projections in noise units
        self.mu: list[Tensor] = []  # per step: [K] mean shift of a sampled canary
        self._factor: Tensor | None = None
        self._contribution: Tensor | None = None
        # How many canary slots entered a release (checked after training: an audit whose
        # canaries never entered proves nothing).
        self.entered = 0

    @property
    def n_included(self) -> int:
        return int(self.ids_in.numel())

    # -- the engine's side --------------------------------------------------------------------

    def choose_norm(self, strategy: Any, ctx_cls: Any, *, sensitivity: Tensor, ctx: Any) -> Tensor:
        """Per trial, the canary's raw norm ``G = f S`` (see the module docstring); ``[K]``.

        Probes the strategy's :meth:`clip` (which must not change its state) on canaries alone.
        """
        k = sensitivity.shape[0]
        n_f = len(NORM_FACTORS)
        f = torch.tensor(NORM_FACTORS, device=self.device, dtype=torch.float32)
        g = f.view(1, n_f) * sensitivity.view(k, 1).float()  # [K, F]
        # The canaries' mean per-layer profile (equal for layerwise and Dirac directions; the
        # random ones differ from it by a fraction of a percent).
        profile = self.layer_sq.mean(dim=0)
        sq = g.pow(2).unsqueeze(-1) * profile.view(1, 1, -1)
        probe = ctx_cls(
            sq_norms=sq,
            mask=torch.ones(k, n_f, device=self.device),
            expected_batch_size=ctx.expected_batch_size,
            noise=ctx.noise,
        )
        w = strategy.clip(probe).weights  # [K, F, R]
        contrib = (
            (w.pow(2) * sq if w.shape[-1] > 1 else w.pow(2) * sq.sum(-1, keepdim=True))
            .sum(-1)
            .sqrt()
        )  # [K, F]
        allowed = contrib <= sensitivity.view(k, 1) * (1.0 + 1e-4)
        best = torch.where(allowed, contrib, torch.zeros_like(contrib)).amax(dim=1, keepdim=True)
        good = allowed & (contrib >= best * (1.0 - 1e-3)) & (best > 0)
        # NORM_FACTORS is largest first: the first good factor is the largest.
        last = torch.full((k,), n_f - 1, device=self.device, dtype=torch.long)
        first = torch.where(good.any(dim=1), good.float().argmax(dim=1), last)
        rows = torch.arange(k, device=self.device)
        self._contribution = contrib[rows, first]
        return g[rows, first]

    def slot_norms(self, raw_norm: Tensor, canary_ids: Tensor) -> Tensor:
        """Per-layer squared norms ``[K, B, L]`` of the canaries ``canary_ids [K, B]`` at raw
        norm ``raw_norm [K]``."""
        return raw_norm.pow(2).view(-1, 1, 1) * self.layer_sq[canary_ids]

    def add_into(
        self, buf: Tensor, weights: Tensor, slots: Tensor, canary_ids: Tensor, raw_norm: Tensor
    ) -> None:
        """``buf[k] += sum_c weights[k, c] G_k u_{id(k, c)}`` over the canary slots of each trial.

        Args:
            buf: a ``[K, P]`` release buffer (its weights are already divided by b).
            weights: the strategy's ``[K, B, R]`` weights (divided by b).
            slots: ``[K, B]`` bool, the canary slots.
            canary_ids: ``[K, B]`` the canary of each slot (anything where not a slot).
            raw_norm: ``[K]`` the canaries' raw norm G.
        """
        for k in range(buf.shape[0]):
            where = slots[k].nonzero().flatten()
            if where.numel() == 0:
                continue
            self.entered += int(where.numel())
            u = self.directions.index_select(0, canary_ids[k, where])  # [c, P]
            w = weights[k, where]  # [c, R]
            if w.shape[-1] == 1:
                buf[k] += raw_norm[k] * (w[:, 0] @ u)
            else:
                buf[k] += raw_norm[k] * (w[:, self.layer_of] * u).sum(0)

    def place_rows(
        self,
        grads: Tensor,
        slots: Tensor,
        canary_ids: Tensor,
        raw_norm: Tensor,
        columns: Sequence[Sequence[tuple[int, int]]],
    ) -> None:
        """Write each canary row's gradient ``G_k u_id`` into dense per-row gradients.

        The ``capped`` unit bounding averages a unit's exact per-row gradients before it clips
        the unit once; a canary unit's rows then go through that very mean.

        Args:
            grads: ``[K, S, P]`` per-row gradients in ``per_sample_grads`` column order.
            slots: ``[K, S]`` bool, the canary rows.
            canary_ids: ``[K, S]`` the canary of each row (anything where not a slot).
            raw_norm: ``[K]`` the canaries' raw norm G.
            columns: each clipping group's flat ranges, in column order
                (:func:`workers.augment.layer_columns`).
        """
        cols = torch.cat([torch.arange(a, b) for ranges in columns for a, b in ranges])
        cols = cols.to(self.device)
        for k in range(grads.shape[0]):
            where = slots[k].nonzero().flatten()
            if where.numel() == 0:
                continue
            self.entered += int(where.numel())
            u = self.directions.index_select(0, canary_ids[k, where]).index_select(1, cols)
            grads[k, where] = (raw_norm[k] * u).to(grads.dtype)

    def observe(
        self,
        grad_release: Tensor,
        *,
        noise_std: Tensor,
        expected_batch_size: float,
        predicted: Tensor | None = None,
    ) -> None:
        """Record the white-box adversary's view of one step.

        Args:
            grad_release: the noised ``[K, P]`` gradient release.
            noise_std: ``[K]`` the standard deviation of its noise per coordinate.
            expected_batch_size: b (the release is a sum divided by b).
            predicted: ``[K, P]`` the data's expected part of the release, if known.
        """
        if self._contribution is None:
            raise RuntimeError("GradientCanaries.observe before choose_norm")
        std = noise_std.reshape(-1).float()
        seen = grad_release.float()
        if predicted is not None:
            # The data's part is removed at the scale the release shows it at (a least-squares
            # fit of one number per trial), not at the claimed rate: the adversary sees both,
            # and a mechanism that samples more than it claims must not hide behind the claim.
            pred = predicted.float()
            energy = pred.pow(2).sum(dim=1, keepdim=True)
            scale = torch.where(
                energy > 0, (seen * pred).sum(dim=1, keepdim=True) / energy, torch.ones_like(energy)
            )
            seen = seen - scale * pred
        proj = seen @ self.directions.T  # [K, m]
        self.z.append((proj / std.view(-1, 1)).cpu())
        # A sampled canary's contribution, divided by b like the release, in noise units.
        self.mu.append((self._contribution / expected_batch_size / std).cpu())

    def scored_inputs(self) -> tuple[Tensor, Tensor, np.ndarray]:
        """``z`` ``[T, K, m]``, ``mu`` ``[T, K]`` and the inclusion bits ``[m]``.

        The bits are the audit's secret until now: call this only after training.
        """
        if not self.z:
            raise ConfigError("the audit ran no step", field="training.steps")
        return torch.stack(self.z), torch.stack(self.mu), self.included.copy()
