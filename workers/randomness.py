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
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        self._enc = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor()
        self._zeros = bytearray(0)
        self._out = bytearray(0)

    def __reduce__(self) -> NoReturn:
        _never_pickled("a RandomStream")

    def __repr__(self) -> str:
        return "RandomStream(<secret>)"

    def words(self, n: int) -> np.ndarray:
        """``n`` uniformly random 64-bit words, as ``int64``.

        The array is a view of a buffer that the next call overwrites: use it at once.
        """
        size = 8 * n
        if len(self._zeros) < size:
            self._zeros = bytearray(size)
            # Room for a block more than the input, as update_into documents for ciphers.
            self._out = bytearray(size + 15)
        self._enc.update_into(memoryview(self._zeros)[:size], self._out)
        return np.frombuffer(self._out, dtype=np.int64, count=n)

    def uniform(self, n: int) -> np.ndarray:
        """``n`` float64 uniforms on the open interval (0, 1), with 52 random bits each."""
        # (j + 1/2) 2**-52 for a 52-bit j: exact in float64, never 0 or 1.
        return ((self.words(n) >> 12).astype(np.float64) + (2.0**51 + 0.5)) * 2.0**-52

    def geometric(self, n: int, p: float) -> np.ndarray:
        """``n`` draws of Geometric(p) on {1, 2, ...} (gaps between Bernoulli(p) successes)."""
        u = self.uniform(n)
        # P(gap > k) = P(u <= (1-p)^k) = (1-p)^k.
        return np.floor(np.log(u) / math.log1p(-p)).astype(np.int64) + 1

    def standard_normal(self, n: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """``n`` float64 standard normal draws (Marsaglia's polar method), into ``out`` if given.

        Uniforms on (-1, 1) have 51 random bits, are symmetric, exact in float64 and never 0,
        so the tail reaches ~11.4 standard deviations (the mass beyond is ~1e-29).
        """
        if out is None:
            out = np.empty(n, dtype=np.float64)
        filled = 0
        while filled < n:
            pairs = (n - filled + 1) // 2
            # Acceptance is pi/4; draw enough that one round almost always suffices.
            m = int(pairs / (math.pi / 4) + 4.0 * math.sqrt(pairs) + 8)
            filled += self._polar_round(m, pairs, out[filled:n])
        return out

    def _polar_round(self, m: int, pairs: int, out: np.ndarray) -> int:
        """Normals from ``m`` candidate pairs written to the front of ``out``; returns how many.

        Works in buffers kept between calls: fresh megabyte-sized temporaries cost more in
        page faults than the arithmetic (this runs once per release per step).
        """
        ws = self._workspace(m)
        # Uniforms on (-1, 1) straight from the bits: 51 random mantissa bits with the lowest
        # set, under the exponent of [1, 2), give x = 1 + (2i + 1) 2**-52; then u = 2x - 3 =
        # (2i + 1 - 2**51) 2**-51: symmetric about 0, never 0, exact.
        bits = ws["w"][: 2 * m]
        np.right_shift(self.words(2 * m).view(np.uint64), np.uint64(12), out=bits)
        np.bitwise_or(bits, np.uint64(0x3FF0000000000001), out=bits)
        uv = bits.view(np.float64)
        uv *= 2.0
        uv -= 3.0
        u, v = uv[:m], uv[m:]
        s, f = ws["s"][:m], ws["f"][:m]
        np.multiply(u, u, out=s)
        np.multiply(v, v, out=f)
        s += f
        keep = np.flatnonzero(s < 1.0)[:pairs]
        k = len(keep)
        ss = ws["ss"][:k]
        np.take(s, keep, out=ss)
        f = f[:k]
        np.log(ss, out=f)
        f *= -2.0
        f /= ss
        np.sqrt(f, out=f)
        # Pairs in stream order, u then v; a trailing odd draw is simply not used.
        got = min(2 * k, len(out))
        hi, lo = (got + 1) // 2, got // 2
        np.multiply(np.take(u, keep[:hi]), f[:hi], out=out[0:got:2])
        np.multiply(np.take(v, keep[:lo]), f[:lo], out=out[1:got:2])
        return got

    def _workspace(self, m: int) -> dict[str, np.ndarray]:
        ws = getattr(self, "_ws", None)
        if ws is None or len(ws["s"]) < m:
            ws = {
                "w": np.empty(2 * m, dtype=np.uint64),
                **{name: np.empty(m) for name in ("s", "ss", "f")},
            }
            self._ws = ws
        return ws


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
        import torch

        self.streams = list(streams)
        self.device = torch.device(device)
        self._buf = np.empty((len(self.streams), 0))

    def __reduce__(self) -> NoReturn:
        _never_pickled("a NoiseSource")

    def standard_normal(self, n: int) -> Tensor:
        """``[K, n]`` float64 standard normal draws on the pack's device.

        On CPU the tensor is a view of a buffer that the next call overwrites: use it at once.
        """
        import torch

        if self._buf.shape[1] < n:
            self._buf = np.empty((len(self.streams), n))
        z = self._buf[:, :n]
        for row, stream in zip(z, self.streams, strict=True):
            stream.standard_normal(n, out=row)
        t = torch.from_numpy(z)
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)


def snap_grid(std: Tensor) -> Tensor:
    """The snapping grid of each noise scale: the power of two just below ``std * 2**-GRID_BITS``.

    Scales that are zero or not finite (a diverged trial's noised state) get a grid of 1; their
    releases are not finite anyway.
    """
    import torch

    ok = torch.isfinite(std) & (std > 0)
    safe = torch.where(ok, std, torch.ones_like(std))
    return torch.where(ok, torch.exp2(torch.floor(torch.log2(safe)) - GRID_BITS), 1.0)


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
    import torch

    std64 = std.to(torch.float64).unsqueeze(1)
    grid = snap_grid(std64)
    noised = z.mul_(std64).add_(buf)
    # Rounding after the noise is added is post-processing: no privacy cost, no extra
    # sensitivity. Division and multiplication by a power of two are exact.
    noised.div_(grid).round_().mul_(grid)
    buf.copy_(noised)
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
    "snap_grid",
]
