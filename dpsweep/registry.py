"""One registry for every pluggable kind: stable names to the things registered under them.

Strategies, models, datasets (each a torch-free descriptor and a torch implementation) and the
packed engine's layer kinds are each a :class:`Registry`. Registered names are a stable
contract (the database stores them), so every registry behaves the same way:

* :meth:`Registry.register` refuses a name registered twice (``ValueError``), unless
  ``replace=True``; a descriptor registry (``idempotent=True``) accepts the very same object
  again, so that a module imported twice under two names does not fail.
* :meth:`Registry.lookup` resolves a name, loading what may provide it first (the built-ins, the
  installed plug-ins) and raising :class:`~dpsweep.errors.ConfigError` with the one message
  ``unknown <kind> '<name>'; choose one of: a, b, c`` (on the spec field it names).
* :meth:`Registry.names` lists the names, sorted, after the same loading.

A registry is also a plain mutable mapping: ``in``, ``[]``, ``.get`` (None when absent),
iteration in registration order, ``dict(registry)``. These never load anything, as the
dictionaries they replace never did; tests use them to save and restore a registry. The raising
look-up is :meth:`lookup`, not ``get``, because callers (and ``Mapping.get``) rely on ``get``
answering None.

This module is torch-free and imports nothing above :mod:`dpsweep.errors`: the loading hook
(``load``) is a callable the owner passes in (e.g. ``workers.plugins.load_plugins`` for the
kind's entry-point group), so the light package stays below every server layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from typing import TypeVar

from dpsweep.errors import ConfigError

K = TypeVar("K")
V = TypeVar("V")


class Registry(MutableMapping[K, V]):
    """Names (or other keys) to registered things, with one duplicate rule and one miss message.

    Args:
        kind: the noun in messages, e.g. ``"strategy"``: ``unknown strategy 'x'; ...``.
        field: the spec field an unknown name is blamed on (:attr:`ConfigError.field`).
        load: called before listing and on a miss (never on a hit): imports the built-ins
            and/or loads the installed plug-ins. It must be idempotent and cheap when repeated.
        verb: the duplicate message's verb: ``"<kind> '<name>' is <verb> twice"``.
        idempotent: registering the very object already registered under its name is a no-op
            (descriptors); otherwise any second registration is refused.
        unknown: builds the message for a key not found after loading, in place of the
            default ``unknown <kind> '<name>'; choose one of: ...`` (a layer kind, keyed by its
            type, says which layers are supported instead).
    """

    def __init__(
        self,
        kind: str,
        *,
        field: str | None = None,
        load: Callable[[], object] | None = None,
        verb: str = "registered",
        idempotent: bool = False,
        unknown: Callable[[K], str] | None = None,
    ) -> None:
        self.kind = kind
        self.field = field
        self._load = load
        self._verb = verb
        self._idempotent = idempotent
        self._unknown = unknown
        self._entries: dict[K, V] = {}

    # -- registration ------------------------------------------------------------------------

    def register(self, key: K, value: V, *, replace: bool = False) -> V:
        """Register ``value`` under ``key`` and return it.

        Raises:
            ValueError: ``key`` is taken (by another object, for an idempotent registry) and
                ``replace`` is false.
        """
        taken = key in self._entries and not replace
        if taken and not (self._idempotent and self._entries[key] is value):
            raise ValueError(f"{self.kind} {key!r} is {self._verb} twice")
        self._entries[key] = value
        return value

    def registering(self, key: K, *, replace: bool = False) -> Callable[[V], V]:
        """A decorator that registers what it decorates under ``key`` (and returns it as is)."""

        def deco(value: V) -> V:
            return self.register(key, value, replace=replace)

        return deco

    # -- resolution (loads on a miss) --------------------------------------------------------

    def load(self) -> None:
        """Run the loading hook (built-ins, plug-ins); a no-op for a registry without one."""
        if self._load is not None:
            self._load()

    def names(self) -> list[K]:
        """Every registered key, sorted, after loading (so plug-ins' count)."""
        self.load()
        return sorted(self._entries, key=str)

    def has(self, key: K) -> bool:
        """Whether ``key`` is registered, loading on a miss (unlike ``in``, which never loads)."""
        if key not in self._entries:
            self.load()
        return key in self._entries

    def lookup(self, key: K) -> V:
        """What is registered under ``key``, loading on a miss.

        Raises:
            ConfigError: ``key`` is not registered even after loading; the message lists the
                registered names (field :attr:`field`).
        """
        if not self.has(key):
            raise ConfigError(self._miss_message(key), field=self.field)
        return self._entries[key]

    def _miss_message(self, key: K) -> str:
        if self._unknown is not None:
            return self._unknown(key)
        choices = ", ".join(str(name) for name in self.names())
        return f"unknown {self.kind} {key!r}; choose one of: {choices}"

    def copy(self) -> Registry[K, V]:
        """A registry of the same kind and rules holding the same entries (for a scratch copy)."""
        twin = Registry[K, V](
            self.kind,
            field=self.field,
            load=self._load,
            verb=self._verb,
            idempotent=self._idempotent,
            unknown=self._unknown,
        )
        twin._entries = dict(self._entries)
        return twin

    # -- the plain mapping (never loads) -----------------------------------------------------

    def __getitem__(self, key: K) -> V:
        return self._entries[key]

    def __setitem__(self, key: K, value: V) -> None:
        # Raw assignment, like the dictionaries this replaced: a test's stand-in, or a restore.
        self._entries[key] = value

    def __delitem__(self, key: K) -> None:
        del self._entries[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __repr__(self) -> str:
        return f"<{self.kind} registry: {list(self._entries)!r}>"
