"""Lipschitz networks for clipless DP-SGD (002, Béthune et al., Algorithm 1).

A Lipschitz network has a per-sample gradient norm that can be bounded from its weights alone, so
DP-SGD needs no per-sample gradient norms and no clipping: the ``lipschitz`` strategy
(:mod:`workers.strategies.lipschitz`) releases the plain sum of per-sample gradients with noise
scaled to the bound computed here.

The building blocks (all parameter-free except ``nn.Linear``):

* :class:`InputBall` flattens each example and projects it onto the L2 ball of radius X:
  ``x <- x * min(1, X/||x||)``. Deterministic and per example, so it is fine under DP.
* ``nn.Linear`` layers whose spectral norm is kept <= 1 by a projection after every optimizer
  step (:meth:`LipschitzBound.project_`).
* :class:`GroupSort` with groups of two (MaxMin): each pair ``(a, b) -> (max, min)``. It permutes
  its input, so it is 1-Lipschitz, preserves the norm, and its Jacobian is a permutation.
* :class:`LogitScale` (optional): a fixed temperature ``tau`` on the logits.

The loss is softmax cross-entropy, whose gradient w.r.t. the logits is ``softmax(z) - onehot(y)``
with norm at most ``sqrt(2)``: ``||p - e_y||^2 = (1 - p_y)^2 + sum_{j != y} p_j^2 <=
2 (1 - p_y)^2 <= 2``.

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

Cost
----
Per step and layer: the Gram matrix (``2 r^2 n`` flops, r = min(m, n)), ~10 small
matrix-vector products, one small QR and one ``r x r`` Cholesky; the bound is within ~0.1-1 %
of the exact spectral norm. The alternatives measured on a 128x784 layer (one CPU thread): an
exact SVD norm takes ~4 ms; a Gram-iteration bound of comparable cost is up to
``r^(1/2^(k+1))`` loose (~4 % for six iterations when the singular values are equal).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from workers.errors import ConfigError
from workers.models import _flat_dim, register_model
from workers.packed import (
    Act,
    PackedLayer,
    PackedModel,
    PElementwise,
    PFlatten,
    PLinear,
    register_packed_layer,
)

#: Lipschitz constant of softmax cross-entropy w.r.t. the logits: ``||softmax(z) - e_y|| <= √2``.
CROSS_ENTROPY_LIPSCHITZ = math.sqrt(2.0)

#: Relative margin on the sensitivity for float32 rounding in the forward and backward passes
#: (the engine sums *computed* per-sample gradients, which differ from exact ones by ~1e-6).
FLOAT_MARGIN = 1e-3

_U64 = 2.0**-53  # unit roundoff of float64


def _unit_roundoff(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2.0


def _gamma(n: int, u: float) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: relative error bound of n rounded operations."""
    nu = n * u
    if nu >= 0.5:
        raise ValueError(f"{n} operations are too many for a rounding-error bound at u={u}")
    return nu / (1.0 - nu)


# --------------------------------------------------------------------------------------------
# Modules


def group_sort(x: Tensor) -> Tensor:
    """GroupSort with groups of two (MaxMin) on the last dimension: ``(a, b) -> (max, min)``.

    Implemented as a gather with a per-pair permutation, so the output is an exact permutation
    of the input (norm preserved bit for bit) and the backward pass applies the same
    permutation to the cotangent: the Jacobian is a permutation matrix, spectral norm 1. (Ties
    keep the original order, which is still a permutation.) A gather is about 3x faster
    forward+backward than ``torch.maximum``/``torch.minimum``, whose backward splits ties.
    """
    if x.shape[-1] % 2:
        raise ValueError(f"GroupSort needs an even number of features; got {x.shape[-1]}")
    pairs = x.unflatten(-1, (-1, 2))
    swap = pairs[..., 0] < pairs[..., 1]
    index = torch.stack((swap, ~swap), dim=-1).long()
    return torch.gather(pairs, -1, index).flatten(-2)


class GroupSort(nn.Module):
    """MaxMin activation (GroupSort, group size 2) on the feature (last) dimension."""

    def forward(self, x: Tensor) -> Tensor:
        return group_sort(x)


