"""Entry-point plug-ins: a real installed distribution adds to every registry.

Each test writes a tiny distribution (a ``*.dist-info`` folder with ``METADATA`` and
``entry_points.txt``, and its module) into a temporary folder, puts it on ``sys.path`` and
forgets which plug-ins were loaded: what the distribution registers must then appear in the
registries' listings and lookups, and pass the registries' contracts. A plug-in that fails to
load is refused with a :class:`ConfigError` naming it.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dpsweep.errors import ConfigError
from tests.workers.accounting.test_accountant_contract import check_accountant_contract
from tests.workers.datasets.test_dataset_contract import (
    check_dataset_contract,
    check_descriptor_contract,
)
from workers.accounting import accountant_names, get_accountant
from workers.accounting import registry as accounting_registry
from workers.accounting.registry import clear_epsilon_cache
from workers.datasets.descriptors import (
    DATASET_DESCRIPTORS,
    dataset_descriptor_names,
    get_dataset_descriptor,
)
from workers.datasets.loading import load_dataset
from workers.datasets.records import DatasetSpec
from workers.datasets.registry import DATASETS, dataset_names
from workers.plugins import reset_plugins
from workers.strategies.descriptors import DESCRIPTORS, descriptor_names, get_descriptor

#: ``install(module, entry_points, files)``: an installed distribution for one test.
Install = Callable[[str, str, dict[str, str]], None]

PLUGIN_CODE = '''
"""A dpsweep plug-in: a strategy, a dataset and an accountant."""

from workers.strategies.descriptors import (
    HParam, StrategyDescriptor, descriptor_names, register_descriptor,
)


def register_strategy():
    # A lookup while plug-ins load must not dead-lock (nor load them again).
    assert "fixed" in descriptor_names()
    register_descriptor(
        StrategyDescriptor(
            name="{name}-clip",
            description="fixed clipping under another name (a test plug-in)",
            hyperparameters={{"clip": HParam(default=1.0, help="clipping threshold C")}},
        )
    )


def register_dataset():
    import numpy as np

    from workers.datasets import (
        DatasetDescriptor, RawData, register_dataset, register_dataset_descriptor,
    )

    register_dataset_descriptor(
        DatasetDescriptor(
            name="{name}-data",
            input_kind="flat",
            description="two seeded Gaussian classes (a test plug-in)",
            options={{"n": HParam(default=80, kind="int", low=10.0, help="records")}},
        )
    )

    @register_dataset("{name}-data")
    def load(spec):
        n = int(spec.options.get("n", 80))
        rng = np.random.default_rng(0)
        y = np.arange(n) % 2
        return RawData(x=rng.normal(size=(n, 3)) + y[:, None], y=y, kind="tabular")
'''

ACCOUNTANT_CODE = '''
"""Imported for its registration: dp_accounting's PLD under another name."""

from workers.accounting.epsilon import pld_epsilon
from workers.accounting.registry import AccountantDescriptor, register_accountant

