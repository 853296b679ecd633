"""The request of a canary audit (``dpsweep audit``, ``POST /api/v1/audits``, ``Client.audit``).

An audit trains once with m canaries and bounds the run's epsilon from below (at a
confidence, 95% by default), beside the epsilon it claims. It either describes its own run
(dataset, model, strategy and params, epsilon or sigma, q through a batch size or a sample
rate, T steps, K learning rates) or names a finished ``trial``, whose model, strategy,
params, sigma, q, T and dataset it re-uses.

Light: pydantic only (the client install has no torch). :meth:`AuditRequest.check` is the
check that spans fields; the server runs it at the edge, before any budget is reserved.

The verdict's words live here too (:func:`audit_verdict`), so that the stored result, the CLI,
the API and the dashboard say the same thing, and an audit stored before the bound became
assumption-free reads in today's terms (:func:`result_view`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dpsweep.errors import ConfigError
from dpsweep.plan_fields import unit_suffix

__all__ = [
    "DEFAULT_DATASET",
    "MAX_TRIALS",
    "TRIAL_FIELDS",
    "AuditRequest",
    "audit_summary",
    "audit_verdict",
    "curve_phrase",
    "result_view",
    "unit_sentence",
]

#: The dataset of an audit that names none: public records, so it spends no one's budget.
DEFAULT_DATASET = "synthetic"
#: The most learning rates (trials of one pack) one audit trains.
MAX_TRIALS = 8
#: What an audit of a trial takes from the trial (and so may not be given beside it).
TRIAL_FIELDS = (
    "dataset",
    "model",
    "model_options",
    "strategy",
    "params",
    "epsilon",
    "noise_multiplier",
    "delta",
    "accountant",
    "batch_size",
    "sample_rate",
    "steps",
    "lrs",
    "unit_bounding",
    "rows_per_unit",
)


class AuditRequest(BaseModel):
    """One audit. Leave out ``trial`` to describe the run; give it to audit that trial."""

    model_config = ConfigDict(extra="forbid")

    trial: str | None = Field(
        default=None,
        max_length=64,
        description="a finished trial whose configuration is audited (model, strategy, params, "
        "sigma, q, T and dataset); the run's other fields are then left out",
    )
    dataset: str | None = Field(
        default=None,
        max_length=200,
        description=f"dataset (default {DEFAULT_DATASET}); a built-in set or one declared public "
        "spends no budget, a private one (its owner's) is charged the claimed epsilon",
    )
    model: str | None = Field(default=None, max_length=200, description="model (default mlp)")
    model_options: dict[str, Any] = Field(default_factory=dict)
    strategy: str | None = Field(
        default=None, max_length=64, description="clipping strategy (default fixed)"
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="the strategy's hyperparameters, e.g. {clip: 1.0}"
    )
    epsilon: float | None = Field(
        default=None, gt=0, description="each trial's epsilon (sigma is calibrated to it)"
    )
    noise_multiplier: float | None = Field(default=None, gt=0, description="sigma")
    delta: float | None = Field(default=None, gt=0, lt=1, description="delta (default 1e-5)")
    accountant: str | None = Field(default=None, max_length=64)
    batch_size: int | None = Field(default=None, ge=1, description="expected batch b = qN")
    sample_rate: float | None = Field(default=None, gt=0, le=1, description="q (b = qN)")
    steps: int | None = Field(default=None, ge=1, le=1_000_000, description="T (default 100)")
    lrs: list[float] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_TRIALS,
        description="one learning rate per trial: K trials trained as one pack (default [0.5])",
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    setting: Literal["white-box", "black-box"] = "white-box"
    canaries: int = Field(default=1000, ge=2, le=100_000)
    direction: Literal["auto", "random", "dirac"] = Field(
        default="auto",
        description="white-box canaries: dirac (one coordinate each, mutually orthogonal), "
        "random (random unit vectors), or auto: dirac where the model has a coordinate for "
        "each canary, else random",
    )
    canary_rows: int = Field(
        default=4,
        ge=1,
        le=1024,
        description="on a dataset with a privacy unit, the rows of each canary unit (the "
        "audit is then per unit: each canary a whole unit, the claim per unit); ignored at "
        "the row level",
    )
    unit_bounding: Literal["mean", "capped"] | None = Field(
        default=None,
        description="how a sampled unit's rows make its one contribution (dataset with a "
        "privacy unit; default mean)",
    )
    rows_per_unit: int | None = Field(
        default=None, ge=1, le=1024, description="R, the most rows of a sampled unit used"
    )
    confidence: float = Field(
        default=0.95,
        gt=0.5,
        lt=1,
        description="of the lower bound: an honest run's bound exceeds its claim with "
        "probability at most 1 - confidence",
    )
    confirm: bool = Field(
        default=False,
        description="charge a private dataset the audit's claimed epsilon: without it an "
        "audit that would be charged is refused (422 naming confirm, with its cost; nothing "
        "reserved); see the cost first with POST /audits/quote. Public data needs none",
    )

    def check(self) -> AuditRequest:
        """Refuse combinations no single field shows (the error names the field).

        Raises:
            ConfigError: a trial's field given beside ``trial``; not exactly one of
                ``epsilon`` and ``noise_multiplier``; both ``batch_size`` and
                ``sample_rate``; a non-positive learning rate.
        """
        given = self.model_fields_set
        if self.trial is not None:
            extra = [f for f in TRIAL_FIELDS if f in given and getattr(self, f) not in (None, {})]
            if extra:
                raise ConfigError(
                    f"{extra[0]} comes from the audited trial: leave it out when giving trial",
                    field=extra[0],
                )
            return self
        if (self.epsilon is None) == (self.noise_multiplier is None):
            raise ConfigError(
                "give exactly one of epsilon or noise_multiplier", field="noise_multiplier"
            )
        if self.batch_size is not None and self.sample_rate is not None:
            raise ConfigError("give batch_size or sample_rate, not both", field="sample_rate")
        for lr in self.lrs or ():
            if not lr > 0 or lr != lr or lr == float("inf"):
                raise ConfigError("every learning rate must be a finite number > 0", field="lrs")
        return self


def _percent(rate: float) -> str:
    return f"{100.0 * rate:.3g} %"


#: A bound below this fraction of the claim is "near 0": the audit showed next to nothing.
#: An ideal audit's bound reaches 0.15-0.4 of an honest claim (docs/auditing.md, the ceiling),
#: so a bound under 5 % of it says more about the audit's weakness than about the run.
WEAK_FRACTION = 0.05


def _pair(bound: float, claimed: float) -> tuple[str, str]:
    """Two figures at 2 decimals, more where 2 would read the same but differ."""
    a, b = f"{bound:.2f}", f"{claimed:.2f}"
    if a == b and bound != claimed:
        a, b = f"{bound:.6g}", f"{claimed:.6g}"
    return a, b


def audit_summary(
    *,
    bound: float | None,
    claimed: float,
    confidence: float,
    estimate: float | None = None,
    claim_refuted: bool | None = None,
    claim_p_value: float | None = None,
    privacy_unit: str | None = None,
) -> str:
    """The verdict in one line: the bound beside the claim, what that shows, and the curve
    test's outcome (where the result has one: :func:`curve_phrase`).

    A lower bound below the claim never confirms the claim; near 0 it shows nothing at all
    (the black-box setting, small q, few canaries). One above the claim is evidence of a
    leak, at a false-alarm rate of ``1 - confidence``; the Gaussian estimate is named only as
    evidence under its model.
    """
    head = _bound_summary(
        bound=bound, claimed=claimed, confidence=confidence, estimate=estimate, unit=privacy_unit
    )
    if claim_refuted is None:
        return head
    return f"{head}; {curve_phrase(claim_refuted, claim_p_value, confidence)}"


def curve_phrase(refuted: bool, p_value: float | None, confidence: float) -> str:
    """The curve test's outcome in a phrase, with its error rate for an honest run."""
    rate = _percent(round(1.0 - confidence, 12))
    p = "" if p_value is None else f" (p = {p_value:.2g})"
    if refuted:
        return (
            f"the claimed privacy curve is refuted{p}: the run leaks more than its planned "
            f"noise allows (an honest run is refuted with probability at most {rate}); repeat "
            "the audit on public data before calling it a bug"
        )
    return (
        f"the claimed privacy curve is not refuted{p} (an honest run is refuted with "
        f"probability at most {rate}; not refuting it does not confirm it)"
    )