def safe_radius(radius: float, features: int, dtype: torch.dtype) -> float:
    """The radius :func:`project_to_ball` scales to, so that outputs provably have norm <= radius.

    With u the unit roundoff, the computed norm of a d-vector is ``n^ >= ||x|| sqrt(1 - gamma_d)
    (1 - u)`` (d rounded squares summed in any order, then a rounded square root); the radius
    R rounds to the tensor's dtype, the factor ``R / n^`` takes at most two roundings and each
    product one, so ``||output|| <= R (1 + u)^4 / ((1 - u) sqrt(1 - gamma_d))``; the same holds
    when the factor clamps to 1 (the example is then returned unchanged). That is at most
    ``radius`` for ``R = radius (1 - gamma_{d+8})`` (first order: ``(d/2 + 3) u`` to spare).
    The shrink is ~(d+8) u: 5e-5 for d = 784 in float32.
    """
    return radius * (1.0 - _gamma(features + 8, _unit_roundoff(dtype)))


def project_to_ball(x: Tensor, radius: float, batch_dims: int) -> Tensor:
    """Flatten each example (all dims after ``batch_dims``) and project it onto the L2 ball.

    ``x * min(1, R / ||x||)`` with R = :func:`safe_radius`; a zero example stays zero (R/0 = inf
    is clamped to 1), and an example so large that its norm overflows becomes zero (still in
    the ball). Returns ``[*batch, features]``.
    """
    flat = x.reshape(*x.shape[:batch_dims], -1)
    r = safe_radius(radius, flat.shape[-1], flat.dtype)
    norm = torch.linalg.vector_norm(flat, dim=-1, keepdim=True)
    return flat * torch.clamp(r / norm, max=1.0)


class InputBall(nn.Module):
    """Flattens each example and projects it onto the L2 ball of radius ``radius`` (X).

    This is what makes the input bound X of the sensitivity analysis hold for *any* finite
    input: a deterministic per-example transform, so it costs no privacy. Examples inside the
    ball pass unchanged (up to a relative shrink of ~(d+8)·2^-24 that absorbs float rounding).
    """

    def __init__(self, radius: float) -> None:
        super().__init__()
        if not (radius > 0 and math.isfinite(radius)):
            raise ConfigError(
                f"input_bound must be a positive finite number; got {radius!r}",
                field="model.options.input_bound",
            )
        self.radius = float(radius)

    def forward(self, x: Tensor) -> Tensor:
        return project_to_ball(x, self.radius, batch_dims=1)

    def extra_repr(self) -> str:
        return f"radius={self.radius}"


