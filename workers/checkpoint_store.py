"""Local checkpoints a model may start from: their digest, their checks, and their registration.

Torch-free, so that submission and planning resolve and check a spec's ``model.checkpoint``
before anything is reserved. A checkpoint is *code-free input*: a directory (or one file) of
weights and configuration that is read, never executed. So a checkpoint that would need code to
load is refused here, before anything else reads it:

* Python files (``*.py``) or a ``config.json`` whose ``auto_map`` names remote code (what
  ``trust_remote_code`` would import; we never pass it);
* unrestricted pickles: ``*.pkl``, ``*.pickle``, ``*.ckpt``, ``*.bin``, ``*.pt``, ``*.pth``,
  except the one weights file of a ``timm`` / ``torchvision`` checkpoint, which the worker reads
  with ``torch.load(weights_only=True)`` (tensors only, no objects);
* anything that is not a regular file (links, devices): a link could point the digest at one
  file and the loader at another.

On a server a checkpoint is a *name*: a subdirectory of the operator's checkpoints directory
(``DPSWEEP_CHECKPOINTS_DIR``, default ``./dpsweep-checkpoints``) holding the manifest
``dpsweep-checkpoint.json`` (:func:`register_checkpoint` writes it). The manifest declares the
public data the weights were trained on and that they have seen no private record: the frozen
weights are a public input of every DP release that starts from them, so this declaration is
what makes freezing them free of ε. A path is accepted only on the local command line.

The digest (``sha256:<hex>`` over the sorted relative paths and contents, the manifest left
out) names exactly the
bytes a sweep started from; a worker computes it again before it loads the weights, and a
mismatch fails closed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsweep.errors import ConfigError

#: The manifest a registered checkpoint holds.
MANIFEST = "dpsweep-checkpoint.json"
#: The kinds of checkpoint a model may start from (``name: hf`` / ``timm`` / ``torchvision``;
#: ``state_dict`` for a built-in architecture's own safetensors weights).
CHECKPOINT_KINDS: tuple[str, ...] = ("hf", "timm", "torchvision", "state_dict")
#: Files a checkpoint may hold that only code could read: unrestricted pickles.
PICKLE_SUFFIXES: tuple[str, ...] = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
#: The pickle suffixes read with ``torch.load(weights_only=True)`` (timm / torchvision only).
WEIGHTS_ONLY_SUFFIXES: tuple[str, ...] = (".pt", ".pth", ".bin")
_FIELD = "model.checkpoint"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class CheckpointRef:
    """A checked checkpoint: where it is, its content digest and its kind.

    Args:
        path: the checkpoint directory (or single weights file), absolute.
        digest: ``sha256:<hex>`` of its contents (:func:`checkpoint_digest`).
        kind: one of :data:`CHECKPOINT_KINDS`.
        name: the registered name it was resolved from (None: a path on the local CLI).
    """

    path: str
    digest: str
    kind: str
    name: str | None = None


def _files(root: Path) -> list[tuple[str, Path]]:
    """``(relative posix path, path)`` of every file under ``root`` (itself, if a file), sorted.

    Raises:
        ConfigError: a link or another non-regular file (the digest must cover what is read).
    """
    if root.is_symlink():
        raise ConfigError(f"checkpoint {root} is a symbolic link; give its target", field=_FIELD)
    if root.is_file():
        return [(root.name, root)]
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink() or not (p.is_dir() or p.is_file()):
                raise ConfigError(
                    f"checkpoint {root}: {p.relative_to(root)} is a link or not a regular file; "
                    "a checkpoint holds plain files only (copy the target in)",
                    field=_FIELD,
                )
        out += [
            ((Path(dirpath) / f).relative_to(root).as_posix(), Path(dirpath) / f) for f in filenames
        ]
    return sorted(out)


def checkpoint_digest(path: str | os.PathLike[str]) -> str:
    """The content digest of a checkpoint file or directory: ``sha256:<hex>``.

    Over every file in sorted relative-path order: its path, its size and its bytes (streamed),
    so that a renamed, added, removed or changed file changes the digest.

    Raises:
        ConfigError: a missing or unreadable checkpoint (field ``model.checkpoint``).
    """
    root = Path(path)
    if not root.exists():
        raise ConfigError(f"checkpoint {root}: no such file or directory", field=_FIELD)
    h = hashlib.sha256()
    try:
        # The manifest is the registration's, not the weights': a checkpoint has one digest
        # as a local path and once registered.
        for rel, p in _files(root):
            if rel == MANIFEST:
                continue
            h.update(rel.encode() + b"\0" + str(p.stat().st_size).encode() + b"\0")
            with p.open("rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
    except OSError as exc:
        raise ConfigError(
            f"checkpoint {root}: unreadable ({type(exc).__name__}: {exc.strerror})", field=_FIELD
        ) from None
    return f"sha256:{h.hexdigest()}"


_digests: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}
_lock = threading.Lock()


def cached_digest(path: str | os.PathLike[str]) -> str:
    """:func:`checkpoint_digest`, computed once per process for unchanged files.

    The key is every file's relative path, size and modification time: any change reads the
    bytes again (a worker builds the same checkpoint for each trial of a pack).
    """
    root = Path(path)
    try:
        stamp = tuple((rel, p.stat().st_size, p.stat().st_mtime_ns) for rel, p in _files(root))
    except OSError:
        return checkpoint_digest(root)  # raises the readable error
    key = (str(root.resolve()), stamp)
    with _lock:
        if key in _digests:
            return _digests[key]
    digest = checkpoint_digest(root)
    with _lock:
        _digests[key] = digest
    return digest


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A checkpoint directory's manifest (``dpsweep-checkpoint.json``), or None without one.

    Raises:
        ConfigError: a manifest that is not a JSON object.
    """
    file = Path(path) / MANIFEST
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"checkpoint {path}: {MANIFEST} is not readable JSON ({type(exc).__name__})",
            field=_FIELD,
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"checkpoint {path}: {MANIFEST} must be a JSON object", field=_FIELD)
    return data


