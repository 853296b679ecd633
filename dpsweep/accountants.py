"""Accountant names: the one table (torch-free, no registry, no accountant library).

Every name dpsweep gives an accountant is a row here: what it computes, whether the
(torch-free) planner may calibrate with it, and, for the three legacy names, what each meant
where it was stored. The registry (:mod:`workers.accounting.registry`) attaches each built-in
row's epsilon to it; a spec's ``privacy.accountant`` (:class:`dpsweep.spec.PrivacyConfig`), the
CLI's help and the docs read their names and the defaults from here.

**One meaning per name.** The canonical names (``pld``, ``dp-rdp``, ``opacus-rdp``,
``opacus-prv``) each name one library's accountant. The legacy names had two meanings, by where
they were written, and stored data keeps them (a stored name means what it meant when stored):

* in a spec or a stored grid plan (:data:`PLAN`): ``prv`` was dp_accounting's PLD (``pld``),
  ``rdp`` dp_accounting's RDP (``dp-rdp``) and ``rdp (RepeatAndSelect)`` dp_accounting's RDP on
  a RepeatAndSelect event (``dp-rdp``; papernot-steinke plans still store it);
* in a worker's record (a ``PackSpec``, a trial row's ``accountant``, ``compute_epsilon``,
  ``dpsweep train --accountant``; :data:`WORKER`): ``rdp`` was Opacus's RDP (``opacus-rdp``)
  and ``prv`` Opacus's PRV (``opacus-prv``).

:func:`resolve` reads a legacy name only with its context said, at the edge where the name
comes in; everything past the edge carries canonical names. Nothing user-facing lists a legacy
name as a choice.

**The defaults.** A sweep's plan is calibrated with :data:`DEFAULT_ACCOUNTANT` (``pld``); a
single run outside a sweep (``dpsweep train``, ``dpsweep audit``'s claim, ``compute_epsilon``)
reports its epsilon with :data:`DEFAULT_RUN_ACCOUNTANT` (``opacus-rdp``). They differ because
the planner never imports torch and the single-run figure has always been Opacus's: changing
either would change the epsilon of runs already made.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

#: Where a legacy name was written: a spec or a stored grid plan, or a worker's record.
Context = Literal["plan", "worker"]
PLAN: Context = "plan"
WORKER: Context = "worker"


@dataclass(frozen=True)
class AccountantName:
    """One canonical accountant name and what it computes.

    Args:
        name: the stable name new records store.
        library: the library whose accountant it is.
        computes: what it computes, in a phrase (the CLI's and the docs' text).
        tight: a numerically tight estimate of the composed loss (PLD, PRV), not an RDP bound.
        plannable: whether the torch-free planner may calibrate a sweep's grids with it.
        trial_accountant: for a plannable accountant, the canonical name a grid's trials report
            their single-run epsilon with (the stored contract of every plan it calibrated).
    """

    name: str
    library: str
    computes: str
    tight: bool
    plannable: bool
    trial_accountant: str | None = None


@dataclass(frozen=True)
class LegacyName:
    """A name older records store, and what it meant in each context (``None``: never there)."""

    name: str
    plan: str | None
    worker: str | None


#: The built-in accountants by their canonical names (plug-ins add theirs to the registry).
ACCOUNTANTS: Mapping[str, AccountantName] = {
    a.name: a
    for a in (
        AccountantName(
            "pld",
            "dp_accounting PLD",
            "privacy loss distribution, pessimistic discretisation; the planner's default "
            "calibration",
            tight=True,
            plannable=True,
            trial_accountant="pld",
        ),
        AccountantName(
            "dp-rdp",
            "dp_accounting RDP",
            "Renyi DP over dp_accounting's orders; a loose upper bound",
            tight=False,
            plannable=True,
            # Before the registry every non-PLD plan ran its trials with Opacus's RDP; kept so.
            trial_accountant="opacus-rdp",
        ),
        AccountantName(
            "opacus-rdp",
            "Opacus RDP",
            "Renyi DP over Opacus's orders; a loose upper bound (imports torch)",
            tight=False,
            plannable=False,
        ),
        AccountantName(
            "opacus-prv",
            "Opacus PRV",
            "privacy random variables (Gopi et al. 2021) (imports torch)",
            tight=True,
            plannable=False,
        ),
    )
}

#: Names older specs, plans and worker records store, each resolved by its context.
LEGACY_NAMES: Mapping[str, LegacyName] = {
    n.name: n
    for n in (
        LegacyName("prv", plan="pld", worker="opacus-prv"),
        LegacyName("rdp", plan="dp-rdp", worker="opacus-rdp"),
        LegacyName("rdp (RepeatAndSelect)", plan="dp-rdp", worker=None),
    )
}

#: A sweep's default ``privacy.accountant``: what its grids are calibrated with.
DEFAULT_ACCOUNTANT = "pld"
#: A single run's default accountant (``dpsweep train``, an audit's claim, ``compute_epsilon``).
DEFAULT_RUN_ACCOUNTANT = "opacus-rdp"


def _aliases(context: Context) -> dict[str, str]:
    out: dict[str, str] = {}
    for legacy in LEGACY_NAMES.values():
        target = legacy.plan if context == PLAN else legacy.worker
        if target is not None:
            out[legacy.name] = target
    return out


#: Legacy spec and plan names -> canonical names (:data:`LEGACY_NAMES` read in :data:`PLAN`).
LEGACY_ACCOUNTANTS: Mapping[str, str] = _aliases(PLAN)
#: Legacy worker names -> canonical names (:data:`LEGACY_NAMES` read in :data:`WORKER`).
WORKER_ALIASES: Mapping[str, str] = _aliases(WORKER)


def resolve(name: str, context: Context) -> str:
    """``name`` with a legacy name replaced by what it meant in ``context`` (others unchanged).

    A canonical or plug-in name is returned as it is (the registry checks it); a legacy name
    that never existed in ``context`` too (its caller refuses it as unknown).
    """
    legacy = LEGACY_NAMES.get(name)
    if legacy is None:
        return name
    target = legacy.plan if context == PLAN else legacy.worker
    return name if target is None else target


def canonical_accountant(name: str) -> str:
    """``name`` with a legacy spec/plan name replaced by its canonical one (others unchanged)."""
    return resolve(name, PLAN)


def choices_text(*, plannable_only: bool = False) -> str:
    """The built-in names with what each computes: the one text the CLI and spec help show."""
    rows = [a for a in ACCOUNTANTS.values() if a.plannable or not plannable_only]
    return "; ".join(f"{a.name} ({a.library}: {a.computes})" for a in rows)


def markdown_table() -> str:
    """The table as the docs show it (docs/privacy.md; a test keeps the two equal)."""
    lines = [
        "| name | what it computes | plans a sweep | a grid's trials report with |",
        "|---|---|---|---|",
    ]
    for a in ACCOUNTANTS.values():
        default = " (a sweep's default)" if a.name == DEFAULT_ACCOUNTANT else ""
        default += " (a single run's default)" if a.name == DEFAULT_RUN_ACCOUNTANT else ""
        planned = "yes" if a.plannable else "no"
        trials = f"`{a.trial_accountant}`" if a.trial_accountant else "-"
        lines.append(f"| `{a.name}`{default} | {a.library}: {a.computes} | {planned} | {trials} |")
    lines += [
        "",
        "| legacy name | in a spec or stored plan | in a worker's record |",
        "|---|---|---|",
    ]
    for n in LEGACY_NAMES.values():
        plan = f"`{n.plan}`" if n.plan else "-"
        worker = f"`{n.worker}`" if n.worker else "-"
        lines.append(f"| `{n.name}` | {plan} | {worker} |")
    return "\n".join(lines)
