"""Randomness that protects privacy: secret per-trial streams and floating-point-safe noise.

Every DP guarantee dpsweep reports assumes that each trial's Poisson batches and Gaussian noise
are fresh, independent and unknown to whoever reads the outputs. Three rules follow.

* **A fresh secret per trial.** :meth:`TrialRandomness.secret` draws 256 bits from the OS
  CSPRNG (``secrets``) when the trial starts, inside the worker task. The secret keys AES-256 in
  counter mode (a NIST CTR-DRBG-style generator): one keystream for Poisson sampling, one for
  noise, under distinct counter prefixes so they never overlap. The secret is never stored,
  logged, returned, or pickled (these objects refuse to be pickled, so they cannot end up in a
  Ray object by accident); a trial that is re-run after a crash draws a new one.
  Public seeds drive only what may be public: initial weights, the evaluation split and the
  order of work.
* **Reproducible mode is opt-in and labelled.** :meth:`TrialRandomness.reproducible` derives
  the key from the public seed (SHA-256), so the same seed gives the same batches and noise.
  Such a trial is *not private against anyone who knows the seed*; every result of it says so.
* **Floating-point-safe Gaussian noise** (against Mironov 2012's attack on floating-point noise,
  and Holohan & Braghin 2021's on Gaussian samplers). Textbook samplers produce values whose
  low-order bits, after ``x + noise`` is rounded to float, reveal ``x``: the set of reachable
  outputs depends on the private value. Two defences, both needed:

  1. A high-resolution sampler: Marsaglia's polar method in float64 from 52-bit uniforms, so the
     sampled distribution's CDF is within ~1e-15 of the Gaussian's and its tail reaches ~11.4
     standard deviations (torch's own float32 ``randn`` on CPU draws 24-bit uniforms and never
     exceeds 5.8 standard deviations: a truncated Gaussian has unbounded privacy loss in its
     tails). Its seed is also cut to 32 bits (``manual_seed(s)`` equals ``manual_seed(s + 2**32)``).
  2. Snapping: the noised value ``x + std * z`` is computed in float64 and rounded to a grid of
     ``2**-GRID_BITS`` standard deviations (a power of two, so the arithmetic is exact), before
     the cast to float32. Rounding *after* adding the noise is post-processing of the Gaussian
     mechanism, so it costs no privacy and needs no larger sensitivity; the output lies on a
     grid that does not depend on ``x``, and each grid cell holds ~2**40 sampler values, so the
     sampler's fine structure cannot show through. The grid's quantisation error (``2**-12``
     standard deviations at most) is far below the noise.

:func:`add_snapped_noise` is the one place where private sums meet their noise.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, NoReturn

import numpy as np

from workers.polar import Workspace, jit_kernels, polar_rows, polar_snap_rows

if TYPE_CHECKING:
    import torch
    from torch import Tensor

# torch and cryptography are imported where they are used, so that the torch-free layers
# (sweeper, api) can import the mode names and labels below.

Randomness = Literal["secret", "reproducible"]
RANDOMNESS_MODES: tuple[Randomness, ...] = ("secret", "reproducible")

# What a reproducible result carries wherever it is shown.
REPRODUCIBLE_WARNING = (
    "reproducible mode: noise and sampling come from the public seed; not private against "
    "anyone who knows the seed"
)

KEY_BYTES = 32  # AES-256
# Snapping grid: 2**-GRID_BITS of the noise's standard deviation (rounded down to a power of 2).
GRID_BITS = 12
_STREAMS = {"sample": 1, "noise": 2, "evaluation": 3}
_REPRODUCIBLE_DOMAIN = b"dpsweep/reproducible/v1\x00"


def _draw_secret() -> bytes:
    """256 bits from the OS CSPRNG (``getrandom``)."""
    return secrets.token_bytes(KEY_BYTES)


def _never_pickled(what: str) -> NoReturn:
    raise TypeError(
        f"{what} holds a trial's secret randomness and never leaves the task that drew it"
    )


class RandomStream:
    """A stream of random numbers: the AES-256-CTR keystream of one key and stream id.

    Draws are consumed in order, so a trial's numbers depend only on its key and on the
    sequence of requests its own computation makes, never on which other trials share a pack.
    """

    def __init__(self, key: bytes, stream: int) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a stream key has {KEY_BYTES} bytes")
        # Counter block: the stream id in the high 8 bytes, a 64-bit block counter below it, so
        # the streams of one key never overlap (2**64 blocks each).
        nonce = int(stream).to_bytes(8, "big") + bytes(8)
        # deferred: cryptography is heavy, and the torch-free layers import this module
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        self._enc = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor()
        self._zeros = bytearray(0)
        self._out = np.empty(0, dtype=np.int64)
        self._ws = Workspace()
        # Keystream words read ahead and handed back unused (:meth:`unread`): they come next.
        self._pending: np.ndarray | None = None

    def __reduce__(self) -> NoReturn:
        _never_pickled("a RandomStream")

    def __repr__(self) -> str:
        return "RandomStream(<secret>)"

    def words_into(self, out: np.ndarray, n: int) -> None:
        """Write the next ``n`` keystream words into ``out[:n]`` (uint64 or int64, C-contiguous).

        ``out`` should hold two words more than ``n``: room for a cipher block more than the
        input, as ``update_into`` documents for ciphers (CTR writes exactly ``n`` words).
        """
        if out.nbytes < 8 * n or not out.flags.c_contiguous:
            raise ValueError("words_into needs a C-contiguous buffer of at least n words")
        done = 0
        if self._pending is not None:
            done = min(n, len(self._pending))
            out.reshape(-1).view(np.uint64)[:done] = self._pending[:done]
            rest = self._pending[done:]
            self._pending = rest if len(rest) else None
            if done == n:
                return
        size = 8 * (n - done)
        if len(self._zeros) < size:
            self._zeros = bytearray(size)
        self._enc.update_into(memoryview(self._zeros)[:size], out.data.cast("B")[8 * done :])

    def unread(self, words: Sequence[np.ndarray]) -> None:
        """Hand back keystream words read but not used, in stream order: they are read next.

        ``words`` must be exactly the words this stream gave out last, in order (a read-ahead
        that was not needed); the stream then continues as if they had never been read.
        """
        parts = [np.array(w, dtype=np.uint64).reshape(-1) for w in words]
        if self._pending is not None:
            parts.append(self._pending)
        joined = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)
        self._pending = joined if len(joined) else None

    def words(self, n: int) -> np.ndarray:
        """``n`` uniformly random 64-bit words, as ``int64``.

        The array is a view of a buffer that the next call overwrites: use it at once.
        """
        if len(self._out) < n + 2:
            self._out = np.empty(n + 2, dtype=np.int64)
        self.words_into(self._out, n)
        return self._out[:n]

    def uniform(self, n: int) -> np.ndarray:
        """``n`` float64 uniforms on the open interval (0, 1), with 52 random bits each."""
        return uniform_from_words(self.words(n))

    def geometric(self, n: int, p: float) -> np.ndarray:
        """``n`` draws of Geometric(p) on {1, 2, ...} (gaps between Bernoulli(p) successes)."""
        return geometric_from_words(self.words(n), p)

    def standard_normal(self, n: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """``n`` float64 standard normal draws (Marsaglia's polar method), into ``out`` if given.

        Uniforms on (-1, 1) have 51 random bits, are symmetric, exact in float64 and never 0,
        so the tail reaches ~11.4 standard deviations (the mass beyond is ~1e-29). The
        arithmetic is :func:`workers.polar.polar_rows` with one row.
        """
        if out is None:
            out = np.empty(n, dtype=np.float64)
        polar_rows([self], n, out[:n].reshape(1, n), self._ws)
        return out


def uniform_from_words(words: np.ndarray) -> np.ndarray:
    """Uniforms on (0, 1) from int64 keystream words (any shape): ``(j + 1/2) 2**-52`` for the
    top 52 bits ``j`` of each word, exact in float64, never 0 or 1."""
    return ((words >> 12).astype(np.float64) + (2.0**51 + 0.5)) * 2.0**-52


def geometric_from_words(words: np.ndarray, p: float) -> np.ndarray:
    """Geometric(p) draws on {1, 2, ...} from int64 keystream words (any shape), one per word:
    P(gap > k) = P(u <= (1-p)^k) = (1-p)^k."""
    return np.floor(np.log(uniform_from_words(words)) / math.log1p(-p)).astype(np.int64) + 1


class TrialRandomness:
    """One trial's private randomness: Poisson sampling, gradient noise, evaluation noise.

    Build it with :meth:`secret` (the default everywhere) or :meth:`reproducible`.
    """

    def __init__(self, key: bytes, mode: Randomness) -> None:
        self.mode: Randomness = mode
        self.sample = RandomStream(key, _STREAMS["sample"])
        self.noise = RandomStream(key, _STREAMS["noise"])
        # DP evaluation's count noise (eval mode dp): its own keystream, never overlapping.
        self.evaluation = RandomStream(key, _STREAMS["evaluation"])
        # The key itself is not kept: only the two ciphers hold it.

    @classmethod
    def secret(cls) -> TrialRandomness:
        """Fresh randomness from a new 256-bit OS secret (private against everyone)."""
        return cls(_draw_secret(), "secret")

    @classmethod
    def reproducible(cls, seed: int) -> TrialRandomness:
        """Randomness derived from a public seed: same seed, same draws. Not private against
        anyone who knows the seed."""
        key = hashlib.sha256(_REPRODUCIBLE_DOMAIN + int(seed).to_bytes(16, "big", signed=True))
        return cls(key.digest(), "reproducible")

    @classmethod
    def for_mode(cls, mode: str, *, seed: int) -> TrialRandomness:
        if mode == "secret":
            return cls.secret()
        if mode == "reproducible":
            return cls.reproducible(seed)
        raise ValueError(f"unknown randomness mode {mode!r}; choose one of {RANDOMNESS_MODES}")

    def __reduce__(self) -> NoReturn:
        _never_pickled("a TrialRandomness")

    def __repr__(self) -> str:
        return f"TrialRandomness({self.mode}, <secret>)"


class NoiseSource:
    """Standard normal draws for the K trials of a pack, row k from trial k's own stream."""

    def __init__(self, streams: Sequence[RandomStream], device: torch.device | str) -> None:
        import torch  # deferred: the torch-free layers import this module (note above)

        self.streams = list(streams)
        self.device = torch.device(device)
        self._buf = np.empty((len(self.streams), 0))
        self._ws = Workspace()

    def __reduce__(self) -> NoReturn:
        _never_pickled("a NoiseSource")

    def standard_normal(self, n: int) -> Tensor:
        """``[K, n]`` float64 standard normal draws on the pack's device.

        On CPU the tensor is a view of a buffer that the next call overwrites: use it at once.
        """
        if self._buf.shape[1] < n:
            self._buf = np.empty((len(self.streams), n))
        z = self._buf[:, :n]
        # One vectorised sampler call for the whole pack; row k is exactly what stream k alone
        # gives (its own words, its own acceptances).
        polar_rows(self.streams, n, z, self._ws)
        return self._tensor(z)

    def add_noise(self, buf: Tensor, std: Tensor) -> Tensor:
        """``buf[k] <- snap_k(buf[k] + std[k] z[k])`` in place, with ``z`` this source's next
        ``[K, P]`` draws; returns ``buf``.

        The same values as ``add_snapped_noise(buf, self.standard_normal(P), std)``, bit for
        bit, and the streams advance alike. On CPU with the compiled kernels, each draw is
        added, snapped and cast where it is made, so the ``[K, P]`` draws are never stored
        (:func:`workers.polar.polar_snap_rows`).
        """
        import torch  # deferred: the torch-free layers import this module (note above)

        jit = jit_kernels()
        k = len(self.streams)
        if (
            jit is None
            or buf.device.type != "cpu"
            or buf.dim() != 2
            or buf.shape[0] != k
            or buf.shape[1] == 0
            or buf.requires_grad
            or not buf.is_contiguous()
            or buf.dtype not in (torch.float32, torch.float64)
            or std.numel() not in (1, k)
        ):
            return add_snapped_noise(buf, self.standard_normal(buf.shape[1]), std)
        stds = std.detach().reshape(-1).to("cpu", torch.float64).tolist()
        if len(stds) == 1:
            stds = stds * k
        grids = [_snap_grid_scalar(s) for s in stds]
        scale = np.array([s / g for s, g in zip(stds, grids, strict=True)], dtype=np.float64)
        inv_grid = np.array([1.0 / g for g in grids], dtype=np.float64)
        grid = np.array(grids, dtype=np.float64)
        polar_snap_rows(
            jit, self.streams, buf.shape[1], buf.numpy(), scale, inv_grid, grid, self._ws
        )
        return buf

    def _tensor(self, z: np.ndarray) -> Tensor:
        import torch  # deferred: the torch-free layers import this module (note above)

        t = torch.from_numpy(z)
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)

    def step_done(self) -> None:
        """The engine's step is over (a hook for :class:`workers.noise_ahead.NoiseAhead`)."""

    def close(self) -> None:
        """Release what the source holds besides the streams (nothing here)."""


