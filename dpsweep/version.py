"""The dpsweep version, in a module of its own.

Kept apart from ``dpsweep/__init__`` so that the transport can put it in its User-Agent
without importing the package root (which lazily imports the client, which imports the
transport: a cycle).
"""

from __future__ import annotations

__version__ = "0.1.0"