def _bound_summary(
    *,
    bound: float | None,
    claimed: float,
    confidence: float,
    estimate: float | None,
    unit: str | None = None,
) -> str:
    """The bound's part of :func:`audit_summary` (``unit``: the claim's privacy unit)."""
    level = f"{100.0 * confidence:.3g} %"
    per = unit_suffix(unit)
    if bound is None:
        return f"no bound (claimed ε {claimed:.2f}{per}): this audit shows nothing about the claim"
    b, c = _pair(bound, claimed)
    c = f"{c}{per}"
    head = f"{level} lower bound {b}"
    if bound > claimed:
        rate = _percent(round(1.0 - confidence, 12))
        return (
            f"{head} > claimed ε {c}: the run may leak more than it claims (an honest run "
            f"shows this with probability at most {rate}); repeat the audit on public data"
        )
    if estimate is not None and estimate > claimed:
        return (
            f"{head} ≤ claimed ε {c}, but the Gaussian estimate {estimate:.2f} exceeds it: a "
            "leak if its model holds (no guarantee); repeat the audit on public data"
        )
    if bound < WEAK_FRACTION * claimed:
        return (
            f"{head} ≤ claimed ε {c}: consistent, but this audit is too weak to show much "
            "(a bound near 0 proves nothing)"
        )
    return (
        f"{head} ≤ claimed ε {c}: consistent, no evidence of a leak (a lower bound never "
        "confirms the claim; one run rarely shows more than about 0.4 of an honest claim)"
    )


