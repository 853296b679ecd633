"""dpsweep sweeper: the domain layer (spec, planning, store, scheduling, results) and the CLI.

Pure domain: it imports neither FastAPI nor torch at module level.
"""

from __future__ import annotations

__version__ = "0.1.0"