def check_code_free(path: str | os.PathLike[str], kind: str) -> None:
    """Refuse a checkpoint that only code could load (see the module docstring).

    Raises:
        ConfigError: a ``*.py`` file, remote code named by ``config.json``'s ``auto_map``, or a
            pickle file (field ``model.checkpoint``).
    """
    root = Path(path)
    files = _files(root)
    weights_only_ok = kind in ("timm", "torchvision")
    pickles = []
    for rel, p in files:
        suffix = p.suffix.lower()
        if suffix == ".py":
            raise ConfigError(
                f"checkpoint {root} holds code ({rel}); a checkpoint is code-free input and is "
                "never loaded with trust_remote_code: remove the file, or use an architecture "
                "transformers knows",
                field=_FIELD,
            )
        if suffix in PICKLE_SUFFIXES:
            pickles.append(rel)
    config = root / "config.json" if root.is_dir() else None
    if config is not None and config.is_file():
        try:
            auto_map = json.loads(config.read_text(encoding="utf-8")).get("auto_map")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            raise ConfigError(f"checkpoint {root}: config.json is not JSON", field=_FIELD) from None
        if auto_map:
            raise ConfigError(
                f"checkpoint {root}: config.json's auto_map names remote code, which would need "
                "trust_remote_code; use an architecture transformers knows",
                field=_FIELD,
            )
    allowed = (
        weights_only_ok
        and len(pickles) == 1
        and Path(pickles[0]).suffix.lower() in WEIGHTS_ONLY_SUFFIXES
    )
    if pickles and not allowed:
        raise ConfigError(
            f"checkpoint {root} holds pickle file(s) {pickles}: unpickling can run code; convert "
            "the weights to safetensors (a timm / torchvision checkpoint may hold one .pt/.pth "
            "read with torch.load(weights_only=True))",
            field=_FIELD,
        )


def _is_path(name_or_path: str) -> bool:
    """A path (``./x``, ``/x``, ``~/x``, ``a/b``, ``x.safetensors``), not a registered name."""
    return (
        os.sep in name_or_path
        or "/" in name_or_path
        or name_or_path.startswith((".", "~"))
        or name_or_path.endswith(".safetensors")
    )


