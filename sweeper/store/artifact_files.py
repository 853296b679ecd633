"""The artifact store: a local directory by default, or any fsspec URL on a cluster.

A file is written under a temporary name beside its final key and then renamed, so a reader
(or a crash) never sees part of one under its key; on a local disk the bytes are also synced
before the rename. Keys are relative ``/``-separated paths: ``sweeps/<sweep>/<trial>/model.
safetensors`` and ``card.json`` beside it (:func:`model_key`, :func:`card_key`).

It sits in the store layer, below everything that keeps, reads or deletes models: the rows
that name the files (:class:`~sweeper.store.ModelArtifact`, :class:`~sweeper.store.StagedModel`)
and the bytes are deleted together here (:func:`delete_sweep_artifacts`), and a tenant's usage is
summed here (:func:`usage_bytes`), so a sweep's or a dataset's deletion and the quota check need
nothing from :mod:`sweeper.artifacts`.

fsspec is imported only when a store is opened, so ``sweeper`` stays light to import.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError
from sweeper.settings import SweeperSettings
from sweeper.store.rows import ModelArtifact, StagedModel

MODEL_FILE = "model.safetensors"
CARD_FILE = "card.json"
TMP_PREFIX = ".tmp-"


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of ``data``, as lowercase hex."""
    return hashlib.sha256(data).hexdigest()


def sweep_prefix(sweep_id: str) -> str:
    """The folder of a sweep's artifacts."""
    return f"sweeps/{sweep_id}"


def trial_prefix(sweep_id: str, trial_id: str) -> str:
    """The folder of a trial's model and card."""
    return f"{sweep_prefix(sweep_id)}/{trial_id}"


def model_key(sweep_id: str, trial_id: str) -> str:
    """Where a trial's weights are kept."""
    return f"{trial_prefix(sweep_id, trial_id)}/{MODEL_FILE}"


def card_key(sweep_id: str, trial_id: str) -> str:
    """Where a trial's model card is kept (beside its weights)."""
    return f"{trial_prefix(sweep_id, trial_id)}/{CARD_FILE}"


def default_artifact_url(database_url: str) -> str:
    """The store beside an SQLite file (``<dir>/<stem>-artifacts``), else ``./dpsweep-artifacts``.

    Example: ``sqlite:////data/dpsweep.db`` keeps its models in ``/data/dpsweep-artifacts``.
    """
    try:
        url = make_url(database_url)
    except Exception:
        url = None
    if (
        url is not None
        and url.get_backend_name() == "sqlite"
        and url.database
        not in (
            None,
            "",
            ":memory:",
        )
    ):
        db = Path(str(url.database)).expanduser().absolute()
        return str(db.parent / f"{db.stem}-artifacts")
    return str(Path("dpsweep-artifacts").absolute())


class ArtifactStore:
    """Bytes under keys, in a directory or behind an fsspec URL.

    Args:
        url: A local path or ``file://`` URL, or any URL fsspec opens (``s3://bucket/prefix``,
            ``gs://...``, ``memory://...``); its filesystem's package must be installed.

    Raises:
        ConfigError: the URL's filesystem is unknown or its package is missing.
    """

    def __init__(self, url: str) -> None:
        import fsspec  # deferred: fsspec and its protocols load only when a store is opened

        self.url = url
        try:
            fs, root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as exc:
            raise ConfigError(
                f"artifact store {url!r} cannot be opened ({exc}); set DPSWEEP_ARTIFACT_URL to "
                "a directory or an fsspec URL whose filesystem package is installed",
                field="artifact_url",
            ) from exc
        self.fs: Any = fs
        self.root = str(root).rstrip("/")
        self.local = "file" in _protocols(fs)

    def path(self, key: str) -> str:
        """The full path of ``key`` in the store's filesystem."""
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"not a store key: {key!r}")
        return f"{self.root}/{key}"

    def put(self, key: str, data: bytes) -> None:
        """Write ``data`` under ``key``: a temporary name in the same folder, then a rename."""
        final = self.path(key)
        folder, name = final.rsplit("/", 1)
        tmp = f"{folder}/{TMP_PREFIX}{uuid.uuid4().hex}-{name}"
        self.fs.makedirs(folder, exist_ok=True)
        try:
            if self.local:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, final)
                _fsync_dir(folder)
            else:
                with self.fs.open(tmp, "wb") as f:
                    f.write(data)
                self.fs.mv(tmp, final)
        except BaseException:
            self._remove(tmp)
            raise

    def get(self, key: str) -> bytes:
        """The bytes under ``key``.

        Raises:
            FileNotFoundError: nothing is kept under ``key``.
        """
        with self.fs.open(self.path(key), "rb") as f:
            data: bytes = f.read()
        return data

    def exists(self, key: str) -> bool:
        """Whether a file is kept under ``key``."""
        return bool(self.fs.exists(self.path(key)))

    def delete(self, key: str) -> None:
        """Delete the file under ``key`` (nothing if there is none)."""
        self._remove(self.path(key))

    def delete_folder(self, prefix: str) -> None:
        """Delete everything under the folder ``prefix`` (nothing if there is none)."""
        path = self.path(prefix)
        try:
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    def folders(self, prefix: str) -> list[str]:
        """The names of the folders directly under ``prefix`` (empty if there is none)."""
        return [n for n, is_dir in self._entries(prefix) if is_dir]

    def files(self, prefix: str) -> list[str]:
        """The names of the files directly under ``prefix`` (empty if there is none)."""
        return [n for n, is_dir in self._entries(prefix) if not is_dir]

    def _entries(self, prefix: str) -> list[tuple[str, bool]]:
        path = self.path(prefix)
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        out = []
        for e in entries:
            name = str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
            out.append((name, e.get("type") == "directory"))
        return out

    def _remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)


def _protocols(fs: Any) -> tuple[str, ...]:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def _fsync_dir(folder: str) -> None:
    """Make a rename in ``folder`` durable (POSIX: sync the directory)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_store(url: str | None, *, database_url: str) -> ArtifactStore:
    """The store at ``url``, else the default one for ``database_url``
    (:func:`default_artifact_url`)."""
    return ArtifactStore(url or default_artifact_url(database_url))


def store_for(engine: Engine, settings: SweeperSettings) -> ArtifactStore:
    """The artifact store of ``settings`` (default: beside the engine's SQLite file)."""
    return open_store(
        settings.artifact_url,
        database_url=engine.url.render_as_string(hide_password=False),
    )


def quota_bytes(quota_mb: float | None) -> int | None:
    """A quota in MB (settings) as bytes; None: no limit."""
    return None if quota_mb is None else int(quota_mb * 2**20)


def usage_bytes(session: Session, owner: str | None) -> int:
    """Bytes of models (and cards) kept for ``owner`` (None: the local tenant)."""
    cond = ModelArtifact.owner.is_(None) if owner is None else ModelArtifact.owner == owner
    value = session.scalar(
        select(
            func.coalesce(func.sum(ModelArtifact.size_bytes + ModelArtifact.card_size_bytes), 0)
        ).where(cond)
    )
    return int(value or 0)


def delete_sweep_artifacts(engine: Engine, sweep_id: str, *, store: ArtifactStore) -> None:
    """Delete a sweep's artifact rows, then its folder in the store."""
    with Session(engine) as session, session.begin():
        for row in session.scalars(
            select(ModelArtifact).where(ModelArtifact.sweep_id == sweep_id)
        ).all():
            session.delete(row)
        for staged in session.scalars(
            select(StagedModel).where(StagedModel.sweep_id == sweep_id)
        ).all():
            session.delete(staged)
    store.delete_folder(sweep_prefix(sweep_id))
