"""What a plan may ask for: the request's checks, the noise limits and the high-noise warning.

A request is refused when its inputs cannot describe a DP guarantee (a budget that is not
positive, delta >= 1/N...); a plan above :data:`HIGH_NOISE_MULTIPLIER` is only warned about
(a judgement for the user), and one above the spec's maximum, or without one above
:data:`NO_SIGNAL_NOISE_MULTIPLIER`, is refused by the planners.
"""

from __future__ import annotations

import math

from dpsweep.errors import ConfigError
from sweeper.privacy.grids import GridRequest

# Above this sigma a plan carries a warning with an expected-utility hint: many models learn
# slowly or not at all there, yet some strategies (online clipping on digits) still do, so it
# is a judgement for the user, not a refusal. A spec may set a hard maximum.
HIGH_NOISE_MULTIPLIER = 10.0
# Without a hard maximum in the spec, plans above this are refused: at sigma = 100 the noise
# on a batch of 1000 clipped gradients is still 10x the largest possible signal per coordinate.
NO_SIGNAL_NOISE_MULTIPLIER = 100.0


def validate_request(req: GridRequest) -> None:
    """Refuse a request whose inputs are invalid.

    Raises:
        ConfigError: naming the spec's field to fix.
    """
    if not (req.epsilon_budget > 0 and math.isfinite(req.epsilon_budget)):
        raise ConfigError("epsilon budget must be > 0", field="privacy.budgets")
    if not 0 < req.delta < 1:
        raise ConfigError("delta must be in (0, 1)", field="privacy.delta")
    if req.dataset_size is not None:
        check_delta_below_one_over_n(req.delta, req.dataset_size, field="privacy.delta")
    if req.trials < 1 or req.steps_per_trial < 1:
        raise ConfigError("a grid needs at least one trial of at least one step", field="arms")
    if not 0 < req.sample_rate <= 1:
        raise ConfigError("sample rate must be in (0, 1]", field="training.batch_size")
    if req.eval_releases < 0:
        raise ConfigError("eval_releases must be >= 0", field="training.eval_every")
    if req.eval_noise_multiplier is not None and not (
        req.eval_noise_multiplier > 0 and math.isfinite(req.eval_noise_multiplier)
    ):
        raise ConfigError(
            "eval.noise_multiplier must be a finite number > 0", field="eval.noise_multiplier"
        )
    if not 0 < req.eval_epsilon_share < 1:
        raise ConfigError("eval.epsilon_share must be in (0, 1)", field="eval.epsilon_share")


def check_delta_below_one_over_n(delta: float, n_records: int, *, field: str) -> None:
    """Refuse a delta of 1/N or more for a dataset of N records (its declared size, or the
    count of a loader's records): such a guarantee allows releasing a record outright.

    Sweeps (:func:`validate_request`) and single runs (:mod:`sweeper.runs.single_run`) share it.

    Raises:
        ConfigError: naming ``field``, with a delta to use instead.
    """
    if delta >= 1.0 / n_records:
        raise ConfigError(
            f"delta {delta:g} is >= 1/N for a dataset of N = {n_records} (its records, or its "
            "units where it has a privacy unit): such a guarantee allows releasing one "
            f"outright; use delta < "
            f"{1.0 / n_records:.2g} (e.g. {_suggest_delta(n_records):g})",
            field=field,
        )


def _suggest_delta(n: int) -> float:
    return float(10 ** math.floor(math.log10(0.1 / n)))


def high_noise_warning(*, noise_multiplier: float, expected_batch_size: float) -> str:
    """The warning (with an expected-utility hint) a plan above HIGH_NOISE_MULTIPLIER gets."""
    return (
        f"sigma = {noise_multiplier:.3g} is high: each step adds noise of std "
        f"{noise_multiplier / expected_batch_size:.3g} x C per coordinate to the averaged "
        f"gradient (b = {expected_batch_size:g}), so many models learn slowly or not at all. "
        "Larger batches, fewer trials or more epsilon lower it; online (adaptive) clipping has "
        "still learnt at such noise. Set privacy.max_noise_multiplier to refuse such plans"
    )
