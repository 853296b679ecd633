"""The dataset catalog: built-in sets, uploaded and registered files, and their budgets.

A sweep spec names its dataset by registry name (``digits``), by file (``csv`` with a
``path``, local use), by an upload's id (``ds_...``, through the API), or by a name an
operator registered (``dpsweep datasets register FILE --name NAME``). Each concept has its
module; this package re-exports their public functions:

* :mod:`~sweeper.datasets.names`: the kinds of names, the built-in sets and the formats;
* :mod:`~sweeper.datasets.files`: the worker spec of a file, and what may be shown of it;
* :mod:`~sweeper.datasets.resolution`: a spec's dataset (and its evaluation dataset, which
  may be a registered name declared public) to the worker's spec;
* :mod:`~sweeper.datasets.identity`: names bound to the content of their records, which keys
  the budget ledger;
* :mod:`~sweeper.datasets.registration`: the operator's registered names;
* :mod:`~sweeper.datasets.uploads`: users' uploads;
* :mod:`~sweeper.datasets.access` and :mod:`~sweeper.datasets.views`: who may see and use
  which dataset, and what the API shows of it (descriptions, budgets, caps).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweeper.datasets.access import Viewer, check_access
    from sweeper.datasets.identity import Binding, bind_name, content_identity, ledger_key_of
    from sweeper.datasets.names import (
        BUILTIN,
        REGISTER_FORMATS,
        UPLOAD_FORMATS,
        UPLOAD_PREFIX,
        check_registered_name,
        in_catalog,
        is_upload,
    )
    from sweeper.datasets.registration import (
        NameDeletion,
        delete_name,
        delete_name_and_models,
        holding_sweeps,
        names_of,
        register_file,
    )
    from sweeper.datasets.resolution import is_public, public_eval_spec, resolve
    from sweeper.datasets.uploads import store_upload
    from sweeper.datasets.views import budget, describe, list_datasets, set_caps

# The re-exports load on first use (PEP 562): the CLI's parser reads the names' constants
# (sweeper.datasets.names) on every `dpsweep` call, and importing the whole catalog with it
# (SQLAlchemy, about half a second) would slow even `dpsweep --help`.
_EXPORTS: dict[str, str] = {
    "BUILTIN": "sweeper.datasets.names",
    "Binding": "sweeper.datasets.identity",
    "NameDeletion": "sweeper.datasets.registration",
    "REGISTER_FORMATS": "sweeper.datasets.names",
    "UPLOAD_FORMATS": "sweeper.datasets.names",
    "UPLOAD_PREFIX": "sweeper.datasets.names",
    "Viewer": "sweeper.datasets.access",
    "bind_name": "sweeper.datasets.identity",
    "budget": "sweeper.datasets.views",
    "check_access": "sweeper.datasets.access",
    "check_registered_name": "sweeper.datasets.names",
    "content_identity": "sweeper.datasets.identity",
    "delete_name": "sweeper.datasets.registration",
    "delete_name_and_models": "sweeper.datasets.registration",
    "describe": "sweeper.datasets.views",
    "holding_sweeps": "sweeper.datasets.registration",
    "in_catalog": "sweeper.datasets.names",
    "is_public": "sweeper.datasets.resolution",
    "is_upload": "sweeper.datasets.names",
    "ledger_key_of": "sweeper.datasets.identity",
    "list_datasets": "sweeper.datasets.views",
    "names_of": "sweeper.datasets.registration",
    "public_eval_spec": "sweeper.datasets.resolution",
    "register_file": "sweeper.datasets.registration",
    "resolve": "sweeper.datasets.resolution",
    "set_caps": "sweeper.datasets.views",
    "store_upload": "sweeper.datasets.uploads",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BUILTIN",
    "REGISTER_FORMATS",
    "UPLOAD_FORMATS",
    "UPLOAD_PREFIX",
    "Binding",
    "NameDeletion",
    "Viewer",
    "bind_name",
    "budget",
    "check_access",
    "check_registered_name",
    "content_identity",
    "delete_name",
    "delete_name_and_models",
    "describe",
    "holding_sweeps",
    "in_catalog",
    "is_public",
    "is_upload",
    "ledger_key_of",
    "list_datasets",
    "names_of",
    "public_eval_spec",
    "register_file",
    "resolve",
    "set_caps",
    "store_upload",
]
