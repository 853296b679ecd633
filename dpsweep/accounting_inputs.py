"""A run's accounting inputs, as one checked value (torch-free, no accountant library).

What an accountant is asked about a DP-SGD run is always the same six numbers: ``steps``
Poisson-subsampled Gaussian steps of multiplier ``noise_multiplier`` at rate ``sample_rate``,
plus ``evaluations`` plain Gaussian releases of multiplier ``eval_noise_multiplier`` (DP
evaluation: sensitivity 1, no subsampling), at ``delta``; and the ``accountant`` that answers.
:class:`AccountingInputs` carries them whole from the planner through the accountants, the
worker's pre-check and the audit, checked once when built.

The accountant is a canonical name (:data:`dpsweep.accountants.ACCOUNTANTS`, or a plug-in's):
a legacy name means different accountants in a spec and in a worker's record, so it is
resolved where it comes in (:func:`dpsweep.accountants.resolve`) and refused here.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, replace
from typing import Any

from dpsweep.accountants import DEFAULT_RUN_ACCOUNTANT, LEGACY_NAMES
from dpsweep.errors import ConfigError, PrivacyError

ACCOUNTANT_FIELD = "privacy.accountant"
# The fields the accounting entry points always named for these inputs' errors.
_FIELDS = {"delta": "privacy.delta", "evaluations": "eval"}


@dataclass(frozen=True, kw_only=True)
class AccountingInputs:
    """What an accountant is asked: the run's mechanism, its delta and the accountant.

    Args:
        noise_multiplier: sigma of every step; ``None`` only where it is what a calibration
            solves for (:meth:`sigma` refuses it for an epsilon).
        sample_rate: the Poisson sampling rate q, in (0, 1].
        steps: the number of steps T, >= 0.
        delta: the delta the epsilon is stated at, in (0, 1).
        eval_noise_multiplier: DP evaluation: sigma_e of each noisy count (``None``: none).
        evaluations: DP evaluation: the number of noisy counts E, >= 0 (without any,
            ``eval_noise_multiplier`` is dropped: it protects nothing).
        accountant: the accountant's canonical name.

    Raises:
        ConfigError: a rate, delta, count or accountant name out of range (the field named as
            the accounting entry points always named it).
        PrivacyError: a multiplier that gives no finite guarantee for the steps or releases
            it would protect (fail closed).
    """

    noise_multiplier: float | None
    sample_rate: float
    steps: int
    delta: float
    eval_noise_multiplier: float | None = None
    evaluations: int = 0
    accountant: str = DEFAULT_RUN_ACCOUNTANT

    def __post_init__(self) -> None:
        self._check_accountant()
        self._check_types()
        if not 0.0 < self.sample_rate <= 1.0:
            raise ConfigError(
                f"sample rate must be in (0, 1]; got {self.sample_rate}", field="sample_rate"
            )
        if not 0.0 < self.delta < 1.0:
            raise ConfigError(f"delta must be in (0, 1); got {self.delta}", field="privacy.delta")
        if self.steps < 0 or int(self.steps) != self.steps:
            raise ConfigError(f"steps must be an integer >= 0; got {self.steps}", field="steps")
        if self.evaluations < 0 or int(self.evaluations) != self.evaluations:
            raise ConfigError(
                f"eval_releases must be an integer >= 0; got {self.evaluations}", field="eval"
            )
        self._check_eval_noise()
        sigma = self.noise_multiplier
        if sigma is not None and self.steps > 0 and not (sigma > 0 and math.isfinite(sigma)):
            raise PrivacyError(
                f"noise multiplier {sigma} gives no finite privacy guarantee; it must be > 0"
            )
        # One representation of each number: the floats the accountants were always given
        # (a numpy scalar or an int rate becomes the same Python float), so equal inputs hash
        # alike in the accountants' caches.
        for name in ("sample_rate", "delta"):
            object.__setattr__(self, name, float(getattr(self, name)))
        for name in ("steps", "evaluations"):
            object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("noise_multiplier", "eval_noise_multiplier"):
            value = getattr(self, name)
            object.__setattr__(self, name, None if value is None else float(value))
        if not self.evaluations:
            # No release to protect: the multiplier means nothing (every accountant ignores it
            # then), and one value per question keeps the caches' keys one.
            object.__setattr__(self, "eval_noise_multiplier", None)

    def _check_accountant(self) -> None:
        if not isinstance(self.accountant, str) or not self.accountant.strip():
            raise ConfigError("an accountant name is required (e.g. pld)", field=ACCOUNTANT_FIELD)
        if self.accountant in LEGACY_NAMES:
            raise ConfigError(
                f"{self.accountant!r} is a legacy accountant name whose meaning depends on where "
                "it was stored; resolve it where it comes in (dpsweep.accountants.resolve)",
                field=ACCOUNTANT_FIELD,
            )

    def _check_types(self) -> None:
        # A bool or a string compares without complaint in places; refuse them by name.
        for name in ("sample_rate", "delta", "steps", "evaluations"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ConfigError(
                    f"{name} must be a number; got {value!r}", field=_FIELDS.get(name, name)
                )
        for name in ("noise_multiplier", "eval_noise_multiplier"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, numbers.Real)
            ):
                raise ConfigError(f"{name} must be a number or None; got {value!r}", field=name)

    def _check_eval_noise(self) -> None:
        sigma_e = self.eval_noise_multiplier
        if self.evaluations and (sigma_e is None or not (sigma_e > 0 and math.isfinite(sigma_e))):
            raise PrivacyError(
                f"evaluation noise multiplier {sigma_e} gives no finite privacy guarantee for "
                "the noisy evaluations; it must be > 0"
            )

    @property
    def sigma(self) -> float:
        """The noise multiplier, which an epsilon needs.

        Raises:
            ConfigError: it is ``None`` (inputs meant for a calibration).
        """
        if self.noise_multiplier is None:
            raise ConfigError(
                "an epsilon needs the noise multiplier; these inputs leave it to calibration",
                field="noise_multiplier",
            )
        return self.noise_multiplier

    @property
    def composed_eval_noise(self) -> float | None:
        """The one Gaussian multiplier the E releases compose to (sigma_e / sqrt(E)), or None."""
        if not self.evaluations or self.eval_noise_multiplier is None:
            return None
        return self.eval_noise_multiplier / math.sqrt(self.evaluations)

    def with_noise(self, noise_multiplier: float) -> AccountingInputs:
        """The same run at another noise multiplier (what a calibration tries)."""
        return replace(self, noise_multiplier=noise_multiplier)

    def with_accountant(self, accountant: str) -> AccountingInputs:
        """The same run asked of another (canonical) accountant."""
        return replace(self, accountant=accountant)

    def repeated(self, runs: int) -> AccountingInputs:
        """``runs`` such runs composed: ``runs`` times the steps and the evaluations."""
        return replace(self, steps=runs * self.steps, evaluations=runs * self.evaluations)

    def library_keywords(self) -> dict[str, Any]:
        """The keywords of an accountant's ``epsilon`` (the plug-in contract,
        :class:`workers.accounting.registry.EpsilonFn`), without the accountant's name."""
        return {
            "noise_multiplier": self.sigma,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
            "target_delta": self.delta,
            "eval_noise_multiplier": self.eval_noise_multiplier,
            "eval_releases": self.evaluations,
        }

    def to_json(self) -> dict[str, Any]:
        """A JSON object of the fields (:meth:`from_json` reads it back equal)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AccountingInputs:
        """Read :meth:`to_json`'s object back (checked as when built).

        Raises:
            ConfigError: an unknown field, or a value out of range (as the constructor).
        """
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown accounting input(s): {', '.join(sorted(unknown))}")
        return cls(**data)