def resolve_checkpoint(
    name_or_path: str,
    *,
    checkpoints_dir: str | os.PathLike[str],
    allow_paths: bool,
    kind: str | None = None,
    digest: str | None = None,
) -> CheckpointRef:
    """The checked checkpoint a spec's ``model.checkpoint`` names.

    Args:
        name_or_path: a registered name (a subdirectory of ``checkpoints_dir`` with a
            manifest), or a path (only where ``allow_paths``).
        checkpoints_dir: the operator's checkpoints directory (``DPSWEEP_CHECKPOINTS_DIR``).
        allow_paths: accept a path (the local command line; never a server).
        kind: the kind the model needs (``hf``, ``timm``, ...); a registered checkpoint of
            another kind is refused. None: the manifest's (``state_dict`` without one).
        digest: the spec's ``checkpoint_digest``; given, the contents must match it.

    Raises:
        ConfigError: field ``model.checkpoint`` (``model.checkpoint_digest`` for a mismatch):
            an unknown name, a path where paths are not allowed, a missing or unreadable
            checkpoint, the wrong kind, code or pickles in it, or a digest mismatch.
    """
    name: str | None = None
    if _is_path(name_or_path):
        if not allow_paths:
            raise ConfigError(
                f"model.checkpoint {name_or_path!r} is a path; on a server a checkpoint is a name "
                "the operator registered (dpsweep checkpoints register; dpsweep checkpoints list)",
                field=_FIELD,
            )
        root = Path(name_or_path).expanduser().resolve()
    else:
        name = name_or_path
        root = (Path(checkpoints_dir).expanduser() / name).resolve()
        if not (root / MANIFEST).is_file():
            raise ConfigError(
                f"no checkpoint registered as {name!r} in {Path(checkpoints_dir)}; register it "
                "with dpsweep checkpoints register (or, on the local command line, give a path "
                "such as ./my-checkpoint)",
                field=_FIELD,
            )
    if not root.exists():
        raise ConfigError(f"checkpoint {name_or_path!r}: no such file or directory", field=_FIELD)
    manifest = read_manifest(root) if root.is_dir() else None
    declared = (manifest or {}).get("kind")
    if declared is not None and declared not in CHECKPOINT_KINDS:
        raise ConfigError(
            f"checkpoint {name_or_path!r}: unknown kind {declared!r} in {MANIFEST}", field=_FIELD
        )
    if kind is not None and declared is not None and declared != kind:
        raise ConfigError(
            f"checkpoint {name_or_path!r} is a {declared} checkpoint; this model needs {kind}",
            field=_FIELD,
        )
    resolved_kind = kind or declared or "state_dict"
    check_code_free(root, resolved_kind)
    actual = cached_digest(root)
    if digest is not None and digest != actual:
        raise ConfigError(
            f"checkpoint {name_or_path!r} has digest {actual}, not the {digest} the spec names: "
            "its files changed; use the checkpoint the sweep was planned on, or drop "
            "checkpoint_digest to plan on this one",
            field="model.checkpoint_digest",
        )
    return CheckpointRef(path=str(root), digest=actual, kind=resolved_kind, name=name)


def verify_checkpoint(ref: CheckpointRef) -> None:
    """Refuse a checkpoint whose contents changed since it was resolved (a worker, before it
    loads the weights: fail closed), or that is no longer code-free.

    Raises:
        ConfigError: field ``model.checkpoint_digest`` on a mismatch.
    """
    check_code_free(ref.path, ref.kind)
    actual = cached_digest(ref.path)
    if actual != ref.digest:
        raise ConfigError(
            f"checkpoint {ref.name or ref.path}: its contents changed since the run was planned "
            f"(digest {actual}, planned {ref.digest}); nothing was loaded",
            field="model.checkpoint_digest",
        )


