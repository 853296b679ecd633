"""Plug-ins from other packages: Python entry points that add to dpsweep's registries.

An operator installs a package that declares, for example::

    [project.entry-points."dpsweep.models"]
    wide_mlp = "my_dp_models:register"

and the ``models`` registry calls ``my_dp_models.register()`` (or just imports the module, when
the entry point names a module) the first time it is listed or asked for a name it does not
know. The registered *names* are the stable contract (they are stored in the database); the
entry point's own name is only a label in error messages.

Only the operator's installed packages are loaded. The REST API resolves registered names only:
an import string taken from a request would run a stranger's code on the server. (The local
command line may also name ``module:function`` factories: :mod:`workers.factories`.)
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Callable
from types import ModuleType

from dpsweep.errors import ConfigError

#: The registry kinds and their entry-point groups.
GROUPS: dict[str, str] = {
    "strategies": "dpsweep.strategies",
    "accountants": "dpsweep.accountants",
    "models": "dpsweep.models",
    "datasets": "dpsweep.datasets",
}

_loaded: set[str] = set()
# Re-entrant: a plug-in's register() may look names up, which loads plug-ins (a no-op then).
_lock = threading.RLock()


def load_plugins(kind: str) -> list[str]:
    """Load every installed plug-in of one registry kind, once per process.

    Args:
        kind: ``"strategies"``, ``"accountants"``, ``"models"`` or ``"datasets"``.

    Returns:
        The entry points' names loaded by this call (empty when they were loaded before).

    Raises:
        ConfigError: ``kind`` is unknown, or a plug-in failed to load or register; the message
            names the entry point so that the operator can fix or uninstall it.
    """
    if kind not in GROUPS:
        raise ConfigError(f"unknown plug-in kind {kind!r}; known: {', '.join(sorted(GROUPS))}")
    with _lock:
        if kind in _loaded:
            return []
        # Marked first: a plug-in's register() may itself look names up in its registry.
        _loaded.add(kind)
        names: list[str] = []
        for ep in importlib.metadata.entry_points(group=GROUPS[kind]):
            try:
                target: ModuleType | Callable[[], object] | object = ep.load()
                if callable(target) and not isinstance(target, ModuleType):
                    target()
            except Exception as exc:
                raise ConfigError(
                    f"the {kind} plug-in {ep.name!r} ({ep.value}) failed to load: "
                    f"{type(exc).__name__}: {exc}. Fix or uninstall the package that provides it."
                ) from exc
            names.append(ep.name)
        return names


def reset_plugins() -> None:
    """Forget which kinds were loaded (for tests that install a plug-in mid-process)."""
    with _lock:
        _loaded.clear()
