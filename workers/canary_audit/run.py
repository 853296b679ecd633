"""Run one audit: train once with canaries, score them, and bound epsilon from below.

:func:`run_audit` trains the pack it is given through :func:`workers.training.loop.train_pack`,
the code every sweep runs (every strategy, both engine paths, packs of K > 1), with:

* ``white-box``: m gradient canaries (:mod:`workers.canary_audit.canaries`) inside the DP step,
  scored from every noised gradient release of every trial;
* ``black-box``: m input canaries (random inputs inside the data's public clip range, random
  labels), each appended to the training split with probability ½, scored by their loss under
  each trial's final model.

On data with a privacy unit (issue 54) the audit is per unit: each canary is a whole unit of
``canary_rows`` rows (:mod:`workers.unit_canaries`, :mod:`workers.canary_audit.inputs`),
sampled at the unit rate and bounded as one unit, and the claim is the plan's epsilon per
unit (q = b / N_units).

The claim beside the bound is the epsilon of everything the adversary saw: the K trials'
T steps each (the pack's K T compositions of the same Poisson-subsampled Gaussian), at the
trials' delta. The bound is the one-run bound (:mod:`workers.canary_audit.bounds`), which
holds for any mechanism; the Gaussian estimate (:mod:`workers.canary_audit.estimate`) is
shown beside it only where its normality check passes, and never replaces it. Nothing here is
a user-facing fault switch: tests inject faults by patching.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from dpsweep.accounting_inputs import AccountingInputs
from dpsweep.audit import audit_verdict
from dpsweep.errors import ConfigError
from workers.accounting import epsilon_for
from workers.accounting.registry import worker_accountant
from workers.canary_audit.bounds import one_run_bound
from workers.canary_audit.canaries import Direction, GradientCanaries, layer_ranges
from workers.canary_audit.curve_test import curve_test
from workers.canary_audit.estimate import ASSUMPTION, gaussian_estimate
from workers.canary_audit.inputs import canary_losses, with_input_canaries
from workers.canary_audit.scores import black_box_scores, white_box_scores
from workers.datasets.loading import load_dataset
from workers.datasets.records import Dataset
from workers.strategies import get_strategy
from workers.training.loop import train_pack
from workers.training.specs import PackSpec, TrialResult

Setting = Literal["white-box", "black-box"]
SETTINGS: tuple[Setting, ...] = ("white-box", "black-box")

#: The most trials an audited pack may have (the white-box scorer sums over 2^K patterns).
MAX_AUDIT_TRIALS = 8

#: Rows of each canary unit on data with a privacy unit: several, so that a unit's rows, their
#: 1/m_u and the capped mean are what the canaries go through (the score does not depend on
#: the count when the bounding is right).
DEFAULT_CANARY_ROWS = 4


@dataclass(frozen=True)
class AuditResult:
    """What one audit found (plain values; ``to_dict`` is the ``--json`` output)."""

    epsilon_claimed: float
    epsilon_lower_bound: float
    confidence: float
    canaries: int
    setting: Setting
    strategy: str
    engine_path: str
    seconds: float
    delta: float
    trials: int
    steps: int
    sample_rate: float
    noise_multiplier: float
    guesses: int
    correct: int
    # The bound's method: the one-run bound, which holds for any mechanism.
    method: str
    # The verdict (dpsweep.audit.audit_verdict): whether the bound exceeds the claim, and the
    # chance of that for a run that honours its claim (1 - confidence), in words.
    exceeds_claim: bool
    estimate_exceeds_claim: bool
    false_alarm_rate: float
    verdict: str
    # An estimate under a model of the scores, never the bound: None unless the model's
    # normality test passed on both groups (workers.canary_audit.estimate).
    epsilon_estimate: float | None
    estimate_assumption: str
    normality_p_in: float
    normality_p_out: float
    # The test of the whole claimed curve (workers.canary_audit.curve_test), any mechanism:
    # refuted at most 1 - confidence of the time for a run that honours the claimed curve.
    claim_refuted: bool = False
    claim_p_value: float = 1.0
    noise_scale_upper_bound: float | None = None
    direction: str | None = None
    # What the claim protects and each canary is: ``example`` (a row), or the data's unit (a
    # person: each canary a whole unit of ``canary_rows`` rows, the claim per unit).
    privacy_unit: str = "example"
    canary_rows: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_audit_pack(spec: PackSpec, *, setting: str, canaries: int) -> None:
    """Refuse what an audit cannot run, before anything is trained or charged (field named).

    Raises:
        ConfigError: a non-private strategy, a white-box audit of a strategy the canaries
            cannot enter, mixed noise multipliers or deltas, too many trials, DP evaluation,
            or a bad setting or canary count.
    """
    if setting not in SETTINGS:
        raise ConfigError(
            f"setting must be one of {', '.join(SETTINGS)}; got {setting!r}", field="setting"
        )
    if not 2 <= canaries <= 100_000:
        raise ConfigError("canaries must be between 2 and 100000", field="canaries")
    strategy = get_strategy(spec.strategy)
    if not strategy.private:
        raise ConfigError(
            f"strategy {spec.strategy!r} is not private: there is no epsilon to audit",
            field="strategy",
        )
    if setting == "white-box" and not strategy.needs_norms:
        # Gradient canaries enter a release through the per-example norms the strategy
        # weighs them by; a strategy that reads none would train without them, and its audit
        # would pass with a bound of 0 whatever the code does.
        raise ConfigError(
            f"strategy {spec.strategy!r} reads no per-example gradient norms, so white-box "
            "gradient canaries cannot enter its releases and its audit would prove nothing: "
            "audit it with setting 'black-box' (input canaries, trained as records)",
            field="strategy",
        )
    if not 1 <= len(spec.trials) <= MAX_AUDIT_TRIALS:
        raise ConfigError(f"an audit trains 1 to {MAX_AUDIT_TRIALS} trials at once", field="trials")
    sigmas = {t.noise_multiplier for t in spec.trials}
    deltas = {t.target_delta for t in spec.trials}
    if len(sigmas) != 1 or None in sigmas or len(deltas) != 1:
        raise ConfigError(
            "every trial of an audit needs the same noise multiplier and delta",
            field="noise_multiplier",
        )
    if spec.eval_noise_multiplier is not None:
        raise ConfigError(
            "an audit evaluates nothing privately: use public or carve-out evaluation",
            field="eval.mode",
        )


def run_audit(
    spec: PackSpec,
    *,
    setting: Setting = "white-box",
    canaries: int = 1000,
    direction: Direction = "auto",
    confidence: float = 0.95,
    dataset: Dataset | None = None,
    public_data: bool = False,
    canary_rows: int = DEFAULT_CANARY_ROWS,
) -> AuditResult:
    """Train ``spec`` once with ``canaries`` canaries and bound its epsilon from below.

    Args:
        spec: the pack to audit (every trial with the same planned noise multiplier).
        setting: ``white-box`` (every iterate) or ``black-box`` (final model).
        canaries: m.
        direction: the white-box canaries' directions (``auto``, ``random`` or ``dirac``;
            the result names the one used).
        confidence: of the lower bound.
        dataset: the loaded data (else loaded from ``spec.dataset``).
        public_data: the records are public (a built-in set, ``synthetic``, or one its owner
            declared public): the white-box adversary then knows every other record, as DP's
            threat model allows, and removes their expected gradient. Never set it for
            private records: the scores would read them without noise.
        canary_rows: on data with a privacy unit, the rows of each canary unit (the audit is
            then per unit; ignored at the row level, where each canary is one row).

    Raises:
        ConfigError: what :func:`check_audit_pack` refuses.
    """
    check_audit_pack(spec, setting=setting, canaries=canaries)
    if not 1 <= canary_rows <= 1024:
        raise ConfigError("canary_rows must be between 1 and 1024", field="canary_rows")
    start = time.perf_counter()
    data = dataset if dataset is not None else load_dataset(spec.dataset)
    # With a privacy unit every canary is a unit of several rows; at the row level, one row.
    rows = int(canary_rows) if data.has_units else 1
    if setting == "white-box":
        results, scores, gauss_scores, included, direction = _white_box(
            spec, data, canaries=canaries, direction=direction, public_data=public_data, rows=rows
        )
    else:
        bb = with_input_canaries(data, canaries, rows=rows)
        run = dataclasses.replace(spec, eval_every=10**9, keep_weights=True)
        results = train_pack(run, dataset=bb.data)
        losses = np.mean([canary_losses(r, bb) for r in results], axis=0)
        scores = gauss_scores = black_box_scores(losses)
        included = bb.included
    result = _result(
        spec,
        results,
        scores=scores,
        gauss_scores=gauss_scores,
        included=included,
        setting=setting,
        direction=direction,
        confidence=confidence,
        seconds=time.perf_counter() - start,
        privacy_unit=str(data.privacy_unit or "example"),
    )
    return dataclasses.replace(result, canary_rows=rows)


def _claim(spec: PackSpec, results: list[TrialResult]) -> AccountingInputs:
    """What the audit claims the adversary saw: every trial's steps, composed (one sigma).

    The pack's accountant is a worker's name (a legacy ``rdp`` is Opacus's RDP).
    """
    first = results[0]
    return AccountingInputs(
        noise_multiplier=float(spec.trials[0].noise_multiplier),  # type: ignore[arg-type]
        sample_rate=first.sample_rate,
        steps=first.steps * len(results),
        delta=float(spec.trials[0].target_delta),
        accountant=worker_accountant(spec.accountant).name,
    )


def _result(
    spec: PackSpec,
    results: list[TrialResult],
    *,
    scores: np.ndarray,
    gauss_scores: np.ndarray,
    included: np.ndarray,
    setting: Setting,
    direction: Direction,
    confidence: float,
    seconds: float,
    privacy_unit: str = "example",
) -> AuditResult:
    """The claim of what the adversary saw, the bound, the estimate and the verdict (the
    claim per ``privacy_unit``: q, T and delta were planned over units)."""
    claim = _claim(spec, results)
    claimed = float(epsilon_for(claim))
    delta, first = claim.delta, results[0]
    # The bound alone carries the confidence: the estimate is no bound, so no union is paid.
    bound = one_run_bound(scores, included, delta=delta, confidence=confidence)
    estimate = gaussian_estimate(gauss_scores, included, delta=delta, confidence=confidence)
    # The same scores test the claimed curve itself (its own level: a second test, not a
    # union with the bound's; each alone errs at most 1 - confidence for an honest run).
    curve = curve_test(
        scores,
        included,
        noise_multiplier=claim.sigma,
        sample_rate=claim.sample_rate,
        steps=claim.steps,
        confidence=confidence,
    )
    verdict = audit_verdict(
        bound=bound.epsilon_lower_bound,
        claimed=claimed,
        confidence=confidence,
        estimate=estimate.epsilon_estimate,
        claim_refuted=curve.claim_refuted,
        claim_p_value=curve.claim_p_value,
        noise_scale=curve.noise_scale_upper_bound,
        privacy_unit=privacy_unit,
    )
    return AuditResult(
        epsilon_claimed=claimed,
        epsilon_lower_bound=float(bound.epsilon_lower_bound),
        confidence=confidence,
        canaries=int(included.shape[0]),
        setting=setting,
        strategy=spec.strategy,
        engine_path=first.engine_path,
        seconds=seconds,
        delta=delta,
        trials=len(results),
        steps=first.steps,
        sample_rate=first.sample_rate,
        noise_multiplier=claim.sigma,
        guesses=bound.guesses,
        correct=bound.correct,
        method="one-run",
        exceeds_claim=bool(verdict["exceeds_claim"]),
        estimate_exceeds_claim=bool(verdict["estimate_exceeds_claim"]),
        false_alarm_rate=float(verdict["false_alarm_rate"]),
        verdict=str(verdict["verdict"]),
        epsilon_estimate=estimate.epsilon_estimate,
        estimate_assumption=ASSUMPTION,
        normality_p_in=estimate.normality_p_in,
        normality_p_out=estimate.normality_p_out,
        claim_refuted=curve.claim_refuted,
        claim_p_value=curve.claim_p_value,
        noise_scale_upper_bound=curve.noise_scale_upper_bound,
        direction=direction if setting == "white-box" else None,
        privacy_unit=privacy_unit,
    )


def _white_box(
    spec: PackSpec,
    data: Dataset,
    *,
    canaries: int,
    direction: Direction,
    public_data: bool,
    rows: int = 1,
) -> tuple[list[TrialResult], np.ndarray, np.ndarray, np.ndarray, Direction]:
    """Train with gradient canaries; the results, both scores per canary, their bits, and
    the direction used (``auto`` resolved)."""
    holder: list[GradientCanaries] = []
    layerwise = any(t.params.get("clip_style") == "layerwise" for t in spec.trials)

    def make(model: Any) -> GradientCanaries:
        can = GradientCanaries(
            canaries,
            ranges=layer_ranges(model),
            numel=int(model.numel),
            device=model.device,
            direction=direction,
            knows_data=public_data,
            per_layer=layerwise,
            unit_rows=rows,
        )
        holder.append(can)
        return can

    # One evaluation at the end only: the adversary sees the releases, not the metrics.
    run = dataclasses.replace(spec, eval_every=10**9, keep_weights=False)
    results = train_pack(run, dataset=data, canaries=make)
    _check_canaries_entered(holder[0], results)
    z, mu, included = holder[0].scored_inputs()
    wb = white_box_scores(z, mu, sample_rate=results[0].sample_rate, data_removed=public_data)
    return results, wb.llr, wb.linear, included, holder[0].direction


def _check_canaries_entered(can: GradientCanaries, results: list[TrialResult]) -> None:
    """Fail an audit whose gradient canaries never entered a release, where they should have.

    :func:`check_audit_pack` refuses the strategies known to leave them out before anything is
    charged; this catches any other way (a plug-in's engine hook, a bug) after training, so
    that such an audit fails instead of passing with a bound of 0.
    """
    first = results[0]
    expected = can.n_included * first.sample_rate * first.steps * len(results)
    # At 20 expected entries, none at all has probability e^-20 for a working engine.
    if expected >= 20 and can.entered == 0:
        raise ConfigError(
            f"the gradient canaries never entered a release of strategy {first.strategy!r}: "
            "it cannot be audited white-box",
            field="strategy",
        )