register_accountant(
    AccountantDescriptor(
        name="{name}-pld",
        description="dp_accounting's PLD under another name (a test plug-in)",
        library="dp_accounting PLD",
        tight=True,
        epsilon=pld_epsilon,
    )
)
'''

BROKEN_CODE = """
def register():
    raise RuntimeError("the plug-in's own bug")
"""


def write_distribution(site: Path, module: str, entry_points: str, files: dict[str, str]) -> None:
    """An installed distribution ``module`` in ``site``: its metadata and its package files."""
    info = site / f"{module}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points).lstrip())
    package = site / module
    package.mkdir()
    for name, code in files.items():
        (package / name).write_text(code)


@pytest.fixture
def install(tmp_path: Path) -> Iterator[Install]:
    """Install distributions on ``sys.path`` for one test; restore every registry afterwards."""
    site = tmp_path / "site"
    site.mkdir()
    saved = [
        (DESCRIPTORS, dict(DESCRIPTORS)),
        (accounting_registry._REGISTRY, dict(accounting_registry._REGISTRY)),
        (DATASET_DESCRIPTORS, dict(DATASET_DESCRIPTORS)),
        (DATASETS, dict(DATASETS)),
    ]
    modules: list[str] = []

    def do_install(module: str, entry_points: str, files: dict[str, str]) -> None:
        write_distribution(site, module, entry_points, files)
        modules.append(module)

    sys.path.insert(0, str(site))
    try:
        yield do_install
    finally:
        sys.path.remove(str(site))
        for module in modules:
            for loaded in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
                del sys.modules[loaded]
        for registry, before in saved:
            registry.clear()
            registry.update(before)
        clear_epsilon_cache()
        importlib.invalidate_caches()
        reset_plugins()


def _activate() -> None:
    importlib.invalidate_caches()  # the new distribution's metadata is found by a fresh scan
    reset_plugins()


def test_a_real_plugin_adds_to_every_registry(install: Install, tmp_path: Path) -> None:
    module = f"dpsweep_test_plugin_{uuid.uuid4().hex[:8]}"
    name = module.replace("_", "-")
    install(
        module,
        f"""
        [dpsweep.strategies]
        tiny = {module}:register_strategy

        [dpsweep.datasets]
        tiny = {module}:register_dataset

        [dpsweep.accountants]
        tiny = {module}.accountant
        """,
        {
            "__init__.py": PLUGIN_CODE.format(name=name),
            "accountant.py": ACCOUNTANT_CODE.format(name=name),
        },
    )
    _activate()
    # Looking a plug-in's name up loads the plug-ins (before any listing did). The strategy
    # plug-in lists the strategies while the plug-ins load: that must not dead-lock.
    found: list[Any] = []
    lookup = threading.Thread(
        target=lambda: found.append(get_descriptor(f"{name}-clip")), daemon=True
    )
    lookup.start()
    lookup.join(timeout=60)
    assert not lookup.is_alive(), "a lookup while plug-ins load dead-locked on the plug-in lock"
    assert found and found[0].validate({}) == {"clip": 1.0}
    assert get_accountant(f"{name}-pld").tight
    assert get_dataset_descriptor(f"{name}-data").validate({}) == {"n": 80}

    # And every listing holds them, beside the built-ins.
    assert {f"{name}-clip", "fixed"} <= set(descriptor_names())
    assert {f"{name}-pld", "pld"} <= set(accountant_names())
    assert {f"{name}-data", "digits"} <= set(dataset_descriptor_names())
    assert f"{name}-data" in dataset_names()

    # The registries' contracts hold for what the plug-in registered.
    check_accountant_contract(f"{name}-pld")
    check_descriptor_contract(f"{name}-data")
    check_dataset_contract(f"{name}-data", tmp_path)
    assert load_dataset(DatasetSpec(f"{name}-data", options={"n": 40})).n_private == 40


LOOKUPS: dict[str, Callable[[], object]] = {
    "strategies": descriptor_names,
    "accountants": accountant_names,
    "datasets": dataset_descriptor_names,
}


@pytest.mark.parametrize("kind", sorted(LOOKUPS))
def test_a_broken_plugin_is_refused_naming_it(install: Install, kind: str) -> None:
    module = f"dpsweep_broken_plugin_{uuid.uuid4().hex[:8]}"
    install(
        module,
        f"[dpsweep.{kind}]\nbroken_{kind} = {module}:register\n",
        {"__init__.py": BROKEN_CODE},
    )
    _activate()
    with pytest.raises(ConfigError, match=f"broken_{kind}") as exc:
        LOOKUPS[kind]()
    assert "the plug-in's own bug" in str(exc.value) and module in str(exc.value)


def test_a_plugin_that_cannot_be_imported_is_refused_naming_it(
    install: Install,
) -> None:
    module = f"dpsweep_missing_plugin_{uuid.uuid4().hex[:8]}"
    install(
        module,
        f"[dpsweep.datasets]\nmissing = {module}.not_there\n",
        {"__init__.py": ""},
    )
    _activate()
    with pytest.raises(ConfigError, match=r"'missing'.*failed to load"):
        get_dataset_descriptor("no-such-dataset")
