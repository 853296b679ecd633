"""Temporary re-exports (issue 21): the dataset catalog now lives in :mod:`sweeper.datasets`."""

from __future__ import annotations

from sweeper.datasets.access import Viewer, check_access  # noqa: F401
from sweeper.datasets.identity import bind_name, content_identity, ledger_key_of  # noqa: F401
from sweeper.datasets.names import UPLOAD_FORMATS, in_catalog  # noqa: F401
from sweeper.datasets.registration import delete_name, names_of, register_file  # noqa: F401
from sweeper.datasets.resolution import is_public, resolve  # noqa: F401
from sweeper.datasets.uploads import store_upload  # noqa: F401
from sweeper.datasets.views import budget, describe, list_datasets, set_caps  # noqa: F401
