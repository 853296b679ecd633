"""Normalisation: scale inputs by rules that use no training record, then bound them.

Privacy note on normalisation: preprocessing must not depend on the *private* training split,
otherwise the released model leaks statistics that no noise covers. And every scaled input must
be *bounded*: DP-SGD bounds a record's gradient by clipping, but a record whose features are
huge can still overflow float32 and turn a whole trial into NaN, so whether a trial fails would
reveal whether that record is in the data. Inputs are therefore scaled in float64 by rules that
use no training record, then clipped to a fixed range, then cast to float32:

1. bounds declared by the data owner (``input_bounds``): clip to them, map to [0, 1] (images)
   or [-1, 1] (tabular);
2. images with a known pixel format (``pixel_max``: 255 for uint8, 16 for digits): divide, clip
   to [0, 1];
3. other float images: a robust range from the public evaluation records (the carve-out or
   the public evaluation dataset; refused in mode ``dp``), clip to [0, 1];
4. other tabular data: robust standardisation from the public evaluation records (likewise;
   refused in mode ``dp``): per feature, subtract the median and divide by IQR / 1.349 (the
   standard deviation a normal distribution of that IQR has), then clip to
   [-feature_clip, feature_clip].

The transform travels with a kept model when its constants may be released
(:mod:`workers.datasets.input_transform`): 1, 2, and 3-4 from a public evaluation dataset;
never 3-4 from a carve-out.

Token ids (kind ``tokens``) are not scaled: the public tokenizer already bounds them to
``[0, vocab_size)`` (:func:`_token_ids`).

Robust statistics keep one extreme *evaluation* record from squashing every feature to ~0.
Non-finite values (NaN, inf) are refused with their positions, for the data owner to fix
(:mod:`workers.datasets.finite`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpsweep.errors import ConfigError, DatasetError
from workers.datasets.input_transform import InputTransform
from workers.datasets.records import _CHUNK_VALUES, DatasetSpec, RawData

_FLOAT_MAX = float(np.finfo(np.float64).max)


def _normalise(
    raw: RawData, spec: DatasetSpec, x_train: np.ndarray, x_test: np.ndarray
) -> tuple[np.ndarray, np.ndarray, dict[str, Any], InputTransform | None]:
    """Scale both splits by one rule that uses no training record, and bound the result.

    ``x_test`` holds the evaluation records: the public carve-out, the public evaluation
    dataset (mode ``public``) or private records (mode ``dp``, whose statistics are never
    used: only declared bounds or a pixel format may scale it).

    Returns:
        float32 ``x_train`` and ``x_test`` with every value inside ``scaling["clip"]``, and
        ``scaling``: the method, that clip range and where the scaling came from. It holds no
        record's values (only declared bounds or a format's constant), so it can be shown.
        Then the transform itself (None for token ids), marked exportable only when its
        constants are public or declared (:mod:`workers.datasets.input_transform`).

    Raises:
        ConfigError: ``input_bounds`` that are not two finite numbers lo < hi.
    """
    if raw.kind == "tokens":
        return (*_token_ids(raw, spec, x_train, x_test), None)
    image = raw.kind == "image"
    out: tuple[float, float] = (0.0, 1.0) if image else (-1.0, 1.0)
    centre: float | np.ndarray
    scale: float | np.ndarray
    raw_clip: tuple[float, float] | None = None
    # Only constants that are no record's value: declared bounds or a format's pixel maximum.
    extra: dict[str, Any] = {}
    if spec.input_bounds is not None:
        lo, hi = _declared_bounds(spec.input_bounds)
        # Data-independent: clip to the owner's bounds, then map them onto the output range.
        raw_clip = (lo, hi)
        centre, scale = (lo, hi - lo) if image else (lo / 2 + hi / 2, (hi - lo) / 2)
        method, source, extra = "declared", "data owner", {"bounds": [lo, hi]}
    elif image and raw.pixel_max is not None:
        # Data-independent: the pixel format's constant; a pixel above it is clipped too.
        centre, scale = 0.0, float(raw.pixel_max)
        method, source, extra = "pixel", "file format", {"pixel_max": scale}
    else:
        if spec.evaluation == "dp":
            raise ConfigError(
                "with eval mode dp the evaluation records are private: no statistic of "
                "them (or of the training records) may scale the inputs. Declare "
                "dataset.input_bounds (the range of every raw input value), or use a format "
                "with a known pixel range (uint8 images, digits)",
                field="dataset.input_bounds",
            )
        if not (0 < spec.feature_clip < float("inf")):
            raise ConfigError(
                f"feature_clip must be a finite number > 0; got {spec.feature_clip}",
                field="dataset.feature_clip",
            )
        if image:
            lo, hi = _public_image_range(x_test)
            centre, scale = lo, _finite_scale(hi - lo)
        else:
            out = (-float(spec.feature_clip), float(spec.feature_clip))
            centre, scale = _robust_centre_scale(x_test)
        # The statistics are left out of the record: per feature they can be many numbers,
        # and each is an order statistic, i.e. one evaluation record's value.
        method = "public-robust"
        source = (
            "public evaluation dataset"
            if spec.evaluation == "public"
            else "public evaluation split"
        )
    scaling = {"method": method, "clip": list(out), "source": source, **extra}
    # A carve-out's statistics are record values from a split that every record shapes
    # (input_transform's docstring): never exported. A public dataset's or a constant are.
    exportable = method != "public-robust" or spec.evaluation == "public"
    transform = InputTransform.of(method, centre, scale, out, raw_clip, exportable=exportable)
    return (
        _scale(x_train, centre, scale, out, raw_clip),
        _scale(x_test, centre, scale, out, raw_clip),
        scaling,
        transform,
    )


def _declared_bounds(bounds: Any) -> tuple[float, float]:
    """The owner's ``input_bounds`` as two floats.

    Raises:
        ConfigError: not two finite numbers lo < hi.
    """
    lo, hi = (float(v) for v in bounds)
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi and np.isfinite(hi - lo)):
        raise ConfigError(
            f"input_bounds must be two finite numbers [lo, hi] with lo < hi; got {list(bounds)}",
            field="dataset.input_bounds",
        )
    return lo, hi


def _token_ids(
    raw: RawData, spec: DatasetSpec, x_train: np.ndarray, x_test: np.ndarray
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Kind ``tokens``: the ids as int64, unscaled, each checked to be in ``[0, vocab_size)``.

    The range is the public tokenizer's, never the records'; ``input_bounds`` do not apply.

    Raises:
        ConfigError: ``input_bounds`` declared for token ids.
        DatasetError: a loader gave ids outside the tokenizer's range (a loader's bug).
    """
    if spec.input_bounds is not None:
        raise ConfigError(
            "input_bounds apply to numeric inputs; token ids are bounded by the tokenizer",
            field="dataset.input_bounds",
        )
    if raw.vocab_size is None:
        raise DatasetError(f"dataset {spec.name!r}: token ids without a vocabulary size")
    size = int(raw.vocab_size)
    out: list[np.ndarray] = []
    for x in (x_train, x_test):
        ids = np.asarray(x, dtype=np.int64)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= size):
            raise DatasetError(f"dataset {spec.name!r}: token ids outside [0, vocab_size)")
        out.append(ids)
    scaling = {
        "method": "tokens",
        "clip": [0, size - 1],
        "source": "tokenizer",
        "vocab_size": size,
        "pad_id": 0,
        "unknown_id": 1,
    }
    return out[0], out[1], scaling