def audit_verdict(
    *,
    bound: float | None,
    claimed: float,
    confidence: float,
    estimate: float | None = None,
    claim_refuted: bool | None = None,
    claim_p_value: float | None = None,
    noise_scale: float | None = None,
    privacy_unit: str | None = None,
) -> dict[str, Any]:
    """Whether the bound exceeds the claim, the chance of that for an honest run, in words.

    The lower bound holds at ``confidence`` for any mechanism, so a run that honours its claim
    shows a bound above it with probability at most ``1 - confidence`` (the false-alarm rate).
    The estimate (a model's, None where its check refused the model) is named in the verdict
    only when it exceeds the claim and the bound does not: it is evidence under its model,
    never a guarantee. ``claim_refuted`` (None: a result without the curve test) is the test
    of the whole claimed privacy curve, sound for any mechanism too: an honest run is refuted
    with probability at most ``1 - confidence``; ``noise_scale`` is its upper bound on the
    noise's scale over the planned one. ``privacy_unit`` (None or ``example``: a row) is what
    the claim protects: with a unit the verdict says the audit is per unit.

    Returns:
        ``exceeds_claim`` (the bound's), ``estimate_exceeds_claim``, ``false_alarm_rate``,
        ``claim_refuted``, ``verdict`` (the words the CLI, the API and the dashboard show) and
        ``summary`` (the same in one line, :func:`audit_summary`).
    """
    rate = round(1.0 - confidence, 12)  # 0.05, not 0.050000000000000044
    exceeds = bound is not None and bound > claimed
    estimate_exceeds = estimate is not None and estimate > claimed
    if exceeds:
        text = (
            "The lower bound exceeds the claimed epsilon. An honest run shows this with "
            f"probability at most {_percent(rate)}: repeat the audit on public data before "
            "calling it a bug; a bound above the claim again means the run leaks more than it "
            "claims."
        )
    elif estimate_exceeds:
        text = (
            "The lower bound does not exceed the claimed epsilon, but the Gaussian estimate "
            "does: if its model holds, the run leaks more than it claims. The estimate is no "
            "guarantee: repeat the audit on public data before calling it a bug."
        )
    else:
        text = (
            "The lower bound does not exceed the claimed epsilon: no evidence of a leak. A "
            "lower bound below the claim proves nothing about the claim (it is not an upper "
            "bound)."
        )
    if claim_refuted is not None:
        text = f"{text} {_curve_sentence(claim_refuted, claim_p_value, noise_scale, rate)}"
    if unit_suffix(privacy_unit):
        text = f"{text} {unit_sentence(str(privacy_unit))}"
    return {
        "exceeds_claim": exceeds,
        "estimate_exceeds_claim": estimate_exceeds,
        "false_alarm_rate": rate,
        "claim_refuted": claim_refuted,
        "verdict": text,
        "summary": audit_summary(
            bound=bound,
            claimed=claimed,
            confidence=confidence,
            estimate=estimate,
            claim_refuted=claim_refuted,
            claim_p_value=claim_p_value,
            privacy_unit=privacy_unit,
        ),
    }


