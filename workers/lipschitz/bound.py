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

Convolutions (``lip_cnn``)
--------------------------
A bias-free 2-D convolution with zero padding is ``z = M U(a)``: ``U`` (im2col) stacks, for
every output position p, the input patch ``u_p`` it reads (zeros outside the image), and ``M``
is the kernel reshaped to ``[out, in * kh * kw]``. Along each axis an input pixel lies in at
most ``ceil(k / (s / gcd(s, d)))`` patches (kernel k, stride s, dilation d: each tap index j
hits it from at most one position, and the j that can are congruent modulo ``s / gcd(s, d)``;
within one patch the taps are distinct pixels), so ``||U(a)||^2 = sum_p ||u_p||^2
<= A^2 ||a||^2`` with ``A^2`` the product of the two counts. ``U`` is linear, so it is
A-Lipschitz and ``||U^T|| = ||U|| <= A``. The layer's weight gradient is ``g U(a)^T``
(``g = dL/dz`` as ``[out, positions]``), of Frobenius norm ``<= ||g||_F ||U(a)||_F <= G A X``.
So a convolution is exactly a linear layer ``M`` applied after a fixed map of norm ``<= A``:
the bound above holds with a ``scale`` step of factor A before it (forward ``X -> A X``,
backward ``G -> A G``), and ``s_l`` is the certified spectral bound of the matrix M. A
convolution bias would add ``sqrt(positions) ||b||`` forward and a ``sqrt(positions)`` factor to
its gradient; convolutions with a bias, groups, or other padding modes are refused (fail
closed). The projection keeps ``||M|| <= 1 / A`` so that every convolution is 1-Lipschitz.

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
from workers.lipschitz.layers import (
    LogitScale,
    PChannelGroupSort,
    PGroupSort,
    PImageBall,
    PInputBall,
)
from workers.lipschitz.rounding import _unit_roundoff
from workers.lipschitz.spectral import _gram_into, _Workspace, certify_lambda_max
from workers.packed.conv import PConv2d
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
    # ball: radius; scale: factor; linear: the im2col bound A of a convolution (1 otherwise)
    value: float = 0.0
    layer: int = -1  # index into model.param_layers for "linear"
    bias: bool = False


_NOT_LIPSCHITZ = (
    "the lipschitz strategy needs a Lipschitz model such as lip_mlp or lip_cnn (an input "
    "ball, norm-constrained linear layers or bias-free convolutions, GroupSort activations)"
)


def conv_amplification(
    kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]
) -> float:
    """``A``: a bound on the norm of a convolution's im2col map (module docstring).

    Along each axis a pixel lies in at most ``ceil(k / (s / gcd(s, d)))`` patches; ``A`` is the
    square root of the product over the axes (3 for a 3x3 stride-1 kernel, 1 for 2x2 stride 2).
    """
    count = 1
    for k, st, d in zip(kernel, stride, dilation, strict=True):
        period = st // math.gcd(st, d)
        count *= min(k, -(-k // period))
    return math.sqrt(count)


def lipschitz_plan(model: PackedModel) -> list[_Op]:
    """Check that ``model`` is a network whose gradient bound is known; return its structure.

    Walks the *packed* layers (what actually runs). Known: Flatten/Identity (1-Lipschitz, norm
    preserving), :class:`InputBall` / :class:`ImageBall`, :class:`GroupSort` /
    :class:`ChannelGroupSort`, :class:`LogitScale`, ``nn.Linear`` and bias-free ``nn.Conv2d``
    (zero padding, one group; a ``scale`` by its im2col bound A, then its matrix). Anything
    else, or a layer whose input norm is not bounded by a preceding input ball, fails closed.

    Raises:
        ConfigError: the model is not one whose per-sample gradient bound is known.
    """
    ops: list[_Op] = []
    bounded = False
    li = 0
    for ly in model.layers:
        if type(ly) is PInputBall or type(ly) is PImageBall:
            ops.append(_Op("ball", ly.radius))
            bounded = True
        elif (
            type(ly) is PFlatten
            or type(ly) is PGroupSort
            or type(ly) is PChannelGroupSort
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
            ops.append(_Op("linear", value=1.0, layer=li, bias=ly.bias))
            li += 1
        elif type(ly) is PConv2d:
            if not bounded:
                raise ConfigError(
                    f"{_NOT_LIPSCHITZ}; its convolution {li} has no input bound (put an "
                    "ImageBall before the first layer)",
                    field="model.name",
                )
            if ly.bias:
                raise ConfigError(
                    f"{_NOT_LIPSCHITZ}; its convolution {li} has a bias (use bias=False)",
                    field="model.name",
                )
            # PConv2d itself refuses groups and padding modes other than zeros.
            amp = conv_amplification(ly.kernel, ly.stride, ly.dilation)
            if amp != 1.0:
                ops.append(_Op("scale", amp))
            ops.append(_Op("linear", layer=li, bias=False, value=amp))
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
        #: Per layer, the bound A on its im2col map (1 for a linear layer); projection keeps
        #: ``||W|| <= 1 / A`` so that every layer is 1-Lipschitz.
        self.amplification = [1.0] * model.n_param_layers
        for op in self.ops:
            if op.kind == "linear":
                self.amplification[op.layer] = op.value
        groups: dict[int, list[int]] = {}
        for li, ly in enumerate(model.param_layers):
            out_f, *rest = ly.param_shapes[0]
            groups.setdefault(min(out_f, math.prod(rest)), []).append(li)
        self._groups = list(groups.values())
        self._vectors: list[Tensor | None] = [None] * len(self._groups)
        self._workspaces: list[_Workspace | None] = [None] * len(self._groups)
        #: Last computed per-layer spectral bounds (``[K]`` float64 each), for diagnostics.
        self.spectral: list[Tensor] = []

    def _weights(self, flat: Tensor, layer: int) -> tuple[Tensor, Tensor | None]:
        """The layer's weight as a ``[K, out, in]`` matrix view (a kernel reshaped) and bias."""
        views = self.model.view_like(flat, layer)
        w = views[0]
        return w.view(*w.shape[:2], -1), (views[1] if len(views) > 1 else None)

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

        ``W <- W / c`` with ``c = max(1, s (1 + rho))``, s the certified bound (for a convolution
        ``c = max(1, A s (1 + rho))``: its matrix into the ball of radius ``1 / A``). Scaling by the
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
            amp = self.amplification[li]
            c = torch.clamp(grown * amp, min=1.0)
            w.mul_((1.0 / c).to(w.dtype)[:, None, None])
            # Where c > 1, ||W'|| <= grown / c = 1 / A (1e-12: float64 rounding of c and 1 / A);
            # where c = 1, W is unchanged and its bound stays s <= grown.
            limit = 1.0 if amp == 1.0 else (1.0 / amp) * (1.0 + 1e-12)
            spectral.append(torch.clamp(grown, max=limit))
        return self.sensitivity(flat, spectral)
