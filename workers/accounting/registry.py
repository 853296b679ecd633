"""The accountant registry: every privacy accountant dpsweep can compute epsilon with.

Each accountant has a stable, unambiguous ``name`` (what new records store) and says what it
is: the library behind it, and whether it is ``tight`` (a numerically tight estimate of the
composed privacy loss: PLD, PRV) or a looser upper bound (RDP). This module imports no
accountant library and never torch: each ``epsilon`` imports its library when called
(:mod:`workers.accounting.epsilon`). Plug-ins (entry points of the group
``dpsweep.accountants``, :mod:`workers.plugins`) add accountants with
:func:`register_accountant`; they are loaded the first time the names are listed or a
name is not found.

Registered here (numbers identical to what each call site computed before the registry):

* ``pld``: dp_accounting's privacy-loss-distribution accountant (pessimistic discretisation);
  what the planner calibrates compose/basic grids with by default. Tight.
* ``dp-rdp``: dp_accounting's RDP accountant; the planner's RDP option. Upper bound.
* ``opacus-rdp``: Opacus's RDP accountant; a training run's default single-run epsilon.
* ``opacus-prv``: Opacus's PRV accountant (Gopi et al. 2021). Tight.

**The contract.** A descriptor is everything the planner and the runner need from an
accountant: ``epsilon`` (from the noise used), ``calibrate`` (the smallest noise multiplier
that fits a target, keyword-only; by default the one shared calibrator,
:func:`workers.accounting.calibrator.calibrate_sigma`, over the descriptor's own epsilon) and
``run_epsilons`` (a grid's charge schedule: the cumulative epsilon of its first j runs; by
default each prefix by ``epsilon`` itself, the PLD's by self-composition). Whatever a
descriptor brings, its calibrated multiplier is re-checked with its own ``epsilon`` (fail
closed). The schedule's verifier is accountant-agnostic and has one implementation
(:func:`sweeper.privacy.charges.charge_schedule`: cumulative, agreeing with the plan's
figure, within the budget), and every plan is verified by an independent second accountant
(:func:`sweeper.privacy.verification.verify_plan`) whichever accountant planned it.

**Legacy names.** Specs and stored plans said ``prv`` (dp_accounting PLD), ``rdp`` and
``rdp (RepeatAndSelect)`` (dp_accounting RDP): one table,
:data:`dpsweep.accountants.LEGACY_ACCOUNTANTS`, reads them (:func:`spec_accountant`,
:func:`plan_accountant`). A worker's names are older and mean other accountants: ``rdp``
is Opacus RDP and ``prv`` Opacus PRV (:data:`WORKER_ALIASES`, ``compute_epsilon``'s and
``dpsweep train --accountant``'s historical names); they cannot share the table.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from dpsweep.accountants import LEGACY_ACCOUNTANTS
from dpsweep.errors import ConfigError, PrivacyError
from workers.accounting.calibrator import CALIBRATION_SLACK, calibrate_sigma
from workers.accounting.epsilon import (
    PLD_DISCRETIZATION,
    dp_rdp_epsilon,
    opacus_epsilon,
    pld_epsilon,
)
from workers.accounting.gaussian_pld import gaussian_pld, self_compose
from workers.plugins import load_plugins


class EpsilonFn(Protocol):
    def __call__(
        self,
        *,
        noise_multiplier: float,
        sample_rate: float,
        steps: int,
        target_delta: float,
        eval_noise_multiplier: float | None = None,
        eval_releases: int = 0,
    ) -> float: ...


class CalibrateFn(Protocol):
    def __call__(
        self,
        *,
        target_epsilon: float,
        target_delta: float,
        sample_rate: float,
        steps: int,
        max_noise_multiplier: float,
        eval_noise_multiplier: float | None = None,
        eval_releases: int = 0,
    ) -> float: ...


class RunEpsilonsFn(Protocol):
    def __call__(
        self,
        *,
        noise_multiplier: float,
        sample_rate: float,
        steps: int,
        runs: int,
        target_delta: float,
        eval_noise_multiplier: float | None = None,
        eval_releases: int = 0,
    ) -> Sequence[float]: ...


#: ``calibrate``'s default search limit: up to 8 times this multiplier (then ``inf``).
DEFAULT_MAX_NOISE_MULTIPLIER = 1280.0


@dataclass(frozen=True)
class AccountantDescriptor:
    """One accountant: its stable name, what it is, its epsilon, calibration and charges.

    ``epsilon`` answers for ``steps`` Poisson-subsampled Gaussian steps of multiplier
    ``noise_multiplier`` at rate ``sample_rate``, plus ``eval_releases`` plain Gaussians of
    multiplier ``eval_noise_multiplier`` (DP evaluation), at ``target_delta``. It does no
    argument checking: :func:`workers.accounting.compute.compute_epsilon` does that.

    ``calibrator`` and ``schedule``: optional replacements of the shared calibrator and of the
    prefix-by-prefix charge schedule (see :meth:`calibrate` and :meth:`run_epsilons`).
    ``plannable``: whether the (torch-free) planner may calibrate grids with it.
    """

    name: str
    description: str
    library: str
    tight: bool
    epsilon: EpsilonFn
    calibrator: CalibrateFn | None = None
    schedule: RunEpsilonsFn | None = None
    plannable: bool = True

    def calibrate(
        self,
        *,
        target_epsilon: float,
        target_delta: float,
        sample_rate: float,
        steps: int,
        max_noise_multiplier: float = DEFAULT_MAX_NOISE_MULTIPLIER,
        eval_noise_multiplier: float | None = None,
        eval_releases: int = 0,
        slack: float = CALIBRATION_SLACK,
    ) -> float:
        """The noise multiplier whose epsilon (with the evaluation releases) fits the target.

        ``slack``: how far below the target (a fraction of it) the shared calibrator may land;
        a descriptor's own ``calibrator`` decides its own precision. Returns ``inf`` when no
        multiplier up to ``8 * max_noise_multiplier`` fits. The result is re-checked with this
        accountant's ``epsilon``: one above ``target_epsilon`` is never returned (fail closed).

        Raises:
            PrivacyError: the calibrator returned an invalid multiplier or one that overshoots.
        """

        def epsilon_of(sigma: float) -> float:
            if _REGISTRY.get(self.name) is not self:  # not registered (yet): no shared cache
                return self.epsilon(
                    noise_multiplier=sigma,
                    sample_rate=sample_rate,
                    steps=steps,
                    target_delta=target_delta,
                    eval_noise_multiplier=eval_noise_multiplier,
                    eval_releases=eval_releases,
                )
            return _cached_epsilon(
                self.name,
                sigma,
                sample_rate,
                steps,
                target_delta,
                eval_noise_multiplier,
                eval_releases,
            )

        if self.calibrator is None:
            # The releases composed to one Gaussian (the calibrator's initial guess only).
            one_eval = (
                None
                if eval_noise_multiplier is None or not eval_releases
                else eval_noise_multiplier / math.sqrt(eval_releases)
            )
            sigma = calibrate_sigma(
                epsilon_of,
                target_epsilon=target_epsilon,
                target_delta=target_delta,
                sample_rate=sample_rate,
                steps=steps,
                max_noise_multiplier=max_noise_multiplier,
                eval_noise_multiplier=one_eval,
                slack=slack,
            )
        else:
            sigma = float(
                self.calibrator(
                    target_epsilon=target_epsilon,
                    target_delta=target_delta,
                    sample_rate=sample_rate,
                    steps=steps,
                    max_noise_multiplier=max_noise_multiplier,
                    eval_noise_multiplier=eval_noise_multiplier,
                    eval_releases=eval_releases,
                )
            )
        if sigma == math.inf:
            return sigma
        if not (sigma > 0 and math.isfinite(sigma)):
            raise PrivacyError(
                f"the {self.name} accountant calibrated an invalid multiplier {sigma}"
            )
        eps = epsilon_of(sigma)
        if not eps <= target_epsilon:
            raise PrivacyError(
                f"calibrated noise multiplier {sigma:.4f} gives epsilon {eps:.4f} > target "
                f"{target_epsilon} ({self.name}); refusing to run"
            )
        return sigma

    def run_epsilons(
        self,
        *,
        noise_multiplier: float,
        sample_rate: float,
        steps: int,
        runs: int,
        target_delta: float,
        eval_noise_multiplier: float | None = None,
        eval_releases: int = 0,
    ) -> list[float]:
        """The charge schedule's figures: the epsilon of the first j runs, j = 1..``runs``.

        Each run is ``steps`` steps and ``eval_releases`` evaluation releases. By default each
        prefix is this accountant's ``epsilon`` of ``j * steps`` steps and ``j *
        eval_releases`` releases.
        """
        if self.schedule is not None:
            return [
                float(e)
                for e in self.schedule(
                    noise_multiplier=noise_multiplier,
                    sample_rate=sample_rate,
                    steps=steps,
                    runs=runs,
                    target_delta=target_delta,
                    eval_noise_multiplier=eval_noise_multiplier,
                    eval_releases=eval_releases,
                )
            ]
        return [
            self.epsilon(
                noise_multiplier=noise_multiplier,
                sample_rate=sample_rate,
                steps=j * steps,
                target_delta=target_delta,
                eval_noise_multiplier=eval_noise_multiplier,
                eval_releases=j * eval_releases,
            )
            for j in range(1, runs + 1)
        ]


_REGISTRY: dict[str, AccountantDescriptor] = {}

FIELD = "privacy.accountant"


def register_accountant(descriptor: AccountantDescriptor) -> AccountantDescriptor:
    """Add an accountant; a name registered twice is refused."""
    if descriptor.name in _REGISTRY:
        raise ValueError(f"accountant {descriptor.name!r} is already registered")
    _REGISTRY[descriptor.name] = descriptor
    return descriptor


@functools.lru_cache(maxsize=8192)
def _cached_epsilon(
    name: str,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    target_delta: float,
    eval_noise_multiplier: float | None,
    eval_releases: int,
) -> float:
    # Calibration and the planner ask the same figures many times (planned_epsilon).
    return _REGISTRY[name].epsilon(
        noise_multiplier=noise_multiplier,
        sample_rate=sample_rate,
        steps=steps,
        target_delta=target_delta,
        eval_noise_multiplier=eval_noise_multiplier,
        eval_releases=eval_releases,
    )


def cached_epsilon(
    name: str,
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    target_delta: float,
    eval_noise_multiplier: float | None = None,
    eval_releases: int = 0,
) -> float:
    """The registered accountant ``name``'s epsilon, cached (what calibration asked)."""
    get_accountant(name)
    return _cached_epsilon(
        name,
        noise_multiplier,
        sample_rate,
        steps,
        target_delta,
        eval_noise_multiplier,
        eval_releases,
    )


