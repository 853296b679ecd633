"""The checkpoint store: digests, code-free checks, registered names and paths (torch-free)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpsweep.errors import ConfigError
from workers.checkpoint_store import (
    MANIFEST,
    checkpoint_digest,
    checkpoint_facts,
    list_checkpoints,
    register_checkpoint,
    resolve_checkpoint,
    verify_checkpoint,
)


def _ckpt(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (root / "model.safetensors").write_bytes(b"weights")
    return root


def test_digest_covers_names_and_contents(tmp_path: Path) -> None:
    a = _ckpt(tmp_path / "a")
    d = checkpoint_digest(a)
    assert d.startswith("sha256:") and len(d) == 71
    assert checkpoint_digest(a) == d
    (a / "model.safetensors").write_bytes(b"weightz")
    assert checkpoint_digest(a) != d
    (a / "model.safetensors").write_bytes(b"weights")
    (a / "model.safetensors").rename(a / "other.safetensors")
    assert checkpoint_digest(a) != d


def test_registration_keeps_the_digest_and_declares_public_training(tmp_path: Path) -> None:
    src = _ckpt(tmp_path / "src")
    store = tmp_path / "store"
    ref = register_checkpoint(
        src, name="tiny-bert", kind="hf", trained_on="wikitext-103", checkpoints_dir=store
    )
    assert ref.digest == checkpoint_digest(src)  # the manifest is not part of the weights
    manifest = json.loads((store / "tiny-bert" / MANIFEST).read_text())
    assert manifest["private_records_seen"] is False
    assert manifest["trained_on"] == "wikitext-103"
    got = resolve_checkpoint("tiny-bert", checkpoints_dir=store, allow_paths=False, kind="hf")
    assert (got.name, got.kind, got.digest) == ("tiny-bert", "hf", ref.digest)
    facts = checkpoint_facts(got)
    assert facts["trained_on"] == "wikitext-103" and facts["path"] is None
    assert [c["name"] for c in list_checkpoints(store)] == ["tiny-bert"]
    with pytest.raises(ConfigError, match="already registered"):
        register_checkpoint(src, name="tiny-bert", kind="hf", trained_on="x", checkpoints_dir=store)


def test_paths_only_where_allowed(tmp_path: Path) -> None:
    src = _ckpt(tmp_path / "src")
    with pytest.raises(ConfigError, match="on a server a checkpoint is a name") as exc:
        resolve_checkpoint(str(src), checkpoints_dir=tmp_path, allow_paths=False)
    assert exc.value.field == "model.checkpoint"
    ref = resolve_checkpoint(str(src), checkpoints_dir=tmp_path, allow_paths=True, kind="hf")
    assert ref.name is None and ref.path == str(src.resolve())
    with pytest.raises(ConfigError, match="no checkpoint registered as 'nope'"):
        resolve_checkpoint("nope", checkpoints_dir=tmp_path, allow_paths=True)
    with pytest.raises(ConfigError, match="no such file"):
        resolve_checkpoint(str(tmp_path / "missing"), checkpoints_dir=tmp_path, allow_paths=True)


def test_wrong_kind_and_digest_mismatch(tmp_path: Path) -> None:
    store = tmp_path / "store"
    register_checkpoint(
        _ckpt(tmp_path / "src"), name="b", kind="hf", trained_on="x", checkpoints_dir=store
    )
    with pytest.raises(ConfigError, match="is a hf checkpoint; this model needs timm"):
        resolve_checkpoint("b", checkpoints_dir=store, allow_paths=False, kind="timm")
    with pytest.raises(ConfigError, match="its files changed") as exc:
        resolve_checkpoint(
            "b", checkpoints_dir=store, allow_paths=False, digest="sha256:" + "0" * 64
        )
    assert exc.value.field == "model.checkpoint_digest"
    ref = resolve_checkpoint("b", checkpoints_dir=store, allow_paths=False)
    (store / "b" / "model.safetensors").write_bytes(b"swapped")
    with pytest.raises(ConfigError, match="contents changed since the run was planned"):
        verify_checkpoint(ref)


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("modeling_evil.py", b"import os", "holds code"),
        ("pytorch_model.bin", b"\x80\x04", "pickle"),
        ("extra.pkl", b"\x80\x04", "pickle"),
    ],
)
def test_code_and_pickles_refused(tmp_path: Path, name: str, content: bytes, match: str) -> None:
    src = _ckpt(tmp_path / "src")
    (src / name).write_bytes(content)
    with pytest.raises(ConfigError, match=match):
        resolve_checkpoint(str(src), checkpoints_dir=tmp_path, allow_paths=True, kind="hf")
    with pytest.raises(ConfigError, match=match):
        register_checkpoint(
            src, name="x", kind="hf", trained_on="x", checkpoints_dir=tmp_path / "s"
        )
    assert not (tmp_path / "s" / "x").exists()


def test_auto_map_refused(tmp_path: Path) -> None:
    src = _ckpt(tmp_path / "src")
    (src / "config.json").write_text(json.dumps({"auto_map": {"AutoModel": "m.Model"}}))
    with pytest.raises(ConfigError, match="trust_remote_code"):
        resolve_checkpoint(str(src), checkpoints_dir=tmp_path, allow_paths=True, kind="hf")


def test_one_weights_only_pickle_for_vision_kinds(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "weights.pth").write_bytes(b"\x80\x04")
    ref = resolve_checkpoint(str(src), checkpoints_dir=tmp_path, allow_paths=True, kind="timm")
    assert ref.kind == "timm"
    (src / "second.pt").write_bytes(b"\x80\x04")
    with pytest.raises(ConfigError, match="pickle"):
        resolve_checkpoint(str(src), checkpoints_dir=tmp_path, allow_paths=True, kind="timm")


def test_links_refused(tmp_path: Path) -> None:
    src = _ckpt(tmp_path / "src")
    (src / "link.safetensors").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="link"):
        checkpoint_digest(src)
