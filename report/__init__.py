"""``make report``: the papers' experiments, run with dpsweep, written to ``docs/results.md``."""