def accountant_names() -> tuple[str, ...]:
    """The registered accountants' names, plug-ins' included."""
    load_plugins("accountants")
    return tuple(_REGISTRY)


def _known(name: object) -> bool:
    """Whether ``name`` is a registered accountant's name (plug-ins are loaded on a miss)."""
    if isinstance(name, str) and name not in _REGISTRY:
        load_plugins("accountants")
    return isinstance(name, str) and name in _REGISTRY


def get_accountant(name: str) -> AccountantDescriptor:
    """The accountant registered as ``name`` (a canonical name, not a legacy alias).

    Raises:
        ConfigError: unknown name (field ``privacy.accountant``; the message lists the names).
    """
    if _known(name):
        return _REGISTRY[name]
    raise ConfigError(
        f"unknown accountant {name!r}; choose one of: {', '.join(accountant_names())}",
        field=FIELD,
    )


def _resolve(name: str, aliases: Mapping[str, str], where: str) -> AccountantDescriptor:
    if isinstance(name, str) and name in aliases:
        return get_accountant(aliases[name])
    if _known(name):
        return _REGISTRY[name]
    known = [*accountant_names(), *(a for a in aliases if a not in _REGISTRY)]
    raise ConfigError(
        f"unknown accountant {name!r} ({where}); choose one of: {', '.join(known)}",
        field=FIELD,
    )


