"""A spec's checkpoint at submission: resolved, digested and pinned before anything is reserved.

A model that starts from a checkpoint names it in ``model.checkpoint``: on a server, a name the
operator registered (a subdirectory of ``DPSWEEP_CHECKPOINTS_DIR``, ``dpsweep checkpoints
register``), never a path an analyst writes; on the local command line also a path
(``allow_paths``, which only the local CLI passes). :func:`pin_checkpoint` resolves it
(:func:`workers.checkpoint_store.resolve_checkpoint`: an unknown name, a path on a server, an
unreadable checkpoint, one that holds code, or a ``checkpoint_digest`` that differs are refused,
naming the field) and writes the digest into the spec's ``model.checkpoint_digest``, so that the
stored spec names exactly the weights the sweep started from and every worker checks them again
before it loads anything. Torch-free: it reads files and hashes them.

:func:`checkpoint_plan_facts` and :func:`trainable_text` are what the plan and the model card
say of the model's start and of what is trained.
"""

from __future__ import annotations

from typing import Any

from dpsweep.errors import ConfigError
from dpsweep.spec import SweepSpec
from dpsweep.spec_model import LORA_RANK_AXIS, ModelConfig
from workers.checkpoint_store import checkpoint_facts, list_checkpoints, resolve_checkpoint
from workers.models.descriptors import get_model_descriptor
from workers.models.pretrained_descriptors import model_spec

_DIGEST = "model.checkpoint_digest"


def configured_checkpoints_dir(checkpoints_dir: str | None = None) -> str:
    """``checkpoints_dir``, or the settings' (``DPSWEEP_CHECKPOINTS_DIR``)."""
    if checkpoints_dir is not None:
        return checkpoints_dir
    from sweeper.settings import SweeperSettings  # deferred: pydantic-settings

    return SweeperSettings().checkpoints_dir


def pin_model(
    model: ModelConfig, *, checkpoints_dir: str | None = None, allow_paths: bool = False
) -> ModelConfig:
    """``model`` with its checkpoint resolved and its digest filled in (see the module doc).

    A registered checkpoint keeps its name; a path (local command line only) is stored as its
    absolute path, so that the Ray workers this process starts find the same files.

    Raises:
        ConfigError: field ``model.checkpoint`` (an unknown name, a path where paths are not
            allowed, a missing or unreadable checkpoint, code or pickles in it, a kind the model
            cannot load) or ``model.checkpoint_digest`` (a given digest that differs, or one
            given without a checkpoint).
    """
    # An unknown model first (a server never imports a module:function name): the name is
    # what to fix, whatever the checkpoint.
    get_model_descriptor(model.name)
    if model.checkpoint is None:
        if model.checkpoint_digest is not None:
            raise ConfigError(
                "model.checkpoint_digest names the weights of a checkpoint, but model.checkpoint "
                "is not set; name the checkpoint or leave the digest out",
                field=_DIGEST,
            )
        return model
    ref = model_spec(
        model, checkpoints_dir=configured_checkpoints_dir(checkpoints_dir), allow_paths=allow_paths
    ).checkpoint
    if ref is None:  # model_spec resolves every checkpoint it is given
        raise ConfigError("model.checkpoint did not resolve", field="model.checkpoint")
    return model.model_copy(
        update={"checkpoint": ref.name or ref.path, "checkpoint_digest": ref.digest}
    )


def pin_checkpoint(
    spec: SweepSpec, *, checkpoints_dir: str | None = None, allow_paths: bool = False
) -> SweepSpec:
    """``spec`` with :func:`pin_model` applied to its model section (the same spec without a
    checkpoint).

    Raises:
        ConfigError: as :func:`pin_model`.
    """
    model = pin_model(spec.model, checkpoints_dir=checkpoints_dir, allow_paths=allow_paths)
    if model is spec.model:
        return spec
    return spec.model_copy(update={"model": model})


