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
