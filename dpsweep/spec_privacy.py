"""The spec's ``privacy`` section: epsilon levels, delta, the accounting method and accountant,
papernot-steinke's distribution of the number of trials, and the randomness and retries.

Re-exported by :mod:`dpsweep.spec`.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from dpsweep.accountants import DEFAULT_ACCOUNTANT, canonical_accountant, choices_text
from dpsweep.spec_base import StrictSection

ACCOUNTING_METHODS = ("compose", "basic", "papernot-steinke")
DISTRIBUTIONS = ("logarithmic", "geometric", "truncated_negative_binomial", "poisson")


class SearchDistribution(StrictSection):
    """Distribution of the number of trials for papernot-steinke (Papernot & Steinke 2022)."""

    name: Literal["logarithmic", "geometric", "truncated_negative_binomial", "poisson"]
    eta: float | None = Field(default=None, description="shape of the truncated negative binomial")

    @model_validator(mode="after")
    def _eta(self) -> SearchDistribution:
        if self.name == "truncated_negative_binomial":
            if self.eta is None or not (self.eta > 0 and math.isfinite(self.eta)):
                raise ValueError("truncated_negative_binomial needs eta > 0 (e.g. eta: 0.5)")
        elif self.eta is not None:
            raise ValueError(f"eta applies only to truncated_negative_binomial, not {self.name}")
        return self

    @property
    def shape(self) -> float:
        """The ``shape`` of dp_accounting's RepeatAndSelectDpEvent."""
        return {
            "poisson": math.inf,
            "geometric": 1.0,
            "logarithmic": 0.0,
            "truncated_negative_binomial": float(self.eta or 0.0),
        }[self.name]


class PrivacyConfig(StrictSection):
    budgets: list[float] = Field(min_length=1, description="per-grid epsilon levels")
    delta: float = Field(gt=0, lt=1)
    accounting: Literal["compose", "basic", "papernot-steinke"] = "compose"
    accountant: str = Field(
        default=DEFAULT_ACCOUNTANT,
        description="calibration accountant for compose/basic: "
        + choices_text(plannable_only=True)
        + "; or a plug-in's (`dpsweep plugins accountants`). An older spec's prv or rdp reads "
        "as pld or dp-rdp, what it meant there",
    )
    charge_repeats: bool = Field(default=True, description="every seed touches the data")
    distribution: SearchDistribution | None = Field(
        default=None, description="papernot-steinke: the distribution of the number of trials"
    )
    max_noise_multiplier: float | None = Field(
        default=None,
        gt=0,
        description="a hard maximum: plans needing more noise are refused as infeasible. Left "
        "out, a plan above sigma = 10 is accepted with a warning and an expected-utility hint "
        "(some strategies still learn there), and only sigma > 100 is refused",
    )
    reproducible: bool = Field(
        default=False,
        description="draw noise and Poisson sampling from the public seed instead of a fresh "
        "OS secret per trial: same seed, same result, for debugging and tests. NOT private "
        "against anyone who knows the seed; results are labelled so everywhere",
    )
    retries: int = Field(
        default=0,
        ge=0,
        description="extra runs per grid reserved up front for re-running trials interrupted by "
        "a crash (compose and basic); each grid is planned for its trials plus these runs",
    )

    @field_validator("budgets")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        for e in v:
            if not (e > 0 and math.isfinite(e)):
                raise ValueError(f"every epsilon level must be a finite number > 0; got {e}")
        # A grid is keyed by its arm and its level written to six significant digits
        # (sweeper.sweeps.stored.grid_key): two levels that write alike would be one grid.
        seen: dict[str, float] = {}
        for e in v:
            key = f"{e:g}"
            if key in seen:
                raise ValueError(
                    f"epsilon levels must differ: {seen[key]!r} and {e!r} are the same level "
                    f"({key}) to six significant digits; remove one"
                )
            seen[key] = e
        return v

    @field_validator("accountant")
    @classmethod
    def _accountant(cls, v: str) -> str:
        # One table of names (dpsweep.accountants), a legacy one read as a spec's; the name
        # is checked against the accountant registry (plug-ins included) when the sweep is
        # planned, as strategy names are (torch-free; dpsweep imports no registry).
        v = canonical_accountant(v.strip())
        if not v:
            raise ValueError("privacy.accountant must name an accountant (e.g. pld)")
        return v

    @model_validator(mode="after")
    def _ps(self) -> PrivacyConfig:
        if self.accounting == "papernot-steinke" and self.distribution is None:
            raise ValueError(
                "accounting papernot-steinke needs a distribution "
                "(e.g. distribution: {name: logarithmic})"
            )
        if self.accounting != "papernot-steinke" and self.distribution is not None:
            raise ValueError("distribution applies only to accounting papernot-steinke")
        if self.accounting == "papernot-steinke" and self.retries:
            raise ValueError(
                "retries do not apply to accounting papernot-steinke: an interrupted random-"
                "search trial is not re-run (its count is part of the guarantee); set retries: 0"
            )
        return self


__all__ = ["ACCOUNTING_METHODS", "DISTRIBUTIONS", "PrivacyConfig", "SearchDistribution"]
