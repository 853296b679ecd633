"""A handle on one trial: its fields (it is the trial's dict), and its kept model.

A :class:`Trial` is a ``dict`` of what the server said about the trial (``GET
/api/v1/trials/{id}``, or an item of a sweep's trial list), so code that indexes trial dicts
keeps working; it adds the calls that fetch the trained model kept for it::

    best = sweep.best_trial()
    card = best.model_card()                 # data, architecture, privacy, metrics
    path = best.download_model("models/")    # models/dpsweep-<id>.safetensors + .card.json
    module = best.load_model()               # a torch module (needs dpsweep[server])

Downloads are checked against the SHA-256 the server sends (``ETag`` / ``Repr-Digest``):
bytes that do not match are never written.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib.metadata
import json
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpsweep.errors import ArtifactCorrupt, ConfigError
from dpsweep.transport import HttpTransport

SAFETENSORS = "application/octet-stream"
CARD_SUFFIX = ".card.json"
INSTALL_HINT = 'pip install "dpsweep[server]"'

# The entry-point group through which the server extra lends the SDK its model registry:
# ``build`` (card's model info, weights bytes -> torch module) and ``onnx`` (model info,
# weights bytes, path -> path). Looked up by name, so the SDK never imports the workers
# package (dpsweep is the bottom layer and depends on none above it).
MODEL_LOADERS_GROUP = "dpsweep.model_loaders"


def model_loader(name: str) -> Callable[..., Any]:
    """The model loader registered as ``name`` in the ``dpsweep.model_loaders`` group.

    Raises:
        ConfigError: no installed package provides it (the message says what to install).
    """
    found = importlib.metadata.entry_points(group=MODEL_LOADERS_GROUP, name=name)
    for entry in found:
        loader: Callable[..., Any] = entry.load()
        return loader
    raise ConfigError(
        f"no model loader {name!r} is installed (entry-point group {MODEL_LOADERS_GROUP}); "
        f"install the server extra: {INSTALL_HINT}"
    )


def scaled_inputs_reason(card: dict[str, Any]) -> str | None:
    """Why a kept model does not take raw records (its card's ``model.input_transform``), or
    None when it does."""
    described = (card.get("model") or {}).get("input_transform")
    if not isinstance(described, dict):
        return "it was kept before model files carried their input transform"
    if described.get("raw_inputs"):
        return None
    return str(described.get("reason") or "its card says it takes scaled inputs")


def warn_scaled_inputs(card: dict[str, Any], trial_id: str) -> None:
    """A ``UserWarning`` when the model of ``card`` takes scaled inputs, not raw records."""
    reason = scaled_inputs_reason(card)
    if reason is not None:
        warnings.warn(
            f"the model of trial {trial_id} takes inputs scaled as its trainer scaled them, "
            f"not raw records: {reason}",
            UserWarning,
            stacklevel=3,
        )


class Trial(dict[str, Any]):
    """One trial: the server's dict of it, plus its kept model.

    Attributes:
        id: The trial's id.
        model: Its kept model as listed (``{"sha256", "size_bytes", "reproducible", "url",
            "card_url"}``), or None when none is kept (or the listing predates models).
    """

    def __init__(self, client: HttpTransport, data: dict[str, Any]) -> None:
        super().__init__(data)
        self._client = client

    def __repr__(self) -> str:
        return f"<Trial {self.get('id')} {self.get('state')}>"

    @property
    def id(self) -> str:
        return str(self["id"])

    @property
    def model(self) -> dict[str, Any] | None:
        ref = self.get("model")
        return dict(ref) if isinstance(ref, dict) else None

    def refresh(self) -> Trial:
        """Re-read the trial's details from the server (all of ``GET /trials/{id}``)."""
        data = self._client._json("GET", f"/trials/{self.id}")
        self.clear()
        self.update(data)
        return self

    # -- the kept model ---------------------------------------------------------------------

    def model_card(self) -> dict[str, Any]:
        """The model card kept beside the trial's model: dataset, architecture, strategy and
        hyperparameters, the ε and δ of its release with the accountant, σ, q and T, the
        evaluation data, metrics and the dpsweep version.

        Raises:
            NotFound: the trial is not yours, or no model is kept for it (the detail says why).
            ArtifactCorrupt: the card received does not match its content hash.
        """
        return dict(json.loads(self._card_bytes()))

    def download_model(self, path: str | Path) -> Path:
        """Download the trial's model (safetensors) and its card.

        Args:
            path: A directory (existing, or written with a trailing ``/``): the model goes
                there as ``dpsweep-<trial>.safetensors``; or a file path for the model. The
                card is written beside the model as ``dpsweep-<id>.card.json``.

        Returns:
            The model file's path.

        Raises:
            NotFound: the trial is not yours, or no model is kept for it (the detail says why).
            ArtifactCorrupt: the bytes received do not match their SHA-256 (nothing is
                written).
        """
        target = Path(path).expanduser()
        if target.is_dir() or str(path).endswith(("/", os.sep)):
            target = target / f"dpsweep-{self.id}.safetensors"
        data = self._model_bytes()
        card = self._card_bytes()
        target.parent.mkdir(parents=True, exist_ok=True)
        _write(target, data)
        # The card beside the weights, named after them: several models fit one folder.
        _write(target.with_name(target.name.removesuffix(".safetensors") + CARD_SUFFIX), card)
        return target

    def load_model(self) -> Any:
        """The trained model as a ``torch.nn.Module`` in eval mode: the card's architecture,
        built from the model registry, with the downloaded weights.

        It takes raw records: the file carries the input transform the trainer applied, and
        the module applies it first (the card's ``model.input_transform``). A model whose
        transform may not leave with it (scaled by statistics of a carve-out of the private
        records) takes inputs scaled as the trainer scaled them; a ``UserWarning`` says so.

        Needs torch and the model registry (the server extra: ``pip install
        "dpsweep[server]"``); a plug-in architecture also needs its package installed.

        Raises:
            ConfigError: torch or safetensors is missing (the message says what to install),
                or the architecture is unknown here.
            NotFound, ArtifactCorrupt: as :meth:`download_model`.
        """
        try:
            import safetensors  # noqa: F401
            import torch  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                f"load_model needs torch and safetensors ({exc}); install the server extra: "
                f"{INSTALL_HINT}. download_model() works without them."
            ) from exc
        build_trained = model_loader("build")

        card = self.model_card()
        info = card.get("model")
        if not isinstance(info, dict) or not {"name", "input_shape", "num_classes"} <= set(info):
            raise ConfigError(
                f"the model card of trial {self.id} does not describe its architecture "
                "(model.name, input_shape, num_classes)"
            )
        module = build_trained(info, self._model_bytes())
        warn_scaled_inputs(card, self.id)
        return module

    def export_onnx(self, path: str | os.PathLike[str]) -> Path:
        """Export the trained model to ONNX at ``path`` (built-in architectures; a dynamic
        batch axis; inputs named ``input``, outputs ``output``).

        Needs the server extra and the onnx package (``pip install "dpsweep[server,onnx]"``).

        Raises:
            ConfigError: a package is missing (the message says which), or the architecture
                cannot be exported.
            NotFound, ArtifactCorrupt: as :meth:`download_model`.
        """
        try:
            import onnx  # noqa: F401
            import torch  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                f"export_onnx needs torch and onnx ({exc}); install "
                '`pip install "dpsweep[server,onnx]"`'
            ) from exc
        export_trained = model_loader("onnx")

        card = self.model_card()
        out = export_trained(card["model"], self._model_bytes(), Path(path).expanduser())
        warn_scaled_inputs(card, self.id)
        return Path(out)

    # -- bytes ------------------------------------------------------------------------------

    def _model_bytes(self) -> bytes:
        r = self._client.request("GET", f"/trials/{self.id}/model", headers={"Accept": SAFETENSORS})
        data = r.content
        listed = (self.model or {}).get("sha256")
        verify(data, r.headers, what=f"model of trial {self.id}", expected=listed)
        return data

    def _card_bytes(self) -> bytes:
        r = self._client.request("GET", f"/trials/{self.id}/model-card")
        data = r.content
        verify(data, r.headers, what=f"model card of trial {self.id}")
        return data