def register_checkpoint(
    src: str | os.PathLike[str],
    *,
    name: str,
    kind: str,
    trained_on: str,
    checkpoints_dir: str | os.PathLike[str],
    description: str = "",
) -> CheckpointRef:
    """Copy a checkpoint into the operator's checkpoints directory under ``name``, with its
    manifest (``dpsweep checkpoints register``).

    The manifest records ``kind``, ``description``, ``trained_on`` (the public data the weights
    were trained on) and ``private_records_seen: false``: by registering, the operator declares
    that the weights have seen no private record of any dataset this server holds.

    Args:
        src: the checkpoint directory or single weights file.
        name: the registered name: letters, digits, ``-``, ``_`` and ``.``, not a path.
        kind: one of :data:`CHECKPOINT_KINDS`.
        trained_on: what public data the weights were trained on (shown on model cards).
        checkpoints_dir: where registered checkpoints live (created if missing).
        description: one line for listings.

    Returns:
        The registered checkpoint (its digest computed on the copy).

    Raises:
        ConfigError: a bad name or kind, a name already registered, or a checkpoint that
            :func:`check_code_free` refuses (nothing is copied then).
    """
    if not name or _is_path(name) or not all(c.isalnum() or c in "-_." for c in name):
        raise ConfigError(
            f"checkpoint name {name!r}: use letters, digits, '-', '_' and '.', not a path",
            field="name",
        )
    if kind not in CHECKPOINT_KINDS:
        raise ConfigError(
            f"checkpoint kind {kind!r}: one of {list(CHECKPOINT_KINDS)}", field="kind"
        )
    if not trained_on.strip():
        raise ConfigError(
            "say what public data the checkpoint was trained on (trained_on)", field="trained_on"
        )
    source = Path(src).expanduser()
    if not source.exists():
        raise ConfigError(f"checkpoint {source}: no such file or directory", field=_FIELD)
    check_code_free(source, kind)
    dest = Path(checkpoints_dir).expanduser() / name
    if dest.exists():
        raise ConfigError(f"a checkpoint named {name!r} is already registered", field="name")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if source.is_dir():
        shutil.copytree(source, tmp, symlinks=False, ignore=shutil.ignore_patterns(MANIFEST))
    else:
        tmp.mkdir()
        shutil.copy2(source, tmp / source.name)
    manifest = {
        "kind": kind,
        "description": description,
        "trained_on": trained_on,
        "private_records_seen": False,
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    tmp.rename(dest)
    return CheckpointRef(
        path=str(dest.resolve()), digest=checkpoint_digest(dest), kind=kind, name=name
    )


def list_checkpoints(checkpoints_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The registered checkpoints: name, kind, description, trained_on (for listings).

    The digest is not computed here (it reads every byte); :func:`resolve_checkpoint` does.
    """
    root = Path(checkpoints_dir).expanduser()
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.iterdir()):
        if d.is_dir() and not d.name.startswith(".") and (d / MANIFEST).is_file():
            try:
                manifest = read_manifest(d) or {}
            except ConfigError:
                continue
            out.append(
                {
                    "name": d.name,
                    **{
                        k: manifest.get(k)
                        for k in ("kind", "description", "trained_on", "private_records_seen")
                    },
                }
            )
    return out


def checkpoint_facts(ref: CheckpointRef) -> dict[str, Any]:
    """Public facts of a checkpoint for a plan or a model card: name, kind, digest, and its
    manifest's declaration (``trained_on``, ``private_records_seen``)."""
    manifest = read_manifest(ref.path) if Path(ref.path).is_dir() else None
    return {
        "name": ref.name,
        # A path only for a local checkpoint (a server's are names): the local card rebuilds.
        "path": ref.path if ref.name is None else None,
        "kind": ref.kind,
        "digest": ref.digest,
        "trained_on": (manifest or {}).get("trained_on"),
        "private_records_seen": (manifest or {}).get("private_records_seen"),
    }


__all__ = [
    "CHECKPOINT_KINDS",
    "MANIFEST",
    "CheckpointRef",
    "cached_digest",
    "check_code_free",
    "checkpoint_digest",
    "checkpoint_facts",
    "list_checkpoints",
    "read_manifest",
    "register_checkpoint",
    "resolve_checkpoint",
    "verify_checkpoint",
]