def check_planned_checkpoint(spec: SweepSpec, plan: Any) -> None:
    """Refuse to store a sweep whose plan was made on other weights than its spec pins.

    A plan made before the checkpoint's files changed (the API plans, then creates) names the
    old digest: the sweep would start from weights nobody planned. Checked before anything is
    reserved.

    Raises:
        ConfigError: field ``model.checkpoint_digest``.
    """
    pinned = spec.model.checkpoint_digest
    for grid in plan.grids:
        planned = (grid.checkpoint or {}).get("digest")
        if planned != pinned:
            raise ConfigError(
                f"the plan names checkpoint digest {planned}, the spec {pinned}: the "
                "checkpoint changed while the sweep was planned; submit it again",
                field=_DIGEST,
            )


def checkpoint_plan_facts(
    model: ModelConfig, *, checkpoints_dir: str | None = None, allow_paths: bool = False
) -> dict[str, Any] | None:
    """What a plan and a model card say of the checkpoint: its name, kind and digest and its
    registration's declaration (``trained_on``, ``private_records_seen``); a local path's
    ``path`` instead of a name. None: random initial weights.

    Raises:
        ConfigError: as :func:`pin_model`.
    """
    if model.checkpoint is None:
        return None
    ref = model_spec(
        model, checkpoints_dir=configured_checkpoints_dir(checkpoints_dir), allow_paths=allow_paths
    ).checkpoint
    if ref is None:
        return None
    facts = checkpoint_facts(ref)
    if ref.name is None:
        facts["path"] = ref.path
    return facts


def trainable_text(model: ModelConfig, ranks: list[int] | None = None) -> str:
    """What is trained, in words: ``all``, ``head``, ``lora (r 8)``, ``lora (r 4-16)`` or the
    name patterns, comma-separated.

    Args:
        model: the spec's model section.
        ranks: the LoRA ranks the grid's trials get (its ``lora_r`` values); default the
            section's ``lora.r``.
    """
    trainable = model.trainable
    if isinstance(trainable, list):
        return ", ".join(trainable)
    if trainable != "lora":
        return str(trainable)
    values = sorted(set(ranks or [model.lora.r if model.lora is not None else 8]))
    rank = f"{values[0]}" if len(values) == 1 else f"{values[0]}-{values[-1]}"
    return f"lora (r {rank})"


def arm_ranks(model: ModelConfig, grid: dict[str, Any], params: dict[str, Any]) -> list[int]:
    """The LoRA ranks an arm's trials may get: its ``lora_r`` axis (a list, or an interval's
    two ends: the counts grow with the rank), its fixed ``lora_r``, or the model's
    ``lora.r``; empty when the model trains no LoRA."""
    if model.trainable != "lora":
        return []
    axis = grid.get(LORA_RANK_AXIS)
    if axis is not None:
        if isinstance(axis, list):
            return sorted({int(v) for v in axis})
        values = [*axis.values()]
        lo, hi = axis.logspace if axis.logspace is not None else axis.linspace
        ends = [10.0**lo, 10.0**hi] if axis.logspace is not None else [lo, hi]
        return sorted({round(v) for v in [*values, *ends]})
    if LORA_RANK_AXIS in params:
        return [int(params[LORA_RANK_AXIS])]
    return [model.lora.r if model.lora is not None else 8]


def checkpoint_rows(checkpoints_dir: str | None = None) -> list[dict[str, Any]]:
    """Every registered checkpoint: name, kind, digest, description, ``trained_on`` and
    ``private_records_seen`` (``dpsweep checkpoints list``, ``GET /api/v1/checkpoints``).

    No path: a listing any user may read says nothing of the server's files. A checkpoint
    that no longer reads (or holds code) is listed with a null digest; a spec naming it is
    refused.
    """
    where = configured_checkpoints_dir(checkpoints_dir)
    rows = []
    for row in list_checkpoints(where):
        try:
            digest: str | None = resolve_checkpoint(
                row["name"], checkpoints_dir=where, allow_paths=False
            ).digest
        except ConfigError:
            digest = None
        rows.append(
            {
                "name": row["name"],
                "kind": row.get("kind"),
                "digest": digest,
                "description": row.get("description") or "",
                "trained_on": row.get("trained_on"),
                "private_records_seen": row.get("private_records_seen"),
            }
        )
    return rows


__all__ = [
    "arm_ranks",
    "check_planned_checkpoint",
    "checkpoint_plan_facts",
    "checkpoint_rows",
    "configured_checkpoints_dir",
    "pin_checkpoint",
    "pin_model",
    "trainable_text",
]
