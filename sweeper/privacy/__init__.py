"""Privacy accounting of sweeps: the planner, the ledger, charges, verification and releases."""