def unit_sentence(privacy_unit: str) -> str:
    """What a unit-level audit audits, in a sentence of its verdict."""
    per = unit_suffix(privacy_unit)
    return (
        f"The audit is per unit (unit: {privacy_unit}): each canary is a whole unit of "
        f"several rows, added or removed as one, and the claim is the plan's ε{per}."
    )


def _curve_sentence(refuted: bool, p_value: float | None, scale: float | None, rate: float) -> str:
    """The curve test's sentences of the verdict."""
    p = "" if p_value is None else f" (p = {p_value:.2g})"
    if scale is None:
        noise = "The audit saw too little to bound the noise's scale."
    else:
        noise = f"The noise acts as at most {scale:.2f} times its planned scale."
    if refuted:
        return (
            f"The test of the whole claimed privacy curve refutes it{p}: the run leaks more "
            "than the planned noise allows. A run that honours its claimed curve is refuted "
            f"with probability at most {_percent(rate)}: repeat the audit on public data "
            f"before calling it a bug. {noise}"
        )
    return (
        f"The test of the whole claimed privacy curve does not refute it{p}; a run that "
        f"honours it is refuted with probability at most {_percent(rate)}, and not refuting "
        f"it does not confirm it. {noise}"
    )


def result_view(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stored audit result in today's terms (None stays None).

    Results stored before issue 49 reported the larger of the one-run and the Gaussian bound,
    the Gaussian one unchecked: their ``epsilon_lower_bound`` becomes the one-run bound (stored
    at 1 - (1 - confidence) / 2, so it holds at ``confidence`` a fortiori), the unchecked
    Gaussian figure is withheld, and the verdict is added. Every result gets its one-line
    ``summary`` (:func:`audit_summary`; the worker stores none), computed from its figures.
    """
    if result is None:
        return None
    out = dict(result)
    if "verdict" not in out and "epsilon_lower_bound_one_run" in out:
        out["epsilon_lower_bound"] = out.pop("epsilon_lower_bound_one_run")
        out.pop("epsilon_lower_bound_gaussian", None)
        out["method"] = "one-run"
    out.setdefault("epsilon_estimate", None)
    # Results stored before the curve test have none: None, never a made-up outcome.
    for key in ("claim_refuted", "claim_p_value", "noise_scale_upper_bound"):
        out.setdefault(key, None)
    claimed, bound = out.get("epsilon_claimed"), out.get("epsilon_lower_bound")
    estimate = out.get("epsilon_estimate")
    if not isinstance(claimed, int | float):
        return out
    unit = out.get("privacy_unit")
    figures: dict[str, Any] = {
        "bound": bound if isinstance(bound, int | float) else None,
        "claimed": float(claimed),
        "confidence": float(out.get("confidence", 0.95)),
        "privacy_unit": unit if isinstance(unit, str) else None,
    }
    if "verdict" not in out:
        # Before issue 49 the estimate was unchecked: the verdict rests on the bound alone.
        out.update(audit_verdict(**figures))
    elif isinstance(estimate, int | float):
        figures["estimate"] = float(estimate)
    refuted, p_value = out.get("claim_refuted"), out.get("claim_p_value")
    out["summary"] = audit_summary(
        **figures,
        claim_refuted=refuted if isinstance(refuted, bool) else None,
        claim_p_value=float(p_value) if isinstance(p_value, int | float) else None,
    )
    return out
