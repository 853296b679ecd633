"""An accountant plug-in (entry-point group ``dpsweep.accountants``; the entry point names this
module, whose import registers it): dp_accounting's RDP under another name, with the shared
calibrator and the prefix-by-prefix charge schedule."""

from __future__ import annotations

from dpsweep_testplugins import ACCOUNTANT
from workers.accounting.epsilon import dp_rdp_epsilon
from workers.accounting.registry import AccountantDescriptor, register_accountant

register_accountant(
    AccountantDescriptor(
        name=ACCOUNTANT,
        description="dp_accounting's RDP under another name (a test plug-in)",
        library="dpsweep-testplugins (dp_accounting RDP)",
        tight=False,
        epsilon=dp_rdp_epsilon,
    )
)
