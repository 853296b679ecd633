"""The sweep driver: the loop, the Ray backend, packs, claim-and-charge, crash policy, progress."""
