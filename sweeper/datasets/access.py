"""Who may use which dataset: the :class:`Viewer` and the check of a spec's dataset.

Uploads are their owner's (and admins'); registered names have no owner: they are files on
the server, for admins and local use, like a path given in a spec.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError
from sweeper.datasets.grants import has_active_grant
from sweeper.datasets.names import in_catalog, unknown_dataset
from sweeper.datasets.viewer import Viewer
from sweeper.store import Dataset

__all__ = ["Viewer", "check_access"]


def check_access(engine: Engine, dataset: Any, viewer: Viewer) -> None:
    """Refuse a spec's dataset the viewer may not use: someone else's upload, or (for
    non-admins of the API) a file path on the server.

    Raises:
        ConfigError: with the field to fix.
    """
    get = dataset.get if isinstance(dataset, dict) else lambda k, d=None: getattr(dataset, k, d)
    name = str(get("name"))
    if viewer.owner is not None and not viewer.admin and (get("path") or get("labels_path")):
        raise ConfigError(
            "datasets given by a file path on the server are for admins; upload the file "
            "with POST /api/v1/datasets and name the returned id (ds_...) as dataset.name",
            field="dataset.path",
        )
    if viewer.owner is not None and not viewer.admin:
        # Options that name a file on the server (a vocabulary, a tokenizer) are paths too.
        paths = sorted(set(get("options") or {}) & _path_options())
        if paths:
            raise ConfigError(
                f"dataset option {paths[0]} names a file on the server, which is for admins; "
                "use a dataset an admin registered with that option",
                field=f"dataset.options.{paths[0]}",
            )
    if in_catalog(name):
        # Registered names have no owner: they are files on the server, for admins (and local
        # use), like a path; uploads are their owner's.
        with Session(engine) as session:
            owner = session.scalars(select(Dataset.owner).where(Dataset.name == name)).first()
            exists = session.scalars(select(Dataset.id).where(Dataset.name == name)).first()
        if exists is None:
            raise ConfigError(unknown_dataset(name), field="dataset.name")
        # An analyst of the dataset (an active grant from its owner) may use it.
        if not viewer.sees(owner) and (
            viewer.owner is None or not has_active_grant(engine, name, viewer.owner)
        ):
            raise ConfigError(unknown_dataset(name), field="dataset.name")


def _path_options() -> set[str]:
    """Every option name that some loader declares as a server file path (kind ``path``)."""
    # deferred: workers.datasets pulls numpy and every loader
    from workers.datasets.descriptors import dataset_descriptor_names, get_dataset_descriptor

    return {
        option
        for loader in dataset_descriptor_names()
        for option in get_dataset_descriptor(loader).path_options()
    }
