"""dpsweep sweeper: the domain layer (planning, store, scheduling, results).

Pure domain: it imports neither FastAPI nor torch at module level. It sits between ``api``
(above, never imported from here; the command-line interface is ``api.cli``) and ``workers``
and ``dpsweep`` (below; the sweep spec it carries is :mod:`dpsweep.spec`).

Its sub-packages are layered, bottom first; each imports only the ones before it:

1. ``store``: the tables, the engine, row helpers, the kept models' files (``sweeper.settings``
   sits below all);
2. ``privacy``: the ledger, releases, composition, calibration and each grid's plan;
3. ``datasets``: the catalog, grants, views, uploads, registration, expiry;
4. ``sweeps``: planning, creating, reading, searching and deleting sweeps and their trials;
5. ``artifacts``: kept models and their cards;
6. ``driver``: the loop that claims, runs and records packs of trials;
7. ``audits``: canary audits of finished sweeps.

A piece two layers share moves down into a small module of the lower one, not into an import
hidden in a function. ``tests/test_import_graph.py`` checks the order and that there is no
import cycle.
"""

from __future__ import annotations

__version__ = "0.1.0"
