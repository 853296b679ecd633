"""Who asks: the :class:`Viewer` every access rule takes (a module of its own, below both
:mod:`sweeper.datasets.access` and :mod:`sweeper.datasets.grants`, so neither imports the other
in a circle)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Viewer:
    """Who asks: an owner name (None: local use, sees everything) and whether an admin."""

    owner: str | None
    admin: bool = False

    def sees(self, owner: str | None) -> bool:
        return self.admin or self.owner is None or owner == self.owner
