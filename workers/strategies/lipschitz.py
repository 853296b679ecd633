"""Clipless DP-SGD on Lipschitz networks (002, Béthune et al.): no clipping, analytic sensitivity.

Every per-sample weight is 1 (the plain sum of per-sample gradients is released) and the
sensitivity S is a guaranteed upper bound on every per-sample gradient norm, propagated through
the layers from the *current* weights (002 Algorithm 1; see :mod:`workers.lipschitz` for the
bound and its soundness argument). The weights are projected into the spectral unit ball once
when the strategy is bound and after every optimizer step, which keeps S small; S never relies
on the projection having worked, since it is certified from the weights the gradients are taken
at.

Only models whose bound is known are accepted (``lip_mlp``, ``lip_cnn``, or any stack of the
known layers with an input ball first) and only softmax cross-entropy (``classification``);
anything else raises :class:`ConfigError` before training starts (fail closed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from dpsweep.errors import ConfigError
from workers.lipschitz.bound import LipschitzBound, round_up_float32
from workers.strategies.base import ClippingStrategy, ClipResult, StepContext, register_strategy
from workers.strategies.descriptors import LIPSCHITZ

if TYPE_CHECKING:
    from workers.packed import PackedModel


@register_strategy
class LipschitzStrategy(ClippingStrategy):
    """Weights ``w_i = 1``; sensitivity ``S = sqrt(sum_l G_l^2 (X_l^2 + [bias]))`` (002).

    The bound is computed once per step, in :meth:`after_step` right after the projection, and
    reused by the next :meth:`clip` when the parameters have not changed since (checked with
    the parameter buffer's version counter, which every in-place write bumps); otherwise
    :meth:`clip` certifies the current weights afresh.
    """

    descriptor = LIPSCHITZ
    # No clipping needs the norms, but measuring them (cheap ghost norms on linear layers) lets
    # the engine check every example against the analytic bound: a bound bug fails closed.
    needs_norms = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bound: LipschitzBound | None = None
        self._sensitivity = torch.zeros(self.k, device=self.device)
        self._key: tuple[int, int] | None = None

    def bind(self, model: PackedModel, *, expected_batch_size: float, task: str) -> None:
        if task != "classification":
            raise ConfigError(
                "the lipschitz strategy needs a Lipschitz model such as lip_mlp trained with "
                f"softmax cross-entropy (task 'classification'); got task {task!r}, whose "
                "loss has no known Lipschitz bound",
                field="strategy",
            )
        self.bound = LipschitzBound(model)  # raises ConfigError for non-Lipschitz models
        # Project before the first step so the constraint holds from step 0.
        self.after_step(model.flat)

    def _store(self, flat: Tensor, s64: Tensor) -> None:
        # Rounded *up* to the parameters' float32, so the noise scale never shrinks.
        self._sensitivity = round_up_float32(s64)
        self._key = (flat.data_ptr(), flat._version)

    def clip(self, ctx: StepContext) -> ClipResult:
        if self.bound is None:
            raise RuntimeError("LipschitzStrategy.clip before bind")
        flat = self.bound.model.flat
        if self._key != (flat.data_ptr(), flat._version):
            # The weights changed since the last bound: certify the ones in use now.
            self._store(flat, self.bound.sensitivity(flat))
        return ClipResult(weights=ctx.mask.unsqueeze(-1), sensitivity=self._sensitivity)

    def after_step(self, flat_params: Tensor) -> None:
        if self.bound is None:
            raise RuntimeError("LipschitzStrategy.after_step before bind")
        s = self.bound.project_(flat_params)
        self._store(flat_params, s)

    def state(self) -> dict[str, Tensor]:
        return {"sensitivity": self._sensitivity}