# A worker's (PackSpec, TrialResult, compute_epsilon, dpsweep train) historical names: "rdp"
# and "prv" mean Opacus's accountants here, not what they meant in specs and plans
# (dpsweep.accountants.LEGACY_ACCOUNTANTS), so the two cannot be one table.
WORKER_ALIASES: Mapping[str, str] = {"rdp": "opacus-rdp", "prv": "opacus-prv"}


def spec_accountant(name: str) -> AccountantDescriptor:
    """The accountant a spec's ``privacy.accountant`` names (legacy ``prv`` = ``pld``)."""
    return _resolve(name, LEGACY_ACCOUNTANTS, "spec privacy.accountant")


def plan_accountant(name: str) -> AccountantDescriptor:
    """The accountant a (stored) grid plan's ``accountant`` field names."""
    return _resolve(name, LEGACY_ACCOUNTANTS, "grid plan")


def worker_accountant(name: str) -> AccountantDescriptor:
    """The accountant a worker's ``accountant`` names (legacy ``rdp``/``prv`` = Opacus's)."""
    return _resolve(name, WORKER_ALIASES, "worker")


# Which per-trial accountant a grid's trials report their single-run epsilon with, by the
# grid plan's (canonical) accountant. Before the registry every non-PLD plan (dp_accounting RDP
# compose/basic, papernot-steinke's RepeatAndSelect) ran its trials with Opacus's RDP; the
# mapping keeps those numbers. A plug-in accountant's plan runs its trials with the plug-in
# itself; anything else is refused (it used to become Opacus RDP).
PLAN_TO_WORKER: Mapping[str, str] = {"pld": "pld", "dp-rdp": "opacus-rdp"}