def snap_grid(std: Tensor) -> Tensor:
    """The snapping grid of each noise scale: the power of two just below ``std * 2**-GRID_BITS``.

    Computed exactly from the binary exponent (``std = m 2**e`` with ``m`` in [0.5, 1), so the
    grid is ``2**(e - 1 - GRID_BITS)``). Scales that are zero or not finite (a diverged trial's
    noised state) get a grid of 1; their releases are not finite anyway.
    """
    import torch  # deferred: the torch-free layers import this module (note above)

    ok = torch.isfinite(std) & (std > 0)
    _, e = torch.frexp(torch.where(ok, std, torch.ones_like(std)))
    return torch.where(ok, torch.ldexp(torch.ones_like(std), e - (1 + GRID_BITS)), 1.0)


def _snap_grid_scalar(std: float) -> float:
    """:func:`snap_grid` of one scale, in Python floats (the same value, exactly)."""
    if not (math.isfinite(std) and std > 0):
        return 1.0
    return math.ldexp(1.0, math.frexp(std)[1] - (1 + GRID_BITS))


def add_snapped_noise(buf: Tensor, z: Tensor, std: Tensor) -> Tensor:
    """``buf[k] <- snap_k(buf[k] + std[k] * z[k])`` in place, computed in float64.

    Args:
        buf: ``[K, P]`` private sums (any float dtype); overwritten with the noised release.
        z: ``[K, P]`` float64 standard normal draws from the trials' own noise streams; used
            as the work buffer (overwritten).
        std: ``[K]`` noise standard deviations (public: multiplier x sensitivity / b).

    Returns:
        ``buf``.
    """
    import torch  # deferred: the torch-free layers import this module (note above)

    # The value is round((buf + std z) / grid) * grid, in four passes over [K, P]: with the
    # grid g a power of two, (std / g) z = (std z) / g and buf / g are exact scalings (which
    # commute with rounding), so (std / g) z + buf / g, rounded once, is exactly
    # (std z + buf) / g; dividing by g and multiplying back are exact. Rounding after the
    # noise is added is post-processing: no privacy cost, no extra sensitivity.
    if std.numel() == 1 and std.device.type == "cpu":
        # A pack of one: scalars instead of [K, 1] tensors (a dozen small kernels fewer).
        s = float(std.reshape(()).to(torch.float64))
        g = _snap_grid_scalar(s)
        z.mul_(s / g).add_(buf, alpha=1.0 / g).round_()
        torch.mul(z, g, out=buf)
        return buf
    std64 = std.to(torch.float64).unsqueeze(1)
    grid = snap_grid(std64)
    z.mul_(std64 / grid).addcmul_(buf, grid.reciprocal()).round_()
    torch.mul(z, grid, out=buf)
    return buf


__all__ = [
    "GRID_BITS",
    "RANDOMNESS_MODES",
    "REPRODUCIBLE_WARNING",
    "NoiseSource",
    "RandomStream",
    "Randomness",
    "TrialRandomness",
    "add_snapped_noise",
    "geometric_from_words",
    "snap_grid",
    "uniform_from_words",
]
