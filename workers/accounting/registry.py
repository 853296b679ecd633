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

**Legacy names.** Before the registry, ``rdp`` and ``prv`` meant different accountants in
different places, and stored specs, plans and trial results carry them. They are read through
one explicit table per place, never guessed:

* spec ``privacy.accountant`` (:data:`SPEC_ALIASES`): ``prv`` meant dp_accounting PLD,
  ``rdp`` dp_accounting RDP;
* a stored grid plan's ``accountant`` (:data:`PLAN_ALIASES`): ``rdp`` is dp_accounting RDP,
  and papernot-steinke plans say ``rdp (RepeatAndSelect)`` (dp_accounting RDP);
* a worker's / trial result's accountant (:data:`WORKER_ALIASES`): ``rdp`` is Opacus RDP and
  ``prv`` Opacus PRV (``workers.accounting.compute.compute_epsilon``'s historical names).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from dpsweep.errors import ConfigError
from workers.accounting.epsilon import dp_rdp_epsilon, opacus_epsilon, pld_epsilon
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


@dataclass(frozen=True)
class AccountantDescriptor:
    """One accountant: its stable name, what it is, and its epsilon.

    ``epsilon`` answers for ``steps`` Poisson-subsampled Gaussian steps of multiplier
    ``noise_multiplier`` at rate ``sample_rate``, plus ``eval_releases`` plain Gaussians of
    multiplier ``eval_noise_multiplier`` (DP evaluation), at ``target_delta``. It does no
    argument checking: :func:`workers.accounting.compute.compute_epsilon` does that.
    """

    name: str
    description: str
    library: str
    tight: bool
    epsilon: EpsilonFn


_REGISTRY: dict[str, AccountantDescriptor] = {}

FIELD = "privacy.accountant"


def register_accountant(descriptor: AccountantDescriptor) -> AccountantDescriptor:
    """Add an accountant; a name registered twice is refused."""
    if descriptor.name in _REGISTRY:
        raise ValueError(f"accountant {descriptor.name!r} is already registered")
    _REGISTRY[descriptor.name] = descriptor
    return descriptor


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


# Spec privacy.accountant: "prv" has always meant dp_accounting's PLD (stored specs say it).
SPEC_ALIASES: Mapping[str, str] = {"prv": "pld", "rdp": "dp-rdp"}
# A stored grid plan's accountant, as the planner wrote it.
PLAN_ALIASES: Mapping[str, str] = {"rdp": "dp-rdp", "rdp (RepeatAndSelect)": "dp-rdp"}
# A worker's (PackSpec, TrialResult, compute_epsilon) historical names.
WORKER_ALIASES: Mapping[str, str] = {"rdp": "opacus-rdp", "prv": "opacus-prv"}


def spec_accountant(name: str) -> AccountantDescriptor:
    """The accountant a spec's ``privacy.accountant`` names (legacy ``prv`` = ``pld``)."""
    return _resolve(name, SPEC_ALIASES, "spec privacy.accountant")


def plan_accountant(name: str) -> AccountantDescriptor:
    """The accountant a (stored) grid plan's ``accountant`` field names."""
    return _resolve(name, PLAN_ALIASES, "grid plan")


def worker_accountant(name: str) -> AccountantDescriptor:
    """The accountant a worker's ``accountant`` names (legacy ``rdp``/``prv`` = Opacus's)."""
    return _resolve(name, WORKER_ALIASES, "worker")


# Which per-trial accountant a grid's trials report their single-run epsilon with, by the
# grid plan's stored accountant. Before the registry every non-PLD plan (dp_accounting RDP
# compose/basic, papernot-steinke's RepeatAndSelect) ran its trials with Opacus's RDP; the
# mapping keeps those numbers. Anything else is refused (it used to become Opacus RDP).
PLAN_TO_WORKER: Mapping[str, str] = {
    "pld": "pld",
    "dp-rdp": "opacus-rdp",
    "rdp": "opacus-rdp",
    "rdp (RepeatAndSelect)": "opacus-rdp",
}


def trial_accountant_for_plan(plan_name: str) -> str:
    """The canonical name a grid's workers compute single-run epsilon with.

    Raises:
        ConfigError: the stored plan's accountant is not one dpsweep knows.
    """
    if not isinstance(plan_name, str) or plan_name not in PLAN_TO_WORKER:
        raise ConfigError(
            f"the grid's stored accountant {plan_name!r} has no per-trial accountant; known: "
            f"{', '.join(PLAN_TO_WORKER)}",
            field=FIELD,
        )
    return get_accountant(PLAN_TO_WORKER[plan_name]).name


# -------------------------------------------------------------------------------------------
# The built-in accountants (workers.accounting.epsilon imports each library when called).


def _opacus(kind: str) -> Callable[..., float]:
    def fn(**kw: object) -> float:
        return opacus_epsilon(kind, **kw)  # type: ignore[arg-type]

    return fn


register_accountant(
    AccountantDescriptor(
        name="pld",
        description="privacy loss distribution, pessimistic discretisation; the planner's "
        "default calibration",
        library="dp_accounting PLD",
        tight=True,
        epsilon=pld_epsilon,
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
    )
)
register_accountant(
    AccountantDescriptor(
        name="opacus-prv",
        description="privacy random variables (Gopi et al. 2021) (imports torch)",
        library="Opacus PRV",
        tight=True,
        epsilon=_opacus("prv"),
    )
)

#: The built-in accountants' names, in registration order (plug-ins come later).
BUILTIN_ACCOUNTANTS: tuple[str, ...] = tuple(_REGISTRY)
