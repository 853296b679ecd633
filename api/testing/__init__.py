"""Development and test utilities that ship with the package (like ``ray.cluster_utils``):
what the tests and the benchmarks share to run the real thing.

* :mod:`api.testing.postgres`: a throwaway PostgreSQL server (``initdb`` + ``pg_ctl``);
* :mod:`api.testing.server`: ``dpsweep serve`` in a subprocess, on a free port;
* :mod:`api.testing.browser`: a headless system Chromium driven by Playwright.

Nothing here is imported by the server itself; each module imports what it needs.
"""