class LogitScale(nn.Module):
    """Multiplies its input by a fixed ``scale`` (a logit temperature). |scale|-Lipschitz."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        if not (scale > 0 and math.isfinite(scale)):
            raise ConfigError(
                f"temperature must be a positive finite number; got {scale!r}",
                field="model.options.temperature",
            )
        self.scale = float(scale)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale

    def extra_repr(self) -> str:
        return f"scale={self.scale}"


# --------------------------------------------------------------------------------------------
# Packed versions. Both act per example on the feature dimension, so they work on the packed
# [K, B, features] layout with the same code as the modules on [B, features].


class PGroupSort(PackedLayer):
    def __init__(self, m: GroupSort) -> None:
        pass

    def forward(self, x: Act) -> Act:
        return Act(group_sort(x.as_kb()), "kb", x.k)


class PInputBall(PackedLayer):
    def __init__(self, m: InputBall) -> None:
        self.radius = m.radius

    def forward(self, x: Act) -> Act:
        return Act(project_to_ball(x.as_kb(), self.radius, batch_dims=2), "kb", x.k)


register_packed_layer(GroupSort)(PGroupSort)
register_packed_layer(InputBall)(PInputBall)
register_packed_layer(LogitScale)(PElementwise)


# --------------------------------------------------------------------------------------------
# Guaranteed upper bounds on spectral norms


def gram_spectral_bound(w: Tensor, iters: int = 6) -> Tensor:
    """Guaranteed upper bound on ``||w[k]||_2`` for a batch ``[K, m, n]``, by Gram iteration.

    Delattre et al. (2023): ``G_0 = W``, ``G_{j+1} = G_j^T G_j``; then ``sigma_max(W) <=
    ||G_j||_F^(1/2^j)`` for every j (``||G_j||_F^2 = sum_i sigma_i^(2^(j+1))``), at most
    ``rank^(1/2^(j+1))`` times the true value. Each iterate is rescaled by its Frobenius norm
    to avoid overflow, and the log-scale is tracked: with ``f_j`` the norm divided out at step
    j, ``log bound = sum_j log(f_j) / 2^j``. Runs in float64 (relative rounding ~1e-13, which
    callers cover with their slack). Returns ``[K]`` float64.
    """
    g = w.to(torch.float64)
    if g.shape[-2] < g.shape[-1]:
        g = g.mT  # same singular values; G_1 = G_0^T G_0 is then the smaller Gram matrix
    log_bound = torch.zeros(g.shape[0], dtype=torch.float64, device=g.device)
    for j in range(iters + 1):
        f = torch.linalg.matrix_norm(g)  # Frobenius
        log_bound = log_bound + torch.log(f) / 2.0**j
        if j == iters:
            break
        g = g / f.clamp_min(1e-300)[:, None, None]
        g = g.mT @ g
    return torch.exp(log_bound)


def _float32_gram_is_ieee(device: torch.device) -> bool:
    """Whether a float32 ``W W^T`` here is plain IEEE float32 (so its error bound holds).

    TF32 / bf16 "fast float32" modes round far more coarsely; then (and on GPUs, where float64
    is cheap for these sizes) the Gram matrix is formed in float64 instead.
    """
    if device.type != "cpu" or torch.get_float32_matmul_precision() != "highest":
        return False
    for var in ("ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE"):
        if os.environ.get(var, "strict").lower() not in ("strict", "any"):
            return False
    for obj in (torch.backends, getattr(torch.backends.mkldnn, "matmul", None)):
        prec = getattr(obj, "fp32_precision", "none")
        if prec not in ("none", "ieee"):
            return False
    return True


class _Workspace:
    """Persistent buffers for certifying ``n`` Gram matrices of size ``r x r``.

    The large intermediates (Gram matrices, ``t I - A`` and its Cholesky factor) are allocated
    once and reused: on some systems (VMs) a fresh 256 KB buffer costs hundreds of microseconds
    in page faults per call, more than the arithmetic on it.
    """

    def __init__(self, n: int, r: int, device: torch.device) -> None:
        self.a = torch.empty(n, r, r, dtype=torch.float64, device=device)
        self.a32: Tensor | None = None  # allocated on first use of the float32 path
        self.m = torch.empty_like(self.a)
        self.chol = torch.empty_like(self.a)
        self.info = torch.empty(n, dtype=torch.int32, device=device)


def _gram_into(w: Tensor, out: Tensor, ws: _Workspace, offset: int) -> Tensor:
    """Write ``A = W W^T`` on W's smaller side into ``out`` (float64); return its error bound.

    Returns ``err`` ``[K]`` with ``||S - A_exact||_2 <= err`` for every matrix S whose entries
    are taken from A (either triangle, as a Cholesky factorisation reads one). Each entry is a
    dot product of length n, so ``|A - A_exact| <= gamma_n |W| |W|^T`` entrywise (Higham,
    Thm 3.5: any summation order, FMA or not), hence ``||S - A_exact||_2 <= ||.||_F <=
    gamma_n ||W||_F^2`` (Cauchy-Schwarz on each pair of rows), plus an allowance for underflow.
    ``||W||_F^2 = tr(A_exact) <= tr(A) / (1 - gamma_n)``, as the diagonal entries are sums of
    squares (no cancellation). In float32 this is ~n 2^-24 ||W||_F^2 (3e-3 relative for a
    128x784 layer whose singular values are all 1); in float64 it is negligible. The float32
    product is only used where float32 matmuls are plain IEEE (:func:`_float32_gram_is_ieee`).
    """
    k, m, n = w.shape
    wt = w if m <= n else w.mT  # [K, r, n'] with r <= n'
    r, inner = wt.shape[-2:]
    if w.dtype == torch.float32 and _float32_gram_is_ieee(w.device):
        if ws.a32 is None:
            ws.a32 = torch.empty(ws.a.shape, dtype=torch.float32, device=ws.a.device)
        a32 = ws.a32[offset : offset + k]
        torch.bmm(wt, wt.mT, out=a32)
        out.copy_(a32)
        u, tiny = 2.0**-24, 2.0**-126  # tiny: smallest normal, far above any underflow error
    else:
        w64 = wt.to(torch.float64)
        torch.bmm(w64, w64.mT, out=out)
        u, tiny = _U64, 2.0**-1022
    g = _gamma(inner, u)
    fro2 = out.diagonal(dim1=1, dim2=2).sum(-1) / (1.0 - g)
    # (1 + 1e-9) covers the float64 rounding of these few reductions.
    return (g * fro2 + 2.0 * r * inner * tiny) * (1.0 + 1e-9)


#: Relative gaps tried for the Cholesky certificate ``t = theta (1 + gap)``, smallest first.
CERTIFICATE_GAPS: tuple[float, ...] = (2e-3, 1e-2, 4e-2, 0.2, 1.0)


def _ritz_estimate(a: Tensor, v: Tensor | None, krylov_dim: int) -> tuple[Tensor, Tensor]:
    """Estimate ``lambda_max`` of each PSD matrix of ``a`` ``[N, r, r]`` (an *estimate* only).

    Rayleigh-Ritz on the Krylov space ``span{v, Av, ..., A^k v}`` (what k Lanczos steps give):
    a Ritz value never exceeds ``lambda_max`` and, unlike plain power iteration, converges fast
    even when the top of the spectrum is clustered, as it is for noisy DP weights (10 steps
    warm-started from the last call reach ~99.9 % of ``lambda_max`` on average there; four
    power iterations ~96 %). Small matrices are solved directly. Returns ``(theta [N], y)``,
    ``y`` ``[N, 1, r]`` the last (unit) Krylov vector, to warm-start the next call: across calls
    the warm starts accumulate power iterations towards the top eigenvector.
    """
    n, r, _ = a.shape
    if r <= 2 * (krylov_dim + 1):
        return torch.linalg.eigvalsh(a)[:, -1], a.new_empty(n, 1, 0)  # exact up to ~r u ||A||
    if v is None or v.shape != (n, 1, r):
        # The same start vector for every matrix, so a matrix's estimate (and through the
        # certificate's gap, a trial's sensitivity) never depends on which other trials share
        # its pack. Any start is sound: the Cholesky certificate decides, not the estimate.
        gen = torch.Generator(device="cpu").manual_seed(0)
        v = torch.randn(1, 1, r, generator=gen, dtype=a.dtype).to(a.device).expand(n, 1, r)
        v = v / torch.linalg.vector_norm(v, dim=2, keepdim=True)
        krylov_dim = min(3 * krylov_dim, r - 1)  # cold start: a larger space
    # Dividing by the trace keeps every eigenvalue <= 1, so the powers cannot overflow.
    scale = a.diagonal(dim1=1, dim2=2).sum(-1).clamp_min(1e-300).reciprocal()[:, None, None]
    rows = [v]
    for _ in range(krylov_dim):
        # Row vector times A (A is symmetric up to rounding, which an estimate may ignore):
        # the fastest small matrix-vector product here, and no [N, r, r] temporary.
        rows.append(torch.bmm(rows[-1], a) * scale)
    q, _ = torch.linalg.qr(torch.cat(rows, dim=1).mT)  # Householder: q is orthonormal
    theta = torch.linalg.eigvalsh(q.mT @ torch.bmm(a, q))[:, -1]
    last = rows[-1]
    norm = torch.linalg.vector_norm(last, dim=2, keepdim=True)
    # A zero matrix maps everything to 0: keep the old (unit) start vector then.
    return theta, torch.where(norm > 0, last / norm.clamp_min(1e-300), v)


def _factorises(a: Tensor, t: Tensor, idx: Tensor | None, ws: _Workspace) -> Tensor:
    """Whether float64 Cholesky of ``t I - a`` completes, for all matrices or those in idx."""
    cnt = a.shape[0] if idx is None else idx.numel()
    m = ws.m[:cnt]
    if idx is None:
        torch.neg(a, out=m)
    else:
        torch.index_select(a, 0, idx, out=m)
        m.neg_()
        t = t[idx]
    # -a_ij is exact; each diagonal entry t - a_ii is rounded once (accounted for below).
    m.diagonal(dim1=1, dim2=2).add_(t[:, None])
    torch.linalg.cholesky_ex(m, out=(ws.chol[:cnt], ws.info[:cnt]))
    return ws.info[:cnt] == 0


def certify_lambda_max(
    a: Tensor, v: Tensor | None = None, *, krylov_dim: int = 10, ws: _Workspace | None = None
) -> tuple[Tensor, Tensor]:
    """Guaranteed upper bound on ``lambda_max`` of each symmetric PSD matrix ``a`` ``[N, r, r]``.

    The bound is *proved* by a Cholesky factorisation of ``M = t I - a``: if it completes in
    float64, then ``M + dM = R^T R`` with ``|dM| <= gamma_{r+1} |R^T| |R|`` (Demmel 1989;
    Higham, Accuracy and Stability, Thm 10.3; any summation order or blocking), so
    ``||dM||_2 <= gamma_{r+1} ||R||_F^2 <= gamma_{r+1} tr(M) / (1 - gamma_{r+1})`` and
    ``lambda_max(a) <= t + c`` with ``c`` that (doubled for margin, ``tr(M) <= r t``), plus the
    rounding of the diagonal of ``t I - a`` (the approach of Rump 2006 for verifying positive
    definiteness). ``t = theta (1 + gap)`` with theta from :func:`_ritz_estimate`; matrices
    whose factorisation fails retry with the next gap of :data:`CERTIFICATE_GAPS`, and any left
    after the last fall back to :func:`gram_spectral_bound`. A matrix with a non-finite entry
    gets ``inf``.

    Returns:
        ``(bound [N] float64, y)``; pass ``y`` back next time as ``v``.
    """
    n, r, _ = a.shape
    if ws is None or ws.m.shape[0] < n:
        ws = _Workspace(n, r, a.device)
    # Any inf or NaN entry makes the sum non-finite (a reduction: no [N, r, r] temporary).
    finite = torch.isfinite(a.sum(dim=(1, 2)))
    if not bool(finite.all()):
        a = torch.where(finite[:, None, None], a, torch.zeros_like(a))
    theta, y = _ritz_estimate(a, v, krylov_dim)
    theta = theta.clamp_min(0.0)
    diag = a.diagonal(dim1=1, dim2=2)
    # An absolute floor keeps t > 0 for an (almost) zero matrix, whose estimate may be 0.
    floor = 1e-12 * diag.sum(-1) + 1e-300
    # A direct eigensolve (small r) is accurate to ~1e-14, so a tiny first gap already works.
    first_gap = 1e-6 if r <= 2 * (krylov_dim + 1) else CERTIFICATE_GAPS[0]
    t = theta * (1.0 + first_gap) + floor
    ok = _factorises(a, t, None, ws)
    todo = (~ok).nonzero().squeeze(1)
    for gap in CERTIFICATE_GAPS[1:]:
        if todo.numel() == 0:
            break
        # Retry only the matrices not yet certified, with a larger gap.
        t[todo] = theta[todo] * (1.0 + gap) + floor[todo]
        ok[todo] = _factorises(a, t, todo, ws)
        todo = (~ok).nonzero().squeeze(1)
    gam = _gamma(r + 1, _U64)
    bound = t + 2.0 * gam / (1.0 - gam) * r * t + _U64 * (t + diag.amax(-1))
    if todo.numel():
        # 1e-9 covers float64 rounding in the Gram iteration (~1e-13 relative).
        bound[todo] = gram_spectral_bound(a[todo], iters=10) * (1.0 + 1e-9)
    return torch.where(finite, bound, torch.full_like(bound, math.inf)), y


def certified_spectral_bound(
    w: Tensor, v: Tensor | None = None, *, krylov_dim: int = 10
) -> tuple[Tensor, Tensor]:
    """A guaranteed upper bound on ``||w[k]||_2`` for each matrix of ``w`` ``[K, m, n]``.

    ``||W||_2^2 = lambda_max(A_exact) <= lambda_max(A) + err`` with ``(A, err)`` from
    :func:`_gram_into` and ``lambda_max(A)`` certified by :func:`certify_lambda_max`. The
    result is within ~0.1-1 % of the exact value (the certificate gap, plus in float32 the
    Gram rounding term), where a Gram-iteration bound of similar cost can be ~4 % loose on flat
    spectra. Cost: forming A (``2 r^2 n`` flops), ~10 matrix-vector products, a small QR and one
    ``r^3 / 3`` Cholesky. Returns ``(bound [K] float64, v)``; pass ``v`` back next time.
    """
    k, m, n = w.shape
    ws = _Workspace(k, min(m, n), w.device)
    err = _gram_into(w, ws.a, ws, 0)
    lam, v = certify_lambda_max(ws.a, v, krylov_dim=krylov_dim, ws=ws)
    # 1e-9: the few float64 operations on these scalars (including the square root).
    return torch.sqrt(lam + err) * (1.0 + 1e-9), v


# --------------------------------------------------------------------------------------------
# The bound of a whole network


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


# --------------------------------------------------------------------------------------------
# The model


@register_model(
    "lip_mlp",
    task="classification",
    options=("hidden", "input_bound", "temperature"),
    description=(
        "1-Lipschitz MLP for clipless DP-SGD (002): input ball of radius X (default "
        "sqrt(features)), spectrally normalised linear layers (default 128-128), GroupSort"
    ),
)
def _lip_mlp(
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: Sequence[int] | int = (128, 128),
    input_bound: float | None = None,
    temperature: float = 1.0,
) -> nn.Sequential:
    """Flatten, InputBall(X), [Linear, GroupSort] per hidden width, Linear[, LogitScale(tau)].

    ``input_bound`` X defaults to ``sqrt(features)``: the largest norm of an image whose pixels
    are normalised to [0, 1] (so such data is never shrunk) and the typical norm of
    standardised tabular features. It depends only on the input *shape*, never on the data.
    Smaller X (or a larger ``temperature``) trades logit range against noise: S grows with X.
    Weights start orthogonal (every singular value 1: gradient norm preserving), biases zero.
    """
    sizes = [hidden] if isinstance(hidden, int | float) else list(hidden)
    if not all(isinstance(h, int | float) and h == int(h) and h >= 2 and h % 2 == 0 for h in sizes):
        raise ConfigError(
            "lip_mlp hidden sizes must be positive even integers (GroupSort pairs units); "
            f"got {hidden!r}",
            field="model.options.hidden",
        )
    sizes = [int(h) for h in sizes]
    d = _flat_dim(input_shape)
    x_bound = math.sqrt(d) if input_bound is None else _positive(input_bound, "input_bound")
    tau = _positive(temperature, "temperature")
    layers: list[nn.Module] = [nn.Flatten(), InputBall(x_bound)]
    for h in sizes:
        layers += [_orthogonal_linear(d, h), GroupSort()]
        d = h
    layers.append(_orthogonal_linear(d, num_classes))
    if tau != 1.0:
        layers.append(LogitScale(tau))
    return nn.Sequential(*layers)


def _positive(v: Any, name: str) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        f = math.nan
    if not (f > 0 and math.isfinite(f)):
        raise ConfigError(
            f"lip_mlp {name} must be a positive finite number; got {v!r}",
            field=f"model.options.{name}",
        )
    return f


def _orthogonal_linear(d_in: int, d_out: int) -> nn.Linear:
    lin = nn.Linear(d_in, d_out)
    with torch.no_grad():
        nn.init.orthogonal_(lin.weight)
        lin.bias.zero_()
    return lin