def trial_accountant_for_plan(plan_name: str) -> str:
    """The canonical name a grid's workers compute single-run epsilon with.

    Raises:
        ConfigError: the stored plan's accountant is not one dpsweep knows.
    """
    name = LEGACY_ACCOUNTANTS.get(plan_name, plan_name) if isinstance(plan_name, str) else None
    if name in PLAN_TO_WORKER:
        return get_accountant(PLAN_TO_WORKER[name]).name
    if (
        name is not None
        and name not in BUILTIN_ACCOUNTANTS
        and _known(name)
        and _REGISTRY[name].plannable
    ):
        return name  # a plug-in: its plans' trials are accounted by the plug-in itself
    raise ConfigError(
        f"the grid's stored accountant {plan_name!r} has no per-trial accountant; known: "
        f"{', '.join([*PLAN_TO_WORKER, *LEGACY_ACCOUNTANTS])} and plug-in accountants",
        field=FIELD,
    )


# -------------------------------------------------------------------------------------------
# The built-in accountants (workers.accounting.epsilon imports each library when called).


def _opacus(kind: str) -> Callable[..., float]:
    def fn(**kw: object) -> float:
        return opacus_epsilon(kind, **kw)  # type: ignore[arg-type]

    return fn


def _pld_run_epsilons(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    runs: int,
    target_delta: float,
    eval_noise_multiplier: float | None = None,
    eval_releases: int = 0,
) -> list[float]:
    """PLD's charge schedule: one run's PLD composed with itself run by run.

    Each prefix is a pessimistic upper bound on the composed privacy loss, the same accountant
    the plan was calibrated with. DP evaluation: each run's E releases (Gaussian, sensitivity
    1) compose exactly as one Gaussian of multiplier sigma_e / sqrt(E).
    """
    one = self_compose(
        gaussian_pld(
            noise_multiplier=noise_multiplier,
            sample_rate=sample_rate,
            value_discretization_interval=PLD_DISCRETIZATION,
        ),
        steps,
    )
    if eval_releases and eval_noise_multiplier is not None:
        one = one.compose(
            gaussian_pld(
                noise_multiplier=float(eval_noise_multiplier) / eval_releases**0.5,
                value_discretization_interval=PLD_DISCRETIZATION,
            )
        )
    out, cur = [], one
    for j in range(1, runs + 1):
        if j > 1:
            cur = cur.compose(one)
        out.append(float(cur.get_epsilon_for_delta(target_delta)))
    return out


register_accountant(
    AccountantDescriptor(
        name="pld",
        description="privacy loss distribution, pessimistic discretisation; the planner's "
        "default calibration",
        library="dp_accounting PLD",
        tight=True,
        epsilon=pld_epsilon,
        schedule=_pld_run_epsilons,
    )
)
register_accountant(
    AccountantDescriptor(
        name="dp-rdp",
        description="Renyi DP over dp_accounting's orders; a loose upper bound",
        library="dp_accounting RDP",
        tight=False,
        epsilon=dp_rdp_epsilon,
    )
)
register_accountant(
    AccountantDescriptor(
        name="opacus-rdp",
        description="Renyi DP over Opacus's orders; a loose upper bound (imports torch)",
        library="Opacus RDP",
        tight=False,
        epsilon=_opacus("rdp"),
        plannable=False,
    )
)
register_accountant(
    AccountantDescriptor(
        name="opacus-prv",
        description="privacy random variables (Gopi et al. 2021) (imports torch)",
        library="Opacus PRV",
        tight=True,
        epsilon=_opacus("prv"),
        plannable=False,
    )
)

#: The built-in accountants' names, in registration order (plug-ins come later).
BUILTIN_ACCOUNTANTS: tuple[str, ...] = tuple(_REGISTRY)
