"""Accountant names: the one table of legacy names (torch-free, no registry).

Before the accountant registry, specs and stored grid plans named accountants ``prv`` (which
always meant dp_accounting's PLD), ``rdp`` (dp_accounting's RDP) and, in papernot-steinke
plans, ``rdp (RepeatAndSelect)`` (dp_accounting's RDP on a RepeatAndSelect event). They are
read through :data:`LEGACY_ACCOUNTANTS` only, never guessed: a spec's ``privacy.accountant``
is normalised to the canonical name when it is parsed (:class:`dpsweep.spec.PrivacyConfig`),
a stored plan's accountant when it is read (:mod:`workers.accounting.registry`), and migration
0010 rewrote the names stored in sweeps' specs and plans once.

(A worker's ``compute_epsilon(accountant="rdp")`` is a different, older namespace where
``rdp``/``prv`` are Opacus's accountants: :data:`workers.accounting.registry.WORKER_ALIASES`.)
"""

from __future__ import annotations

from collections.abc import Mapping

#: Legacy spec and plan accountant names -> canonical registry names.
LEGACY_ACCOUNTANTS: Mapping[str, str] = {
    "prv": "pld",
    "rdp": "dp-rdp",
    "rdp (RepeatAndSelect)": "dp-rdp",
}

#: A spec's default ``privacy.accountant``.
DEFAULT_ACCOUNTANT = "pld"


def canonical_accountant(name: str) -> str:
    """``name`` with a legacy spec/plan name replaced by its canonical one (others unchanged)."""
    return LEGACY_ACCOUNTANTS.get(name, name)
