"""The one generic registry (dpsweep.registry.Registry) and the registries built on it."""

from __future__ import annotations

import pytest

from dpsweep.errors import ConfigError
from dpsweep.registry import Registry


def _fruit(load: list[str] | None = None) -> Registry[str, int]:
    calls = load if load is not None else []
    return Registry("fruit", field="spec.fruit", load=lambda: calls.append("load"))


def test_a_name_registered_twice_is_refused_unless_replaced() -> None:
    r = _fruit()
    assert r.register("pear", 1) == 1
    with pytest.raises(ValueError, match=r"^fruit 'pear' is registered twice$"):
        r.register("pear", 2)
    with pytest.raises(ValueError, match="registered twice"):
        r.register("pear", 1)  # the same value again is refused too (not idempotent)
    assert r["pear"] == 1
    assert r.register("pear", 3, replace=True) == 3
    assert r["pear"] == 3


def test_an_idempotent_registry_takes_the_same_object_again_only() -> None:
    r: Registry[str, object] = Registry("model", verb="described", idempotent=True)
    first, other = object(), object()
    assert r.register("cnn", first) is first
    assert r.register("cnn", first) is first
    with pytest.raises(ValueError, match=r"^model 'cnn' is described twice$"):
        r.register("cnn", other)
    assert r["cnn"] is first


def test_an_unknown_name_names_the_choices_sorted_after_loading() -> None:
    loads: list[str] = []
    r = _fruit(loads)
    for name in ("quince", "apple", "medlar"):
        r.register(name, len(name))
    with pytest.raises(ConfigError) as exc:
        r.lookup("kiwi")
    assert str(exc.value) == "unknown fruit 'kiwi'; choose one of: apple, medlar, quince"
    assert exc.value.field == "spec.fruit"
    assert loads  # the hook ran before the name was refused


def test_names_are_sorted_and_iteration_keeps_registration_order() -> None:
    r = _fruit()
    for name in ("quince", "apple", "medlar"):
        r.register(name, 0)
    assert r.names() == ["apple", "medlar", "quince"]
    assert list(r) == ["quince", "apple", "medlar"]
    assert list(r.items()) == [("quince", 0), ("apple", 0), ("medlar", 0)]


def test_the_hook_runs_on_a_miss_or_a_listing_never_on_a_hit() -> None:
    loads: list[str] = []

    def load() -> None:  # a plug-in registering its name when loaded (once, as entry points)
        loads.append("load")
        if "fig" not in r:
            r.register("fig", 7)

    r: Registry[str, int] = Registry("fruit", load=load)
    assert "fig" not in r and r.get("fig") is None and not loads  # the mapping never loads
    assert r.lookup("fig") == 7 and loads == ["load"]
    assert r.lookup("fig") == 7 and loads == ["load"]  # a hit: no load
    assert r.has("fig") and loads == ["load"]
    assert not r.has("plum") and loads == ["load", "load"]
    assert r.names() == ["fig"] and len(loads) == 3


def test_the_decorator_registers_and_returns_what_it_decorates() -> None:
    r: Registry[str, object] = Registry("loader")

    @r.registering("csv")
    def load_csv() -> str:
        return "rows"

    assert r.lookup("csv") is load_csv and load_csv() == "rows"


def test_a_custom_message_for_a_key_that_is_not_a_name() -> None:
    r: Registry[type, str] = Registry("layer", unknown=lambda t: f"layer {t.__name__} is not ok")
    r.register(int, "an int")
    assert r.lookup(int) == "an int"
    with pytest.raises(ConfigError, match=r"^layer float is not ok$") as exc:
        r.lookup(float)
    assert exc.value.field is None


def test_a_copy_is_independent_and_keeps_the_rules() -> None:
    r = _fruit()
    r.register("pear", 1)
    twin = r.copy()
    twin.register("plum", 2)
    assert "plum" not in r and dict(twin) == {"pear": 1, "plum": 2}
    with pytest.raises(ValueError, match="registered twice"):
        twin.register("pear", 5)
    del twin["pear"]
    assert "pear" in r and "pear" not in twin
