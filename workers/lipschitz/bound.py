"""The certified per-sample gradient bound of a Lipschitz network, and its projection.

The bound (:func:`sensitivity_bound`)
-------------------------------------
Let layer l be ``z_l = W_l a_l + b_l`` (``a_l`` its input, ``z_l`` its output before the
activation), ``s_l`` a guaranteed upper bound on ``||W_l||_2``, ``X_l`` one on ``||a_l||`` and
``G_l`` one on ``||dL/dz_l||`` for a single example. That example's gradient of layer l is
``(g a^T, g)`` with ``g = dL/dz_l``, whose squared norm is ``||g||^2 (||a||^2 + 1)``, so

    ||grad_l||^2 <= G_l^2 (X_l^2 + [layer l has a bias])

Forward (norms of inputs): ``X_1 = X`` (the ball); ``X_{l+1} = s_l X_l + ||b_l||`` since
GroupSort preserves norms (a temperature multiplies by ``|tau|``; a ball caps at its radius).
Backward (norms of cotangents): ``G_last = tau sqrt(2)``; ``G_l = s_{l+1} G_{l+1}`` since
``dL/dz_l = J^T W_{l+1}^T dL/dz_{l+1}`` and GroupSort's Jacobian J is a permutation (norm 1).
The whole per-sample gradient then has norm at most

    S = sqrt(sum_l G_l^2 (X_l^2 + [bias_l]))

which is the sensitivity of the sum of per-sample gradients (as a clipping threshold C is).

Soundness
---------
Every quantity in S must be a *guaranteed upper bound*, including under floating point:

* ``s_l`` is certified (:func:`certified_spectral_bound`). A Krylov (Lanczos-type) Ritz value
  only *estimates* the top eigenvalue of ``A = W W^T`` from below, so it is never used alone:
  a Cholesky factorisation of ``t I - A`` slightly above the estimate *proves*
  ``lambda_max(A) <= t`` (Demmel's backward error bound for Cholesky, plus an explicit bound on
  the rounding error of forming A). If the proof fails at every tolerance, the Gram-iteration
  upper bound (:func:`gram_spectral_bound`) is used instead. Nothing assumes the projection
  worked: S is computed from the weights the gradients were taken at.
* bias norms are computed exactly (float64 accumulation); X is enforced by :class:`InputBall`
  for every finite input (the data loaders reject non-finite data), with its radius shrunk by
  the worst-case rounding of its own norm computation.
* the float32 forward/backward passes round too (observed relative error ~1e-6); S carries a
  relative margin :data:`FLOAT_MARGIN` = 1e-3 for that, and is rounded *up* to float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dpsweep.errors import ConfigError
from workers.lipschitz.layers import LogitScale, PGroupSort, PInputBall
from workers.lipschitz.rounding import _unit_roundoff
from workers.lipschitz.spectral import _gram_into, _Workspace, certify_lambda_max
from workers.packed.linear import PLinear
from workers.packed.model import PackedModel
from workers.packed.parameter_free import PElementwise, PFlatten

#: Lipschitz constant of softmax cross-entropy w.r.t. the logits: ``||softmax(z) - e_y|| <= √2``.
CROSS_ENTROPY_LIPSCHITZ = math.sqrt(2.0)

#: Relative margin on the sensitivity for float32 rounding in the forward and backward passes
#: (the engine sums *computed* per-sample gradients, which differ from exact ones by ~1e-6).
FLOAT_MARGIN = 1e-3


@dataclass(frozen=True)
class _Op:
    kind: str  # "ball" (cap X at radius), "scale" (multiply by factor), "linear"
    value: float = 0.0
    layer: int = -1  # index into model.param_layers for "linear"
    bias: bool = False


_NOT_LIPSCHITZ = (
    "the lipschitz strategy needs a Lipschitz model such as lip_mlp (an input ball, "
    "norm-constrained linear layers, GroupSort activations)"
)


def lipschitz_plan(model: PackedModel) -> list[_Op]:
    """Check that ``model`` is a network whose gradient bound is known; return its structure.

    Walks the *packed* layers (what actually runs). Known: Flatten/Identity (1-Lipschitz, norm
    preserving), :class:`InputBall`, :class:`GroupSort`, :class:`LogitScale` and ``nn.Linear``
    applied to flattened examples. Anything else, or a linear layer whose input norm is not
    bounded by a preceding input ball, fails closed.

    Raises:
        ConfigError: the model is not one whose per-sample gradient bound is known.
    """
    ops: list[_Op] = []
    bounded = False
    li = 0
    for ly in model.layers:
        if type(ly) is PInputBall:
            ops.append(_Op("ball", ly.radius))
            bounded = True
        elif (
            type(ly) is PFlatten
            or type(ly) is PGroupSort
            or (type(ly) is PElementwise and type(ly.m) is nn.Identity)
        ):
            pass
        elif type(ly) is PElementwise and type(ly.m) is LogitScale:
            ops.append(_Op("scale", abs(ly.m.scale)))
        elif type(ly) is PLinear:
            if not bounded:
                raise ConfigError(
                    f"{_NOT_LIPSCHITZ}; its linear layer {li} has no input bound (put an "
                    "InputBall before the first linear layer)",
                    field="model.name",
                )
            ops.append(_Op("linear", layer=li, bias=ly.bias))
            li += 1
        else:
            name = type(ly.m).__name__ if isinstance(ly, PElementwise) else type(ly).__name__
            raise ConfigError(
                f"{_NOT_LIPSCHITZ}; layer {name} has no known Lipschitz bound", field="model.name"
            )
    if li == 0 or li != model.n_param_layers:
        raise ConfigError(f"{_NOT_LIPSCHITZ}; this model has no linear layers", field="model.name")
    return ops


def sensitivity_bound(
    ops: Sequence[_Op], spectral: Sequence[Tensor], bias_norms: Sequence[Tensor], loss_lip: float
) -> Tensor:
    """``S = sqrt(sum_l G_l^2 (X_l^2 + [bias_l]))`` from per-layer bounds (module docstring).

    Args:
        ops: the network's structure from :func:`lipschitz_plan`.
        spectral: per linear layer, ``[K]`` guaranteed upper bounds on ``||W_l||_2``.
        bias_norms: per linear layer, ``[K]`` bias norms (zeros without a bias).
        loss_lip: a bound on ``||dL/d output||`` for one example (``sqrt(2)`` for softmax CE).

    Returns:
        ``[K]`` float64 upper bound on every per-sample gradient's norm.
    """
    x: Tensor | float = math.inf
    x_in: dict[int, Tensor | float] = {}
    for op in ops:
        if op.kind == "ball":
            x = min(x, op.value) if isinstance(x, float) else torch.clamp(x, max=op.value)
        elif op.kind == "scale":
            x = x * op.value
        else:
            x_in[op.layer] = x
            x = spectral[op.layer] * x + bias_norms[op.layer]
    g = torch.full_like(spectral[0], loss_lip)
    total = torch.zeros_like(g)
    for op in reversed(ops):
        if op.kind == "scale":
            g = g * op.value
        elif op.kind == "linear":
            xl = x_in[op.layer]
            total = total + g * g * (xl * xl + (1.0 if op.bias else 0.0))
            g = g * spectral[op.layer]
    return total.sqrt()


def round_up_float32(x: Tensor) -> Tensor:
    """``x`` (float64) as float32, rounded *up* so the result is still an upper bound."""
    y = x.to(torch.float32)
    return torch.where(y.to(torch.float64) < x, torch.nextafter(y, torch.full_like(y, math.inf)), y)


class LipschitzBound:
    """Certified sensitivity and spectral projection for a packed Lipschitz network.

    Layers whose Gram matrices have the same size are certified together as one batch (one
    Krylov estimate, one batched Cholesky), which matters on CPU where these small calls are
    dominated by per-call overhead.

    Args:
        model: a packed model that passes :func:`lipschitz_plan`.
        loss_lipschitz: bound on the per-example loss gradient w.r.t. the model output.
        krylov_dim: Krylov steps of the warm-started eigenvalue estimate.

    Raises:
        ConfigError: the model is not a known Lipschitz network.
    """

    def __init__(
        self,
        model: PackedModel,
        *,
        loss_lipschitz: float = CROSS_ENTROPY_LIPSCHITZ,
        krylov_dim: int = 10,
    ) -> None:
        self.model = model
        self.ops = lipschitz_plan(model)
        self.loss_lipschitz = loss_lipschitz
        self.krylov_dim = krylov_dim
        groups: dict[int, list[int]] = {}
        for li, ly in enumerate(model.param_layers):
            out_f, in_f = ly.param_shapes[0]
            groups.setdefault(min(out_f, in_f), []).append(li)
        self._groups = list(groups.values())
        self._vectors: list[Tensor | None] = [None] * len(self._groups)
        self._workspaces: list[_Workspace | None] = [None] * len(self._groups)
        #: Last computed per-layer spectral bounds (``[K]`` float64 each), for diagnostics.
        self.spectral: list[Tensor] = []

    def _weights(self, flat: Tensor, layer: int) -> tuple[Tensor, Tensor | None]:
        views = self.model.view_like(flat, layer)
        return views[0], (views[1] if len(views) > 1 else None)

    def spectral_bounds(self, flat: Tensor | None = None) -> list[Tensor]:
        """Certified ``[K]`` upper bounds on every linear layer's spectral norm (float64).

        Same as :func:`certified_spectral_bound` per layer, batched over layers of equal size.
        """
        flat = self.model.flat if flat is None else flat
        k = flat.shape[0]
        out: list[Tensor] = [flat.new_empty(0)] * self.model.n_param_layers
        for gi, group in enumerate(self._groups):
            ws = self._workspaces[gi]
            if ws is None or ws.a.device != flat.device or ws.a.shape[0] != k * len(group):
                w0 = self._weights(flat, group[0])[0]
                ws = self._workspaces[gi] = _Workspace(
                    k * len(group), min(w0.shape[-2:]), flat.device
                )
            errs = [
                _gram_into(self._weights(flat, li)[0], ws.a[j * k : (j + 1) * k], ws, j * k)
                for j, li in enumerate(group)
            ]
            lam, self._vectors[gi] = certify_lambda_max(
                ws.a, self._vectors[gi], krylov_dim=self.krylov_dim, ws=ws
            )
            for j, li in enumerate(group):
                # 1e-9: the few float64 operations on these scalars (and the square root).
                out[li] = torch.sqrt(lam[j * k : (j + 1) * k] + errs[j]) * (1.0 + 1e-9)
        return out

    def sensitivity(
        self, flat: Tensor | None = None, spectral: list[Tensor] | None = None
    ) -> Tensor:
        """``[K]`` float64 bound on every per-sample gradient norm at the weights ``flat``.

        Includes the relative :data:`FLOAT_MARGIN` for float32 rounding in the passes.
        """
        flat = self.model.flat if flat is None else flat
        if spectral is None:
            spectral = self.spectral_bounds(flat)
        self.spectral = spectral
        bias_norms = []
        for li in range(self.model.n_param_layers):
            _, b = self._weights(flat, li)
            if b is None:
                bias_norms.append(
                    torch.zeros(flat.shape[0], dtype=torch.float64, device=flat.device)
                )
            else:
                bias_norms.append(torch.linalg.vector_norm(b, dim=-1, dtype=torch.float64))
        s = sensitivity_bound(self.ops, spectral, bias_norms, self.loss_lipschitz)
        return s * (1.0 + FLOAT_MARGIN)

    def project_(self, flat: Tensor | None = None) -> Tensor:
        """Scale every linear layer into the spectral unit ball, in place; return the new S.

        ``W <- W / c`` with ``c = max(1, s (1 + rho))``, s the certified bound. Scaling by the
        rounded ``1/c`` and rounding each product gives ``W' = W/c + E`` with ``||E||_2 <=
        ||E||_F <= 2u ||W/c||_F <= 2u sqrt(r) ||W/c||_2``, so ``rho = 2u (1 + sqrt(r))``
        (u the dtype's unit roundoff, r the rank bound) guarantees ``||W'||_2 <= 1``, and the
        bound carried forward is ``min(1, s (1 + rho))``. A matrix with ``s (1 + rho) <= 1``
        is multiplied by exactly 1.0 and so left bit-for-bit unchanged.
        """
        flat = self.model.flat if flat is None else flat
        spectral = []
        for li, s in enumerate(self.spectral_bounds(flat)):
            w, _ = self._weights(flat, li)
            rho = 2.0 * _unit_roundoff(w.dtype) * (1.0 + math.sqrt(min(w.shape[-2:])))
            grown = s * (1.0 + rho)
            c = torch.clamp(grown, min=1.0)
            w.mul_((1.0 / c).to(w.dtype)[:, None, None])
            spectral.append(torch.clamp(grown, max=1.0))
        return self.sensitivity(flat, spectral)
