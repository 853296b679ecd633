"""One DP-SGD step for a pack of K trials.

Per step and per trial k (all trials at once):

1. Poisson-sample a batch from trial k's own sampling generator; batches are padded to the
   largest one in the pack and masked, so padding contributes zero weight.
2. Forward with capture, one ``autograd.grad`` for ``dL/dz`` of every layer, per-sample norms.
3. The strategy maps norms to weights and a sensitivity S (and optional extra releases).
4. Release ``(sum_i w_i g_i + sigma_g S xi) / b`` with xi from trial k's own noise stream and
   b = qN the *expected* batch size (the realised size is private under Poisson sampling). The
   noise is floating-point safe (:func:`workers.randomness.add_snapped_noise`), and its scale
   covers the sensitivity the engine actually enforces (S times 1 + the check's tolerance).
5. The strategy observes the noised releases; the optimizer steps; the strategy post-processes.

Batches and noise come from each trial's own :class:`~workers.randomness.TrialRandomness`: a
fresh OS secret per trial, or the public seed in the labelled reproducible mode.

An audit (:mod:`workers.canary_audit`) hands the engine gradient canaries: records of the
training set (indices ``N`` and up) whose per-sample gradient the auditor chose. They are
sampled, weighed, checked and noised by exactly the code above; only their gradient differs.
With a privacy unit each canary is a unit of rows after the data's (:mod:`workers.unit_canaries`).

An example whose gradient (or, for strategies without per-example norms, whose loss) is not
finite gets weight 0: removing one example stays within the sensitivity, and so a poisoned
record cannot make a run fail, which would reveal whether it was sampled.

With a privacy unit (issue 54: ``units``) the population sampled is the units, and each
sampled unit's rows make one bounded contribution (:mod:`workers.unit_step`).

Nothing computed from the private batch leaves this module without noise, including error
messages: they name the release and the trial, never a norm or a count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from workers.augment import Augmenter, augmented_per_sample
from workers.canary_hook import GradientCanaryHook
from workers.chunked_step import chunked_releases
from workers.optim import PackedOptimizer
from workers.packed.model import PackedModel
from workers.randomness import NoiseSource, RandomStream, add_snapped_noise
from workers.release_checks import _ENFORCED, _check_scalar, _check_sensitivity
from workers.sampling import poisson_sample, poisson_sample_pack
from workers.strategies.base import ClippingStrategy, StepContext
from workers.unit_canaries import data_row_shares
from workers.unit_step import UnitSampling, unit_releases

Task = Literal["classification", "reconstruction"]


def per_sample_loss(out: Tensor, target: Tensor, task: Task) -> Tensor:
    """Per-example loss `[K, B]`; `target` is labels `[K, B]` or inputs `[K, B, ...]`."""
    if task == "classification":
        # Softmax cross-entropy by a stable log-sum-exp: the same value as F.cross_entropy, but
        # ~2.5x faster on CPU for few classes, whose log_softmax kernel takes a slow path.
        z = out - out.detach().amax(dim=-1, keepdim=True)
        return torch.log(torch.exp(z).sum(dim=-1)) - z.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    k, b = out.shape[:2]
    return (out - target).pow(2).reshape(k, b, -1).mean(dim=2)


class DPEngine:
    """Runs DP-SGD steps for a pack. See the module docstring for the algorithm.

    Args:
        model: the packed model (its flat parameters are updated in place).
        strategy: the clipping strategy, vectorised over the pack.
        optimizer: the packed optimizer.
        x, y: the training split on the model's device (``y`` labels, or None to reconstruct x).
        task: ``classification`` or ``reconstruction``.
        sample_rate: Poisson sampling rate q.
        noise_multiplier: ``[K]`` planned noise multipliers (ignored by non-private strategies).
        sample_streams: one random stream per trial for Poisson sampling.
        noise: per-trial Gaussian noise source (each trial's own noise stream).
        canaries: an audit's gradient canaries (the included ones are records ``N..``), or None.
        physical_batch_size: examples per physical chunk of a logical batch
            (:mod:`workers.chunked_step`); None: one piece (an audit always runs in one piece).
        augmenter: augmentation multiplicity (:mod:`workers.augment`), or None.
        units: each training row's privacy unit (dense ids, private), or None: each row is
            its own unit. With units, q samples units and ``physical_batch_size`` counts rows.
        unit_bounding, rows_per_unit: how a sampled unit's rows make its one contribution
            (:mod:`workers.unit_step`); read only with ``units``.
        planning_n: the number of training units (rows without ``units``) the plan used for
            q: the owner's declaration for a stored dataset, public. The expected batch size
            b = q ``planning_n`` (plus an audit's included canaries), which scales every
            release and sizes the quantile count's noise, comes from it and never from the
            records' own count: two neighbouring datasets under one declaration get the same
            b. None: the counted number (data with no declaration, where the two agree).

    Raises:
        ConfigError: what a run with units does not support (:meth:`UnitSampling.build`).
    """

    def __init__(
        self,
        *,
        model: PackedModel,
        strategy: ClippingStrategy,
        optimizer: PackedOptimizer,
        x: Tensor,
        y: Tensor | None,
        task: Task,
        sample_rate: float,
        noise_multiplier: Tensor,
        sample_streams: Sequence[RandomStream],
        noise: NoiseSource,
        canaries: GradientCanaryHook | None = None,
        physical_batch_size: int | None = None,
        augmenter: Augmenter | None = None,
        units: np.ndarray | Tensor | None = None,
        unit_bounding: str = "mean",
        rows_per_unit: int = 8,
        planning_n: int | None = None,
    ) -> None:
        self.model = model
        self.strategy = strategy
        self.optimizer = optimizer
        self.x = x
        self.y = y
        self.task = task
        self.canaries = canaries
        self.physical_batch_size = physical_batch_size
        self.augmenter = augmenter
        self.n_data = int(x.shape[0])
        # The included canaries are records too: sampled at the same rate by the same code.
        self.n = self.n_data + (canaries.n_included if canaries is not None else 0)
        self.units: UnitSampling | None = None
        if units is not None:
            self.units = UnitSampling.build(
                units, n_rows=self.n_data, bounding=unit_bounding, rows_per_unit=rows_per_unit,
                strategy=strategy, augmented=augmenter is not None,
                # An audit's included canaries are units too (workers.unit_canaries).
                canary_units=canaries.n_included if canaries is not None else 0,
                canary_rows=canaries.unit_rows if canaries is not None else 1,
            )  # fmt: skip
            self.n = self.units.index.n_units  # q samples units; b = q N_units
        self.sample_rate = float(sample_rate)
        # Privacy: b is public. Sampling runs over the records there are (self.n), but the
        # divisor and the count noise use the plan's size, so neither moves with one record.
        included = canaries.n_included if canaries is not None else 0
        self.expected_batch_size = self.sample_rate * (
            self.n if planning_n is None else int(planning_n) + included
        )
        self.sample_streams = list(sample_streams)
        self.noise = noise
        self.k = model.k
        self.device = model.device
        strategy.bind(model, expected_batch_size=self.expected_batch_size, task=task)
        if strategy.private:
            self.grad_noise_multiplier = strategy.gradient_noise_multiplier(noise_multiplier)
        else:
            self.grad_noise_multiplier = torch.zeros(self.k, device=self.device)
        self.grad = torch.zeros(self.k, model.numel, device=self.device)
        self._extra_bufs: dict[str, Tensor] = {}

    @property
    def _chunked(self) -> bool:
        """Whether steps run through :mod:`workers.chunked_step` (chunks, or augmentation;
        never an audit's, whose canaries are placed in one piece)."""
        return self.canaries is None and (
            self.physical_batch_size is not None or self.augmenter is not None
        )

    def sample(self) -> tuple[Tensor, Tensor]:
        """Padded indices ``[K, B_max]`` and mask ``[K, B_max]`` (1.0 real, 0.0 padding)."""
        if self.k == 1:
            idx = poisson_sample(
                self.n, sample_rate=self.sample_rate, stream=self.sample_streams[0]
            ).unsqueeze(0)
            mask = torch.ones(1, idx.shape[1])
        else:
            idx, mask = poisson_sample_pack(
                self.n, sample_rate=self.sample_rate, streams=self.sample_streams
            )
        if self.device.type == "cpu":
            return idx, mask
        return idx.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True)

    def step(self) -> None:
        if self.units is not None:
            batch = self.units.sample(self.sample_rate, self.sample_streams, self.device)
            releases = unit_releases(self, batch)
        else:
            idx, mask = self.sample()
            releases = self._releases(idx, mask)
        # The optimizer uses the current learning rate; strategies then update their state
        # (C_t, lr_t) from the noised releases, for the next step (004 Algorithm 1, lines 12-15).
        self.optimizer.step(self.model.flat, releases["grad"], self.strategy.lr_scale())
        if self.strategy.private:
            self.strategy.observe(releases, self.noise)
        self.strategy.after_step(self.model.flat)
        # A read-ahead source (workers.noise_ahead) starts the next step's draws now.
        self.noise.step_done()

    def per_sample(
        self, xb: Tensor, target: Tensor, mask: Tensor
    ) -> tuple[list[Any], Tensor | None, StepContext]:
        """Per-layer gradient info, squared norms and the strategy's context for a batch.

        Strategies asking for an ascent (BAM) get the gradients at the perturbed points.
        Examples whose gradient norm (or loss, for strategies without norms) is not finite are
        removed: their mask and weight become 0 and their gradients are recomputed from a zero
        input, so no NaN reaches the weighted sums.
        """
        infos, sq, ctx, bad = self._per_sample_once(xb, target, mask)
        if bad is not None and bool(bad.any()):
            # A trial whose parameters are no longer finite (it diverged, from its noised
            # updates alone) has nothing to save; recomputing for it would only cost time.
            bad = bad & torch.isfinite(self.model.flat).all(dim=1, keepdim=True)
        if bad is not None and bool(bad.any()):
            keep = bad.logical_not()
            mask = mask * keep.to(mask.dtype)
            shape = (*keep.shape, *([1] * (xb.dim() - 2)))
            xb = torch.where(keep.view(shape), xb, torch.zeros((), dtype=xb.dtype))
            if self.y is None:  # reconstruction: the target is the input
                target = xb
            infos, sq, ctx, _ = self._per_sample_once(xb, target, mask)
        return infos, sq, ctx

    def _per_sample_once(
        self, xb: Tensor, target: Tensor, mask: Tensor
    ) -> tuple[list[Any], Tensor | None, StepContext, Tensor | None]:
        strategy = self.strategy
        infos, sq, loss = self._grads(xb, target, mask, None)
        ctx = StepContext(
            sq_norms=sq, mask=mask, expected_batch_size=self.expected_batch_size, noise=self.noise
        )
        scale = strategy.ascent_scale(ctx)
        first_bad = _non_finite(sq, loss, mask)
        if scale is not None:
            if first_bad is not None and bool(first_bad.any()):
                return infos, sq, ctx, first_bad  # remove them before the ascent
            infos, sq, loss = self._grads(xb, target, mask, (infos, scale * mask))
            ctx = StepContext(
                sq_norms=sq,
                mask=mask,
                expected_batch_size=self.expected_batch_size,
                noise=self.noise,
            )
            return infos, sq, ctx, _non_finite(sq, loss, mask)
        return infos, sq, ctx, first_bad

    def _grads(
        self,
        xb: Tensor,
        target: Tensor,
        mask: Tensor,
        perturb: tuple[list[Any], Tensor] | None,
    ) -> tuple[list[Any], Tensor | None, Tensor]:
        out, cap = self.model.forward(xb, capture=True, perturb=perturb)
        assert cap is not None
        loss = per_sample_loss(out, target, self.task)
        if self.k > 1 or self.canaries is not None or self._chunked or self.units is not None:
            # Masking the loss makes padded slots' gradients exactly zero, whatever weights
            # a strategy hands back for them. (A pack of one is never padded, but a canary's
            # slot is: its gradient is added by the canaries, not computed from an input; and
            # so are a unit's unused row slots, workers.units.)
            loss = loss * mask
        infos = self.model.layer_grads(loss.sum(), cap)
        sq = self.model.sq_norms(infos) if self.strategy.needs_norms else None
        return infos, sq, loss.detach()

    def _releases(self, idx: Tensor, mask: Tensor) -> dict[str, Tensor]:
        """One step's noised releases from the sampled examples ``idx`` (``mask``: sampled)."""
        if self._chunked:
            return chunked_releases(self, idx, mask)
        strategy = self.strategy
        idx, data_mask, slots, canary_ids = self._canary_slots(idx, mask)
        infos, sq, ctx = self._norms(idx, mask, data_mask)
        clip = strategy.clip(ctx)
        raw_norm: Tensor | None = None
        if self.canaries is not None:
            # The sensitivity check below sees the canaries' norms too (sq is updated).
            clip, sq, slots, raw_norm, mask = self._clip_with_canaries(
                clip, ctx, sq, slots=slots, canary_ids=canary_ids, mask=mask, data_mask=data_mask
            )
        if not strategy.private:
            # Non-private baseline: average over the realised batch (no noise, no guarantee).
            realised = mask.sum(dim=1, keepdim=True).clamp(min=1.0)
            self._weighted_sum(self.grad, infos, clip.weights / realised.unsqueeze(-1))
            return {"grad": self.grad}
        if sq is not None:
            _check_sensitivity("grad", sq, clip.weights, clip.sensitivity)
            for extra in clip.extra:
                _check_sensitivity(extra.name, sq, extra.weights, extra.sensitivity)
        for sc in clip.scalars:
            _check_scalar(sc.name, sc.values, sc.sensitivity)
        bufs, weights = self._clipped_sums(clip, infos)
        if self.canaries is not None and slots is not None and raw_norm is not None:
            for buf, w in zip(bufs, weights, strict=True):
                self.canaries.add_into(buf, w, slots, canary_ids, raw_norm)
        return self._noised(clip, bufs)

    def _canary_slots(
        self, idx: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        """The batch's canary slots (an audit only): ``idx`` with them read as example 0, the
        data's mask (canary slots at 0), the slots, and the canary of each slot."""
        can = self.canaries
        if can is None or can.n_included == 0 or idx.shape[1] == 0:
            return idx, mask, None, idx
        # Canary slots are read as example 0 with a zero mask (so a zero gradient); their
        # norms and contributions come from the canaries (_clip_with_canaries).
        slots = (idx >= self.n_data) & (mask > 0)
        data_mask = mask * slots.logical_not().to(mask.dtype)
        canary_ids = can.ids_in[(idx - self.n_data).clamp(min=0, max=can.n_included - 1)]
        idx = torch.where(slots, torch.zeros_like(idx), idx)
        return idx, data_mask, slots, canary_ids

    def _norms(
        self, idx: Tensor, mask: Tensor, data_mask: Tensor
    ) -> tuple[Any, Tensor | None, StepContext]:
        """The sampled examples' per-layer infos and squared norms, and the strategy's context."""
        if idx.shape[1] > 0:
            # One flat gather (index_select) is ~5x faster than advanced indexing by [K, B].
            flat_idx = idx.view(-1)
            xb = self.x.index_select(0, flat_idx).view(*idx.shape, *self.x.shape[1:])
            if self.k > 1 or self.canaries is not None or self._chunked:
                # Padding (and canary) slots read example 0: zeroed, so that one hostile
                # example 0 (an input whose loss is not finite) cannot put NaN into every
                # step's sums through slots whose weight is 0 (0 * NaN is NaN). A pack of
                # one in one piece has no such slot.
                unused = (data_mask <= 0).view(*data_mask.shape, *([1] * (xb.dim() - 2)))
                xb.masked_fill_(unused, 0)  # index_select's own copy
            target = xb
            if self.y is not None:
                target = self.y.index_select(0, flat_idx).view(*idx.shape, *self.y.shape[1:])
            if self.augmenter is not None:
                return augmented_per_sample(self, xb, target, data_mask)
            return self.per_sample(xb, target, data_mask)
        sq = None
        if self.strategy.needs_norms:
            sq = torch.zeros(self.k, 0, self.model.n_param_layers, device=self.device)
        ctx = StepContext(
            sq_norms=sq, mask=mask, expected_batch_size=self.expected_batch_size, noise=self.noise
        )
        return None, sq, ctx

    def _clip_with_canaries(
        self,
        clip: Any,
        ctx: StepContext,
        sq: Tensor | None,
        *,
        slots: Tensor | None,
        canary_ids: Tensor,
        mask: Tensor,
        data_mask: Tensor,
    ) -> tuple[Any, Tensor | None, Tensor | None, Tensor, Tensor]:
        """The strategy's weights with the sampled canaries as examples of the batch: the clip,
        the squared norms with the canaries', the slots (None when no canary was sampled),
        their raw norm and the batch's mask."""
        can = self.canaries
        assert can is not None  # only called in an audit
        raw_norm = can.choose_norm(
            self.strategy, StepContext, sensitivity=clip.sensitivity, ctx=ctx
        )
        if slots is None or sq is None or not bool(slots.any()):
            return clip, sq, None, raw_norm, mask
        sq = torch.where(slots.unsqueeze(-1), can.slot_norms(raw_norm, canary_ids), sq)
        # Canary slots count as sampled examples again (ctx.mask had them at 0).
        mask = data_mask + slots.to(mask.dtype)
        ctx = StepContext(
            sq_norms=sq, mask=mask, expected_batch_size=self.expected_batch_size, noise=self.noise
        )
        return self.strategy.clip(ctx), sq, slots, raw_norm, mask

    def _clipped_sums(
        self, clip: Any, infos: list[Any] | None
    ) -> tuple[list[Tensor], list[Tensor]]:
        """The weighted (clipped) sums of every release, over b, in their buffers; the weights."""
        b = self.expected_batch_size
        bufs = [self.grad]
        for extra in clip.extra:
            buf = self._extra_bufs.get(extra.name)
            if buf is None:
                buf = self._extra_bufs[extra.name] = torch.empty_like(self.grad)
            bufs.append(buf)
        weights = [clip.weights / b] + [e.weights / b for e in clip.extra]
        if infos is None:
            for buf in bufs:
                buf.zero_()
        elif self.k == 1 and len(clip.extra) == 1 and clip.extra[0].grad_coef is not None:
            self.model.split_sums_into(
                bufs[0], bufs[1], infos, weights[0], weights[1], clip.extra[0].grad_coef
            )
        else:
            self.model.weighted_sums_into(bufs, infos, weights)
        return bufs, weights

    def _noised(self, clip: Any, bufs: list[Tensor]) -> dict[str, Tensor]:
        """Every release with its noise: the gradient, the strategy's extra sums and scalars."""
        b = self.expected_batch_size
        releases = {"grad": self._add_noise(bufs[0], clip.sensitivity, self.grad_noise_multiplier)}
        can = self.canaries
        if can is not None:
            # The white-box adversary sees every noised gradient release (and, when it knows
            # every other record, what they are expected to contribute at these parameters).
            can.observe(
                releases["grad"],
                noise_std=self.grad_noise_multiplier * clip.sensitivity * _ENFORCED / b,
                expected_batch_size=b,
                predicted=self.expected_data_release() if can.knows_data else None,
            )
        for extra, buf in zip(clip.extra, bufs[1:], strict=True):
            releases[extra.name] = self._add_noise(buf, extra.sensitivity, extra.noise_multiplier)
        for sc in clip.scalars:
            xi = self.noise.standard_normal(1)
            total = sc.values.sum(dim=1, keepdim=True).to(torch.float64)
            add_snapped_noise(total, xi, sc.noise_multiplier * (sc.sensitivity * _ENFORCED))
            releases[sc.name] = (total[:, 0] / self.expected_batch_size).to(sc.values.dtype)
        return releases

    def expected_data_release(self, *, chunk: int = 1024) -> Tensor:
        """``q sum_i w_i g_i / b`` over every data record at the current parameters, ``[K, P]``.

        What the gradient release is expected to hold besides noise and canaries, for an
        audit's adversary who knows every other record (DP's threat model): only a public
        dataset's audit uses it, since it reads every record without noise.
        """
        out = torch.zeros_like(self.grad)
        part = torch.empty_like(self.grad)
        scale = self.sample_rate / self.expected_batch_size
        shares = None if self.units is None else data_row_shares(self.units.index, self.n_data)
        for a in range(0, self.n_data, chunk):
            x = self.x[a : a + chunk]
            c = int(x.shape[0])
            xk = x.unsqueeze(0).expand(self.k, *x.shape)
            tk = xk if self.y is None else self.y[a : a + c].unsqueeze(0).expand(self.k, c)
            mask = torch.ones(self.k, c, device=self.device)
            infos, _, ctx = self.per_sample(xk, tk, mask)
            weights = self.strategy.clip(ctx).weights
            if shares is not None:
                # A unit's expected contribution: its rows' clipped mean (exact for ``mean``;
                # a prediction for ``capped``, which the adversary may use as any other).
                weights = weights * shares[a : a + c].to(self.device).view(1, -1, 1)
            self.model.weighted_sum_into(part, infos, weights * scale)
            out += part
        return out

    def _weighted_sum(self, out: Tensor, infos: list[Any] | None, weights: Tensor) -> None:
        if infos is None:
            out.zero_()
        else:
            self.model.weighted_sum_into(out, infos, weights)

    def _add_noise(self, buf: Tensor, sensitivity: Tensor, multiplier: Tensor) -> Tensor:
        """Turn ``buf`` = ``sum_i w_i g_i / b`` into ``(sum_i w_i g_i + m S' xi) / b`` in place.

        The 1/b is folded into the ``[K, B]`` weights and the noise scale, so the ``[K, P]``
        buffer is touched once by the noise and never rescaled. ``S'`` is the sensitivity the
        engine enforces (``_SENSITIVITY_RTOL`` of :mod:`workers.release_checks` above the
        strategy's claim).
        """
        std = multiplier * (sensitivity * _ENFORCED) / self.expected_batch_size
        return self.noise.add_noise(buf, std)

    def diagnostics(
        self, x: Tensor, target: Tensor, generators: Sequence[torch.Generator]
    ) -> dict[str, Tensor]:
        """Clipping diagnostics on a batch of the *public* evaluation split, per trial ``[K]``.

        * ``frac_clipped``: share of examples whose gradient the strategy scaled down;
        * ``clip_bias``: ``||g_clip - g||`` with ``g`` the mean gradient and ``g_clip`` the mean
          of the strategy's weighted (clipped) gradients (003);
        * ``grad_cos``: ``cos(g_priv, g)`` with ``g_priv = g_clip + sigma_g S xi / b``, noise at
          the training step's scale (004).

        Nothing here touches the private training data, and its noise comes from
        ``generators`` (not the trials' training streams), so measuring changes no result.
        """
        m = x.shape[0]
        xk = x.unsqueeze(0).expand(self.k, *x.shape)
        tk = target.unsqueeze(0).expand(self.k, *target.shape)
        mask = torch.ones(self.k, m, device=self.device)
        infos, _, ctx = self.per_sample(xk, tk, mask)
        clip = self.strategy.clip(ctx)
        true_grad = torch.empty_like(self.grad)
        clipped = torch.empty_like(self.grad)
        # The unclipped mean gradient at theta. BAM's released gradients are taken at its
        # perturbed points, so for BAM the gradients at theta are computed separately.
        base_infos = infos if self.strategy.ascent_scale(ctx) is None else None
        if base_infos is None:
            base_infos, _, _ = self._grads(xk, tk, mask, None)
        self.model.weighted_sum_into(true_grad, base_infos, mask.unsqueeze(-1) / m)
        self.model.weighted_sum_into(clipped, infos, clip.weights / m)
        w = clip.weights
        frac = (w < 1.0 - 1e-6).any(dim=-1).double().mean(dim=1)
        bias = (clipped - true_grad).norm(dim=1)
        if self.strategy.private:
            xi = torch.stack(
                [torch.randn(clipped.shape[1], generator=g, device=self.device) for g in generators]
            )
            scale = self.grad_noise_multiplier * clip.sensitivity / self.expected_batch_size
            private = clipped + scale.unsqueeze(1) * xi
        else:
            private = clipped
        cos = torch.nn.functional.cosine_similarity(private, true_grad, dim=1)
        return {"frac_clipped": frac, "clip_bias": bias, "grad_cos": cos}


def _non_finite(sq_norms: Tensor | None, loss: Tensor, mask: Tensor) -> Tensor | None:
    """``[K, B]`` sampled examples whose gradient norm (or, without norms, loss) is not finite."""
    real = mask > 0
    if sq_norms is not None:
        return torch.isfinite(sq_norms).all(dim=-1).logical_not() & real
    return torch.isfinite(loss).logical_not() & real
