"""A real installed plug-in distribution for the API and CLI tests (spawned processes).

:func:`plugin_site` writes a distribution (``*.dist-info`` with ``entry_points.txt``, and its
package) that registers a model and a dataset through the entry-point groups
``dpsweep.models`` and ``dpsweep.datasets``, plus a local factory module (``module:function``
for ``dpsweep train``), into a temporary folder; :func:`env_with` puts that folder on the
``PYTHONPATH`` of a spawned ``dpsweep`` process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tests.workers.test_plugins import write_distribution

PLUGIN_MODEL = "tiny-plugin-mlp"
PLUGIN_DATASET = "tiny-plugin-data"
FACTORY_MODULE = "dpsweep_test_factories"

PLUGIN_CODE = f'''
"""A dpsweep plug-in: a model and a dataset (each entry point registers one)."""

from workers.options import HParam


def register_model():
    from workers.models.descriptors import ModelDescriptor, ModelOption
    from workers.models.registry import register_model

    descriptor = ModelDescriptor(
        name="{PLUGIN_MODEL}",
        input_kind="flat",
        description="a one-hidden-layer MLP from a plug-in",
        options={{"width": ModelOption(default=8, kind="int", low=1, help="hidden width")}},
    )

    @register_model(descriptor)
    def build(input_shape, num_classes, width=8):
        from torch import nn

        return nn.Sequential(
            nn.Flatten(), nn.Linear(input_shape[0], width), nn.ReLU(), nn.Linear(width, num_classes)
        )


def register_dataset():
    import numpy as np

    from workers.datasets import (
        DatasetDescriptor, RawData, register_dataset, register_dataset_descriptor,
    )

    register_dataset_descriptor(
        DatasetDescriptor(
            name="{PLUGIN_DATASET}",
            input_kind="flat",
            description="two Gaussian classes from a plug-in",
            options={{"n": HParam(default=80, kind="int", low=10.0, help="records")}},
        )
    )

    @register_dataset("{PLUGIN_DATASET}")
    def load(spec):
        n = int(spec.options.get("n", 80))
        y = np.arange(n) % 2
        return RawData(x=np.random.default_rng(0).normal(size=(n, 3)) + y[:, None], y=y,
                       kind="tabular")
'''

FACTORY_CODE = '''
"""Local factories for `dpsweep train --model MODULE:build --dataset MODULE:data`."""

import numpy as np


def build(input_shape, num_classes):
    from torch import nn

    features = int(np.prod(input_shape))
    return nn.Sequential(
        nn.Flatten(), nn.Linear(features, 8), nn.ReLU(), nn.Linear(8, num_classes)
    )


def data(spec):
    from workers.datasets.records import RawData

    y = np.arange(200) % 2
    return RawData(x=np.random.default_rng(0).normal(size=(200, 4)) + 2.0 * y[:, None], y=y,
                   kind="tabular")


def not_a_function():
    pass


value = 3
'''

# Importing it leaves a mark: the API must never import a module a request names.
MARKER_CODE = """
import os
from pathlib import Path

Path(os.environ["DPSWEEP_TEST_MARKER"]).write_text("imported")


def build(input_shape, num_classes):
    Path(os.environ["DPSWEEP_TEST_MARKER"]).write_text("called")
"""


@dataclass(frozen=True)
class PluginSite:
    """The folder to put on PYTHONPATH, and the marker file the marker module would write."""

    path: Path
    marker: Path


def plugin_site(root: Path) -> PluginSite:
    """Write the plug-in distribution, the factory module and the marker module under ``root``."""
    site = root / "site"
    site.mkdir(parents=True)
    write_distribution(
        site,
        "dpsweep_tiny_plugin",
        """
        [dpsweep.models]
        tiny_model = dpsweep_tiny_plugin:register_model

        [dpsweep.datasets]
        tiny_data = dpsweep_tiny_plugin:register_dataset
        """,
        {"__init__.py": PLUGIN_CODE},
    )
    (site / f"{FACTORY_MODULE}.py").write_text(FACTORY_CODE)
    (site / "dpsweep_test_marker.py").write_text(MARKER_CODE)
    return PluginSite(site, root / "marker.txt")


def env_with(site: PluginSite, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this environment) with the site first on PYTHONPATH, and the marker."""
    env = dict(os.environ if base is None else base)
    path = [str(site.path), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["DPSWEEP_TEST_MARKER"] = str(site.marker)
    return env
