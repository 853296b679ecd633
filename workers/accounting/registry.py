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
accountant: ``epsilon`` (from the noise used), ``calibrator`` (the smallest noise multiplier
that fits a target; by default the one shared calibrator,
:func:`workers.accounting.calibrator.calibrate_noise`, over the descriptor's own epsilon) and
``schedule`` (a grid's charge schedule: the cumulative epsilon of its first j runs; by
default each prefix by ``epsilon`` itself, the PLD's by self-composition). A plug-in writes
these three with the inputs spelled out as keywords (:class:`EpsilonFn`, :class:`CalibrateFn`,
:class:`RunEpsilonsFn`: the plug-in contract); dpsweep calls them through the descriptor's
methods, which take the run's :class:`~dpsweep.accounting_inputs.AccountingInputs` whole. Whatever a
descriptor brings, its calibrated multiplier is re-checked with its own ``epsilon`` (fail
closed). The schedule's verifier is accountant-agnostic and has one implementation
(:func:`sweeper.privacy.charges.charge_schedule`: cumulative, agreeing with the plan's
figure, within the budget), and every plan is verified by an independent second accountant
(:func:`sweeper.privacy.verification.verify_plan`) whichever accountant planned it.

**Names.** The built-in accountants' names, what each computes, the legacy names and the
defaults are one table, :mod:`dpsweep.accountants`; this module attaches each built-in row's
epsilon to it. A legacy name (``prv``, ``rdp``, ``rdp (RepeatAndSelect)``) means different
accountants in a spec or stored plan and in a worker's record, so each reader says which it
reads: :func:`spec_accountant` and :func:`plan_accountant` (dp_accounting's), and
:func:`worker_accountant` (Opacus's). Past them everything carries canonical names, inside an
:class:`dpsweep.accounting_inputs.AccountingInputs`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from dpsweep.accountants import ACCOUNTANTS, PLAN, WORKER, Context, resolve
from dpsweep.accountants import WORKER_ALIASES as WORKER_ALIASES  # re-exported: the table's
from dpsweep.accounting_inputs import AccountingInputs
from dpsweep.errors import ConfigError, PrivacyError
from workers.accounting.calibrator import CALIBRATION_SLACK, calibrate_noise
from workers.accounting.epsilon import (
    dp_rdp_epsilon,
    opacus_epsilon,
    pld_epsilon,
    pld_run_epsilons,
)
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
    argument checking: :class:`~dpsweep.accounting_inputs.AccountingInputs` does that.

    ``calibrator`` and ``schedule``: optional replacements of the shared calibrator and of the
    prefix-by-prefix charge schedule (see :meth:`calibrate_for` and :meth:`run_epsilons_for`).
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

    def inputs(self, **fields: object) -> AccountingInputs:
        """An :class:`AccountingInputs` for this accountant (``fields``: the value's)."""
        return AccountingInputs(accountant=self.name, **fields)  # type: ignore[arg-type]

    def _own(self, inputs: AccountingInputs) -> None:
        # The inputs name the accountant that answers: one asked another's question would
        # report a figure under the wrong name (fail closed).
        if inputs.accountant != self.name:
            raise PrivacyError(
                f"the {self.name} accountant was asked about inputs for {inputs.accountant!r}"
            )

    def epsilon_for(self, inputs: AccountingInputs) -> float:
        """This accountant's epsilon of ``inputs`` (cached for a registered accountant)."""
        self._own(inputs)
        if _REGISTRY.get(self.name) is not self:  # not registered (yet): no shared cache
            return self.epsilon(**inputs.library_keywords())
        return _cached_epsilon(inputs)

    def calibrate_for(
        self,
        inputs: AccountingInputs,
        *,
        target_epsilon: float,
        max_noise_multiplier: float = DEFAULT_MAX_NOISE_MULTIPLIER,
        slack: float = CALIBRATION_SLACK,
    ) -> float:
        """The noise multiplier whose epsilon (with the evaluation releases) fits the target.

        ``inputs``' noise multiplier is the unknown and not read. ``slack``: how far below the
        target (a fraction of it) the shared calibrator may land; a descriptor's own
        ``calibrator`` decides its own precision. Returns ``inf`` when no multiplier up to ``8
        * max_noise_multiplier`` fits. The result is re-checked with this accountant's
        ``epsilon``: one above ``target_epsilon`` is never returned (fail closed).

        Raises:
            PrivacyError: the calibrator returned an invalid multiplier or one that overshoots.
        """
        self._own(inputs)
        sigma = self._search(inputs, target_epsilon, max_noise_multiplier, slack)
        if sigma == math.inf:
            return sigma
        if not (sigma > 0 and math.isfinite(sigma)):
            raise PrivacyError(
                f"the {self.name} accountant calibrated an invalid multiplier {sigma}"
            )
        eps = self.epsilon_for(inputs.with_noise(sigma))
        if not eps <= target_epsilon:
            raise PrivacyError(
                f"calibrated noise multiplier {sigma:.4f} gives epsilon {eps:.4f} > target "
                f"{target_epsilon} ({self.name}); refusing to run"
            )
        return sigma

    def _search(
        self, inputs: AccountingInputs, target_epsilon: float, max_sigma: float, slack: float
    ) -> float:
        """The calibrator's answer, unchecked: the shared one's, or the descriptor's own."""
        if self.calibrator is not None:
            return float(
                self.calibrator(
                    target_epsilon=target_epsilon,
                    target_delta=inputs.delta,
                    sample_rate=inputs.sample_rate,
                    steps=inputs.steps,
                    max_noise_multiplier=max_sigma,
                    eval_noise_multiplier=inputs.eval_noise_multiplier,
                    eval_releases=inputs.evaluations,
                )
            )
        return calibrate_noise(
            lambda sigma: self.epsilon_for(inputs.with_noise(sigma)),
            inputs,
            target_epsilon=target_epsilon,
            max_noise_multiplier=max_sigma,
            slack=slack,
        )

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
        """:meth:`calibrate_for` with the inputs spelled out (a plug-in's own calibrator may
        wrap a shared descriptor's so)."""
        inputs = self.inputs(
            noise_multiplier=None,
            sample_rate=sample_rate,
            steps=steps,
            delta=target_delta,
            eval_noise_multiplier=eval_noise_multiplier,
            evaluations=eval_releases,
        )
        return self.calibrate_for(
            inputs,
            target_epsilon=target_epsilon,
            max_noise_multiplier=max_noise_multiplier,
            slack=slack,
        )

    def run_epsilons_for(self, inputs: AccountingInputs, runs: int) -> list[float]:
        """The charge schedule's figures: the epsilon of the first j runs, j = 1..``runs``.

        One run is ``inputs`` (its steps and evaluation releases). By default each prefix is
        this accountant's ``epsilon`` of j such runs.
        """
        self._own(inputs)
        if self.schedule is not None:
            kw = inputs.library_keywords()
            return [float(e) for e in self.schedule(runs=runs, **kw)]
        return [self.epsilon(**inputs.repeated(j).library_keywords()) for j in range(1, runs + 1)]

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
        """:meth:`run_epsilons_for` with the inputs spelled out."""
        inputs = self.inputs(
            noise_multiplier=noise_multiplier,
            sample_rate=sample_rate,
            steps=steps,
            delta=target_delta,
            eval_noise_multiplier=eval_noise_multiplier,
            evaluations=eval_releases,
        )
        return self.run_epsilons_for(inputs, runs)


_REGISTRY: dict[str, AccountantDescriptor] = {}

FIELD = "privacy.accountant"


def register_accountant(descriptor: AccountantDescriptor) -> AccountantDescriptor:
    """Add an accountant; a name registered twice, or a legacy name, is refused."""
    if descriptor.name in _REGISTRY:
        raise ValueError(f"accountant {descriptor.name!r} is already registered")
    if resolve(descriptor.name, PLAN) != descriptor.name or descriptor.name in WORKER_ALIASES:
        raise ValueError(f"accountant {descriptor.name!r} is a legacy name; choose another")
    _REGISTRY[descriptor.name] = descriptor
    return descriptor


@functools.lru_cache(maxsize=8192)
def _cached_epsilon(inputs: AccountingInputs) -> float:
    # Calibration, the planner and the trials of a grid ask the same figures many times
    # (Opacus's RDP takes ~0.1 s a call): the exact same question is answered once.
    return _REGISTRY[inputs.accountant].epsilon(**inputs.library_keywords())


def clear_epsilon_cache() -> None:
    """Forget every cached epsilon (a test that unregisters a plug-in: its name may return)."""
    _cached_epsilon.cache_clear()


def epsilon_of(inputs: AccountingInputs) -> float:
    """The registered accountant ``inputs.accountant``'s epsilon of ``inputs``, cached.

    Raises:
        ConfigError: unknown accountant (field ``privacy.accountant``), or no noise multiplier.
    """
    return get_accountant(inputs.accountant).epsilon_for(inputs)


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
    """:func:`epsilon_of` with the inputs spelled out (``name``: a registered accountant)."""
    return get_accountant(name).epsilon_for(
        AccountingInputs(
            noise_multiplier=noise_multiplier,
            sample_rate=sample_rate,
            steps=steps,
            delta=target_delta,
            eval_noise_multiplier=eval_noise_multiplier,
            evaluations=eval_releases,
            accountant=name,
        )
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


def _unknown(name: object, where: str | None = None) -> ConfigError:
    # The choices are the canonical names only: a legacy name is read, never offered.
    at = f" ({where})" if where else ""
    return ConfigError(
        f"unknown accountant {name!r}{at}; choose one of: {', '.join(accountant_names())}",
        field=FIELD,
    )


def get_accountant(name: str) -> AccountantDescriptor:
    """The accountant registered as ``name`` (a canonical name, not a legacy alias).

    Raises:
        ConfigError: unknown name (field ``privacy.accountant``; the message lists the names).
    """
    if _known(name):
        return _REGISTRY[name]
    raise _unknown(name)


def _resolve(name: str, context: Context, where: str) -> AccountantDescriptor:
    canonical = resolve(name, context) if isinstance(name, str) else name
    if _known(canonical):
        return _REGISTRY[canonical]
    raise _unknown(name, where)


def spec_accountant(name: str) -> AccountantDescriptor:
    """The accountant a spec's ``privacy.accountant`` names (legacy ``prv`` = ``pld``)."""
    return _resolve(name, PLAN, "spec privacy.accountant")


def plan_accountant(name: str) -> AccountantDescriptor:
    """The accountant a (stored) grid plan's ``accountant`` field names."""
    return _resolve(name, PLAN, "grid plan")


def worker_accountant(name: str) -> AccountantDescriptor:
    """The accountant a worker's ``accountant`` names (legacy ``rdp``/``prv`` = Opacus's)."""
    return _resolve(name, WORKER, "worker")


#: Which per-trial accountant a grid's trials report their single-run epsilon with, by the
#: grid plan's (canonical) accountant: the table's ``trial_accountant`` column.
PLAN_TO_WORKER: Mapping[str, str] = {
    a.name: a.trial_accountant for a in ACCOUNTANTS.values() if a.trial_accountant is not None
}


def trial_accountant_for_plan(plan_name: str) -> str:
    """The canonical name a grid's workers compute single-run epsilon with.

    A built-in plan accountant's trials use the table's ``trial_accountant`` (every non-PLD
    plan ran its trials with Opacus's RDP before the registry, and still does); a plug-in's
    plans' trials are accounted by the plug-in itself; anything else is refused.

    Raises:
        ConfigError: the stored plan's accountant is not one dpsweep knows.
    """
    name = resolve(plan_name, PLAN) if isinstance(plan_name, str) else None
    if name in PLAN_TO_WORKER:
        return get_accountant(PLAN_TO_WORKER[name]).name
    if name is not None and name not in ACCOUNTANTS and _known(name) and _REGISTRY[name].plannable:
        return name
    raise ConfigError(
        f"the grid's stored accountant {plan_name!r} has no per-trial accountant; known: "
        f"{', '.join(PLAN_TO_WORKER)} and plug-in accountants",
        field=FIELD,
    )


# -------------------------------------------------------------------------------------------
# The built-in accountants: the table's rows (dpsweep.accountants) with their epsilon
# (workers.accounting.epsilon imports each library when called).


def _opacus_rdp(**kw: object) -> float:
    return opacus_epsilon("rdp", **kw)  # type: ignore[arg-type]


def _opacus_prv(**kw: object) -> float:
    return opacus_epsilon("prv", **kw)  # type: ignore[arg-type]


_BUILTIN_EPSILON: Mapping[str, tuple[EpsilonFn, RunEpsilonsFn | None]] = {
    "pld": (pld_epsilon, pld_run_epsilons),
    "dp-rdp": (dp_rdp_epsilon, None),
    "opacus-rdp": (_opacus_rdp, None),
    "opacus-prv": (_opacus_prv, None),
}

for _row in ACCOUNTANTS.values():
    _epsilon, _schedule = _BUILTIN_EPSILON[_row.name]
    register_accountant(
        AccountantDescriptor(
            name=_row.name,
            description=_row.computes,
            library=_row.library,
            tight=_row.tight,
            epsilon=_epsilon,
            schedule=_schedule,
            plannable=_row.plannable,
        )
    )

#: The built-in accountants' names, in the table's order (plug-ins come later).
BUILTIN_ACCOUNTANTS: tuple[str, ...] = tuple(ACCOUNTANTS)