def _scale(
    x: np.ndarray,
    centre: float | np.ndarray,
    scale: float | np.ndarray,
    out: tuple[float, float],
    raw_clip: tuple[float, float] | None,
) -> np.ndarray:
    """``clip((clip(x, raw_clip) - centre) / scale, out)`` in float64, chunked, as float32.

    ``centre`` and ``scale`` are finite (scale > 0), so an extreme ``x`` gives at worst +-inf,
    never NaN, and the final clip bounds it before the float32 cast.
    """
    result = np.empty(x.shape, dtype=np.float32)
    n = len(x)
    src, dst = x.reshape(n, -1), result.reshape(n, -1)
    step = max(1, _CHUNK_VALUES // max(1, src.shape[1]))
    with np.errstate(over="ignore"):
        for i in range(0, n, step):
            z = src[i : i + step].astype(np.float64)
            if raw_clip is not None:
                np.clip(z, raw_clip[0], raw_clip[1], out=z)
            z -= centre
            z /= scale
            np.clip(z, out[0], out[1], out=z)
            dst[i : i + step] = z
    return result


def _inner_rank(n: int, q: float) -> int:
    """0-based rank of the ``q``-quantile of ``n`` sorted values, kept off both ends (n >= 3).

    Interpolated quantiles of a small split are dominated by one record (with n = 3, the 75th
    percentile is half the maximum); an order statistic at least one step inside the ends moves
    by at most one rank whatever a single record holds.
    """
    r = round(q * (n - 1))
    return min(max(r, 1), n - 2) if n >= 3 else r


def _sorted_median(s: np.ndarray) -> np.ndarray:
    """Median along axis 0 of values already sorted along it (halves first: no overflow)."""
    n = len(s)
    return np.asarray(s[(n - 1) // 2] / 2 + s[n // 2] / 2)


def _finite_scale(scale: Any) -> Any:
    """A spread made usable as a divisor: 0 becomes 1, an overflowed one the largest float."""
    scale = np.where(scale > 0, scale, 1.0)
    return np.where(np.isfinite(scale), scale, _FLOAT_MAX)


def _robust_centre_scale(x_public: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature centre (median) and scale (IQR / 1.349) of the public split.

    Where the IQR is 0, the median absolute deviation * 1.4826; where that is 0 too, 1. Both
    are robust: one extreme evaluation record moves them by at most one order statistic, so it
    cannot squash every other record's features to ~0 (as it would a mean and a std).
    """
    n = len(x_public)
    s = np.sort(x_public.reshape(n, -1).astype(np.float64), axis=0)
    centre = np.clip(_sorted_median(s), -_FLOAT_MAX, _FLOAT_MAX)
    with np.errstate(over="ignore"):
        iqr = s[_inner_rank(n, 0.75)] - s[_inner_rank(n, 0.25)]
        mad = _sorted_median(np.sort(np.abs(s - centre), axis=0)) * 1.4826
    scale = np.where(iqr > 0, iqr / 1.349, mad)
    return centre, _finite_scale(scale)


def _public_image_range(x_public: np.ndarray) -> tuple[float, float]:
    """A robust raw range [lo, hi] of float images, from the public split only.

    Order statistics of the per-record minima and maxima (about the 5th and 95th percentile,
    see :func:`_inner_rank`): a record counts once however many of its pixels are extreme, so
    one record of 1e37 moves the range by at most one rank.
    """
    n = len(x_public)
    flat = x_public.reshape(n, -1)
    lows = np.sort(flat.min(axis=1).astype(np.float64))
    highs = np.sort(flat.max(axis=1).astype(np.float64))
    lo, hi = float(lows[_inner_rank(n, 0.05)]), float(highs[_inner_rank(n, 0.95)])
    return (lo, hi) if hi > lo else (lo, lo + 1.0)
