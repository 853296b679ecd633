"""One-off runs outside a sweep (``dpsweep train``): their charge to a dataset's ledger."""