def verify(data: bytes, headers: Any, *, what: str, expected: str | None = None) -> str:
    """Check ``data`` against the SHA-256 its response names (``Repr-Digest``, ``Digest`` or
    the ``ETag``) and, if given, against ``expected`` (hex, from a listing).

    Returns:
        The SHA-256 of ``data`` in hex.

    Raises:
        ArtifactCorrupt: a named hash differs, or the response names none.
    """
    actual = hashlib.sha256(data).hexdigest()
    claimed = [h for h in (_digest(headers), _etag(headers), expected) if h]
    if not claimed:
        raise ArtifactCorrupt(
            f"the {what} came without a content hash (no ETag or Repr-Digest); it cannot be "
            "checked, so it was not used"
        )
    for h in claimed:
        if h.lower() != actual:
            raise ArtifactCorrupt(
                f"the {what} does not match its SHA-256: received {len(data)} bytes hashing "
                f"to {actual}, expected {h.lower()}; it was damaged on the way (nothing was "
                "written); try again"
            )
    return actual


def _digest(headers: Any) -> str | None:
    """The SHA-256 (hex) in ``Repr-Digest`` (``sha-256=:b64:``) or ``Digest``
    (``sha-256=b64``), if any."""
    for name in ("repr-digest", "digest"):
        raw = headers.get(name)
        if not raw:
            continue
        for part in str(raw).split(","):
            algo, _, value = part.strip().partition("=")
            if algo.strip().lower() != "sha-256":
                continue
            try:
                return base64.b64decode(value.strip().strip(":"), validate=True).hex()
            except (binascii.Error, ValueError):
                return "unparseable:" + value.strip()
    return None


def _etag(headers: Any) -> str | None:
    """The SHA-256 (hex) that a strong ``ETag`` of the form ``"<hex>"`` names, if any."""
    raw = str(headers.get("etag") or "").strip()
    if not raw or raw.startswith("W/"):
        return None  # a weak tag (a proxy's) names no exact bytes
    tag = raw.strip('"')
    return tag if len(tag) == 64 and all(c in "0123456789abcdefABCDEF" for c in tag) else None


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (a temporary file, then a rename)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


__all__ = ["Trial", "verify"]
