"""The artifact store: a directory, a file:// URL and fsspec's memory filesystem alike."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsweep.errors import ConfigError
from sweeper.store.artifact_files import (
    TMP_PREFIX,
    ArtifactStore,
    default_artifact_url,
    model_key,
    sweep_prefix,
)


@pytest.fixture(params=["dir", "file-url", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    if request.param == "dir":
        return ArtifactStore(str(tmp_path / "store"))
    if request.param == "file-url":
        return ArtifactStore(f"file://{tmp_path / 'store'}")
    return ArtifactStore(f"memory://dpsweep-test-{uuid.uuid4().hex}")


def test_put_get_list_delete(store: ArtifactStore) -> None:
    key = model_key("s1", "t1")
    store.put(key, b"weights")
    store.put("sweeps/s1/t1/card.json", b"{}")
    store.put("sweeps/s1/t2/card.json", b"{}")
    assert store.get(key) == b"weights" and store.exists(key)
    assert sorted(store.folders(sweep_prefix("s1"))) == ["t1", "t2"]
    assert sorted(store.files("sweeps/s1/t1")) == ["card.json", "model.safetensors"]
    store.put(key, b"new")  # a rewrite replaces the file whole
    assert store.get(key) == b"new"
    store.delete(key)
    store.delete(key)  # deleting nothing is fine
    assert not store.exists(key)
    store.delete_folder(sweep_prefix("s1"))
    assert store.folders("sweeps") == [] and store.files("sweeps/s1/t1") == []
    with pytest.raises(FileNotFoundError):
        store.get(key)


def test_keys_cannot_leave_the_store(store: ArtifactStore) -> None:
    for bad in ("../x", "sweeps/../../x", "/etc/passwd"):
        with pytest.raises(ValueError):
            store.put(bad, b"x")


def test_a_failed_write_leaves_nothing_under_the_key(
    store: ArtifactStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_: object, **__: object) -> None:
        raise OSError("disk full")

    # The rename is the last step: failing there, the bytes were already all written.
    if store.local:
        monkeypatch.setattr("sweeper.store.artifact_files.os.replace", boom)
    else:
        monkeypatch.setattr(store.fs, "mv", boom)
    key = model_key("s", "t")
    with pytest.raises(OSError):
        store.put(key, b"abc")
    assert not store.exists(key)
    assert not [n for n in store.files("sweeps/s/t") if n.startswith(TMP_PREFIX)]


@settings(max_examples=25, deadline=None)
@given(data=st.binary(max_size=4096))
def test_round_trip_is_exact(data: bytes) -> None:
    s = ArtifactStore(f"memory://dpsweep-prop-{uuid.uuid4().hex}")
    s.put("sweeps/a/b/model.safetensors", data)
    assert s.get("sweeps/a/b/model.safetensors") == data


def test_default_store_lies_beside_the_sqlite_file(tmp_path: Path) -> None:
    assert default_artifact_url(f"sqlite:///{tmp_path / 'x.db'}") == str(tmp_path / "x-artifacts")
    assert default_artifact_url("postgresql+psycopg://u@h/db").endswith("dpsweep-artifacts")
    assert default_artifact_url("sqlite://").endswith("dpsweep-artifacts")


def test_an_unknown_filesystem_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as exc:
        ArtifactStore("nosuchfs://bucket/x")
    assert exc.value.field == "artifact_url" and "DPSWEEP_ARTIFACT_URL" in str(exc.value)
