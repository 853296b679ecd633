"""Adaptive thresholds: quantile tracking (Andrew et al. 2021) and OSO-DPSGD (004).

Both release a second private query each step and split the planned noise multiplier sigma
between their two Gaussian releases so that, together, they cost exactly one Gaussian step of
multiplier sigma: ``sigma^-2 = sigma_g^-2 + sigma_2^-2`` (the joint release of 004,
Proposition 1, which follows McMahan et al. 2018). Their state moves only with noised releases.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from workers.count_noise import COUNT_NOISE_FRACTION
from workers.strategies.base import (
    ClippingStrategy,
    ClipResult,
    ExtraRelease,
    NoiseSource,
    ScalarRelease,
    StepContext,
    register_strategy,
)
from workers.strategies.descriptors import ONLINE, QUANTILE, split_noise

if TYPE_CHECKING:
    from workers.packed import PackedModel


@register_strategy
class QuantileClipping(ClippingStrategy):
    """Adaptive C_t tracking the gamma-quantile of per-sample norms (Andrew et al. 2021).

    Each step releases a centred, noised count of unclipped examples,
    ``b~ = (sum_i (1[n_i <= C_t] - 1/2) + N(0, sigma_b^2)) / b + 1/2``, whose per-example
    contribution has magnitude 1/2 (sensitivity 1/2, so its noise multiplier is 2 sigma_b), and
    updates ``C_{t+1} = C_t exp(-eta_C (b~ - gamma))``. The gradient's noise multiplier is
    ``sigma_g = (sigma^-2 - (2 sigma_b)^-2)^(-1/2)``, which needs ``sigma < 2 sigma_b``.
    """

    descriptor = QUANTILE  # hyperparameters, their ranges and the noise split

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gamma = self.tensor("target_quantile")  # in (0, 1): the descriptor checks it
        self.clip_norm = self.tensor("clip_init")
        self.clip_lr = self.tensor("clip_lr")
        self.sigma_b: Tensor | None = None

    def bind(self, model: PackedModel, *, expected_batch_size: float, task: str) -> None:
        self.expected_batch_size = expected_batch_size
        # Until the split is known (gradient_noise_multiplier): b/20 where left out.
        self.sigma_b = torch.tensor(
            [
                float(p["count_noise"])
                if p["count_noise"] is not None
                else expected_batch_size * COUNT_NOISE_FRACTION
                for p in self.params
            ],
            device=self.device,
        )

    def gradient_noise_multiplier(self, noise_multiplier: Tensor) -> Tensor:
        assert self.sigma_b is not None, "bind() first"
        # The descriptor's split, the planner's too: trials that leave count_noise out get
        # workers.count_noise's rule, now that sigma is known (b/20, raised where the count
        # would cost the gradient > 10 %). Raises NoiseSplitInfeasible (a ConfigError on
        # params.count_noise) where the count would need the whole budget.
        splits = self.noise_splits(noise_multiplier=noise_multiplier)
        self.sigma_b = torch.tensor(
            [float(s.second) / 2.0 for s in splits if s.second is not None], device=self.device
        )
        return torch.tensor(
            [s.gradient for s in splits],
            device=noise_multiplier.device,
            dtype=noise_multiplier.dtype,
        )

    def clip(self, ctx: StepContext) -> ClipResult:
        assert ctx.sq_norms is not None and self.sigma_b is not None
        norms = ctx.sq_norms.sum(dim=-1).sqrt()
        c = self.clip_norm.unsqueeze(1)
        w = torch.clamp(c / norms, max=1.0) * ctx.mask
        unclipped = (norms <= c).to(norms.dtype)
        count = ScalarRelease(
            name="count",
            values=(unclipped - 0.5) * ctx.mask,  # centred: |value| = 1/2 per example
            sensitivity=torch.full_like(self.clip_norm, 0.5),
            noise_multiplier=2.0 * self.sigma_b,
        )
        return ClipResult(weights=w.unsqueeze(-1), sensitivity=self.clip_norm, scalars=(count,))

    def observe(self, releases: Mapping[str, Tensor], noise: NoiseSource) -> None:
        fraction_unclipped = releases["count"] + 0.5  # b~, a noised estimate
        self.clip_norm = self.clip_norm * torch.exp(
            -self.clip_lr * (fraction_unclipped - self.gamma)
        )

    def state(self) -> dict[str, Tensor]:
        return {"clip": self.clip_norm}


@register_strategy
class OnlineClipping(ClippingStrategy):
    """OSO-DPSGD (004, Algorithm 1): online sign updates of C_t and of the learning rate.

    Two releases per step from one set of norms: the clipped gradient
    ``g~_t = (sum_i g_i min(1, C_t/n_i) + N(0, (nu_g C_t)^2 I)) / b`` and the direction sum of
    the clipped examples ``q~_t = (sum_{n_i > C_t} g_i / n_i + N(0, nu_q^2 I)) / b`` (unit
    sensitivity; nu_q for its noise, as in eq. 17 and Proposition 1; the paper's line 13 writes
    nu_g by mistake). ``nu_q = ratio * nu`` and ``nu_g = (nu^-2 - nu_q^-2)^(-1/2)``. Then
    ``C_{t+1} = C_t exp(rho_c sign(g~_t . q~_{t-1}))`` and
    ``lr_{t+1} = lr_t exp(rho_r sign(g~_t . g~_{t-1}))``, with ``q~_0 = g~_0 = 0``.
    """

    descriptor = ONLINE  # hyperparameters, their ranges and the noise split

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ratio = self.tensor("direction_noise_ratio")  # > 1: the descriptor checks it
        self.clip_norm = self.tensor("clip_init")
        self.rho_c = self.tensor("clip_lr")
        self.rho_r = self.tensor("lr_lr")
        self.lr_factor = torch.ones(self.k, device=self.device)
        self.prev_grad: Tensor | None = None
        self.prev_dir: Tensor | None = None
        self.nu_q: Tensor | None = None

    def bind(self, model: PackedModel, *, expected_batch_size: float, task: str) -> None:
        self.expected_batch_size = expected_batch_size

    def gradient_noise_multiplier(self, noise_multiplier: Tensor) -> Tensor:
        # The descriptor's split (the planner's too): nu_q = ratio * nu, nu_g the rest.
        splits = self.noise_splits(noise_multiplier=noise_multiplier)
        self.nu_q = torch.tensor(
            [float(s.second) for s in splits if s.second is not None],
            device=noise_multiplier.device,
            dtype=noise_multiplier.dtype,
        )
        return torch.tensor(
            [s.gradient for s in splits],
            device=noise_multiplier.device,
            dtype=noise_multiplier.dtype,
        )

    def clip(self, ctx: StepContext) -> ClipResult:
        assert ctx.sq_norms is not None and self.nu_q is not None
        norms = ctx.sq_norms.sum(dim=-1).sqrt()
        c = self.clip_norm.unsqueeze(1)
        w = torch.clamp(c / norms, max=1.0) * ctx.mask
        # Unit directions of the examples that were clipped (from the same norms).
        u = torch.where(norms > c, 1.0 / norms, torch.zeros_like(norms)) * ctx.mask
        direction = ExtraRelease(
            name="direction",
            weights=u.unsqueeze(-1),
            sensitivity=torch.ones_like(self.clip_norm),
            noise_multiplier=self.nu_q,
            grad_coef=self.clip_norm,  # w_i = C_t / n_i = C_t * u_i on the clipped rows
        )
        return ClipResult(weights=w.unsqueeze(-1), sensitivity=self.clip_norm, extra=(direction,))

    def observe(self, releases: Mapping[str, Tensor], noise: NoiseSource) -> None:
        grad, direction = releases["grad"], releases["direction"]
        if self.prev_grad is not None and self.prev_dir is not None:
            sign_c = torch.sign(torch.linalg.vecdot(grad, self.prev_dir))
            sign_r = torch.sign(torch.linalg.vecdot(grad, self.prev_grad))
            self.clip_norm = self.clip_norm * torch.exp(self.rho_c * sign_c)
            self.lr_factor = self.lr_factor * torch.exp(self.rho_r * sign_r)
            self.prev_grad.copy_(grad)
            self.prev_dir.copy_(direction)
        else:  # q~_0 = g~_0 = 0: sign(0) = 0, no update on the first step
            self.prev_grad = grad.clone()
            self.prev_dir = direction.clone()

    def lr_scale(self) -> Tensor | None:
        return self.lr_factor

    def state(self) -> dict[str, Tensor]:
        return {"clip": self.clip_norm}


__all__ = ["OnlineClipping", "QuantileClipping", "split_noise"]
