"""Adaptive thresholds: quantile tracking (Andrew et al. 2021) and OSO-DPSGD (004).

Both release a second private query each step and split the planned noise multiplier sigma
between their two Gaussian releases so that, together, they cost exactly one Gaussian step of
multiplier sigma: ``sigma^-2 = sigma_g^-2 + sigma_2^-2`` (the joint release of 004,
Proposition 1, which follows McMahan et al. 2018). Their state moves only with noised releases.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from workers.count_noise import COUNT_NOISE_FRACTION, auto_count_noise
from workers.errors import ConfigError
from workers.strategies.base import (
    ClippingStrategy,
    ClipResult,
    ExtraRelease,
    HParam,
    NoiseSource,
    ScalarRelease,
    StepContext,
    register_strategy,
)

if TYPE_CHECKING:
    from workers.packed import PackedModel


def split_noise(noise_multiplier: Tensor, second: Tensor) -> Tensor:
    """``sigma_g = (sigma^-2 - second^-2)^(-1/2)``: what is left for the gradient."""
    return (noise_multiplier.pow(-2) - second.pow(-2)).pow(-0.5)


@register_strategy
class QuantileClipping(ClippingStrategy):
    """Adaptive C_t tracking the gamma-quantile of per-sample norms (Andrew et al. 2021).

    Each step releases a centred, noised count of unclipped examples,
    ``b~ = (sum_i (1[n_i <= C_t] - 1/2) + N(0, sigma_b^2)) / b + 1/2``, whose per-example
    contribution has magnitude 1/2 (sensitivity 1/2, so its noise multiplier is 2 sigma_b), and
    updates ``C_{t+1} = C_t exp(-eta_C (b~ - gamma))``. The gradient's noise multiplier is
    ``sigma_g = (sigma^-2 - (2 sigma_b)^-2)^(-1/2)``, which needs ``sigma < 2 sigma_b``.
    """

    name = "quantile"
    description = "adaptive threshold tracking a target quantile of the norms (Andrew 2021)"
    hyperparameters: ClassVar = {
        "target_quantile": HParam(default=0.5, help="gamma, the quantile C_t tracks"),
        "clip_init": HParam(default=0.1, help="C_0"),
        "clip_lr": HParam(default=0.2, help="eta_C, the step of the geometric update"),
        "count_noise": HParam(
            default=None,
            optional=True,
            help="sigma_b, std of the count's noise (default: b/20, raised where needed so the "
            "gradient gets at most 10 % more noise; workers.count_noise)",
        ),
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        gamma = self.tensor("target_quantile")
        if ((gamma <= 0) | (gamma >= 1)).any():
            raise ConfigError("target_quantile must be in (0, 1)", field="params.target_quantile")
        self.gamma = gamma
        self.clip_norm = self.tensor("clip_init")
        self.clip_lr = self.tensor("clip_lr")
        self.sigma_b: Tensor | None = None

    def bind(self, model: PackedModel, *, expected_batch_size: float, task: str) -> None:
        self._expected_batch_size = expected_batch_size
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
        # Trials that leave count_noise out get the planner's rule (the same function), now
        # that sigma is known: b/20, raised where the count would cost the gradient > 10 %.
        self.sigma_b = torch.tensor(
            [
                float(p["count_noise"])
                if p["count_noise"] is not None
                else auto_count_noise(
                    noise_multiplier=float(noise_multiplier[i]),
                    expected_batch_size=self._expected_batch_size,
                )
                for i, p in enumerate(self.params)
            ],
            device=self.device,
        )
        count_multiplier = 2.0 * self.sigma_b
        bad = noise_multiplier >= count_multiplier
        if bad.any():
            k = int(bad.nonzero()[0])
            sigma, sb = float(noise_multiplier[k]), float(self.sigma_b[k])
            raise ConfigError(
                f"quantile: the noise multiplier {sigma:.4g} is >= 2*sigma_b = {2 * sb:.4g}, so "
                "the quantile count would use the whole privacy budget and leave none for the "
                f"gradient; set count_noise (sigma_b) above {sigma / 2:.4g}, e.g. "
                f"{max(sigma, 2 * sb):.4g}, or use a larger batch (the default is b/20)",
                field="params.count_noise",
            )
        return split_noise(noise_multiplier, count_multiplier)

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

    name = "online"
    description = "OSO-DPSGD: online sign updates of C and the learning rate (004)"
    hyperparameters: ClassVar = {
        "clip_init": HParam(default=0.1, help="C_0"),
        "clip_lr": HParam(default=2.5e-3, help="rho_c"),
        "lr_lr": HParam(default=2.5e-3, help="rho_r"),
        "direction_noise_ratio": HParam(
            default=7.124, help="nu_q / nu (7.124 costs the gradient 1% more noise)"
        ),
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        ratio = self.tensor("direction_noise_ratio")
        if (ratio <= 1).any():
            raise ConfigError(
                "direction_noise_ratio must be > 1 (nu_q > nu leaves noise budget for the "
                "gradient)",
                field="params.direction_noise_ratio",
            )
        self.ratio = ratio
        self.clip_norm = self.tensor("clip_init")
        self.rho_c = self.tensor("clip_lr")
        self.rho_r = self.tensor("lr_lr")
        self.lr_factor = torch.ones(self.k, device=self.device)
        self.prev_grad: Tensor | None = None
        self.prev_dir: Tensor | None = None
        self.nu_q: Tensor | None = None

    def gradient_noise_multiplier(self, noise_multiplier: Tensor) -> Tensor:
        self.nu_q = self.ratio * noise_multiplier
        return split_noise(noise_multiplier, self.nu_q)

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
