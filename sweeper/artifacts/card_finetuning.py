"""A model card's ``finetuning`` section: where the weights started and what DP-SGD trained.

A sweep's card reads it from the trial's grid plan (what planning stated: the checkpoint's
name, kind and pinned digest, its registration's declaration, ``trainable``, the parameters
trained of the total) and the trial's own LoRA rank; a ``dpsweep train`` card computes it from
the run as prepared. For a LoRA grid with several ranks, the plan states the counts at its
smallest and largest rank; a rank between them is interpolated exactly (LoRA's adapter
parameters grow linearly with the rank: ``r * (in + out)`` per adapted layer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpsweep.plan import GridPlan
from dpsweep.spec import ArmConfig
from dpsweep.spec_model import LORA_RANK_AXIS, ModelConfig
from sweeper.artifacts.card_texts import CHECKPOINT_DECLARED, CHECKPOINT_UNDECLARED, FROZEN_NOTE
from sweeper.sweeps.checkpoints import arm_ranks, trainable_text


def checkpoint_section(facts: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The checkpoint as a card names it (None: random initial weights): its name (or local
    path), kind, digest, ``trained_on`` and ``private_records_seen`` as registered, and the
    statement of what its registration declares."""
    if facts is None:
        return None
    section = {
        k: facts.get(k)
        for k in ("name", "path", "kind", "digest", "trained_on", "private_records_seen")
        if k != "path" or facts.get("path")
    }
    declared = facts.get("private_records_seen") is False
    section["statement"] = (
        CHECKPOINT_DECLARED.format(trained_on=facts.get("trained_on") or "not stated")
        if declared
        else CHECKPOINT_UNDECLARED
    )
    return section


def finetuning_section(
    *,
    checkpoint: Mapping[str, Any] | None,
    trainable: str | None,
    lora_r: int | None,
    trained: int | None,
    total: int | None,
    pretrained: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The card's ``finetuning`` section (see the module doc); ``pretrained``: the public
    pre-training the weights started from (its dataset, the weights' digest and the recipe, as
    the worker reports them), None without one."""
    return {
        "checkpoint": checkpoint_section(checkpoint),
        "pretrained": dict(pretrained) if pretrained else None,
        "trainable": trainable or "all",
        "lora_r": lora_r,
        "trained_parameters": trained,
        "total_parameters": total,
        "note": FROZEN_NOTE,
    }


def trial_finetuning(
    spec: Mapping[str, Any],
    grid: GridPlan,
    arm: str,
    params: Mapping[str, Any],
    *,
    pretrained: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``finetuning`` section of a sweep trial's card.

    Args:
        spec: The stored spec (JSON).
        grid: The trial's grid plan.
        arm: The trial's arm label.
        params: The trial's own params (its ``lora_r`` when the arm sweeps it).
        pretrained: The public pre-training the worker reports in the model's info.
    """
    model = ModelConfig.model_validate(spec.get("model") or {"name": "?"})
    arms = [ArmConfig.model_validate(a) for a in spec.get("arms") or ()]
    arm_cfg = next((a for a in arms if a.label == arm), None)
    ranks = arm_ranks(model, arm_cfg.grid, arm_cfg.params) if arm_cfg is not None else []
    rank = params.get(LORA_RANK_AXIS)
    if rank is None and arm_cfg is not None:
        rank = arm_cfg.params.get(LORA_RANK_AXIS)
    lora_r = int(rank) if rank is not None else (ranks[0] if ranks else None)
    trained, total = grid.trained_parameters, grid.total_parameters
    high = grid.trained_parameters_max
    if trained is not None and high is not None and high != trained and len(ranks) > 1:
        lo, hi = ranks[0], ranks[-1]
        step = (high - trained) / (hi - lo) if hi != lo else 0.0
        at_rank = trained + round(step * ((lora_r or lo) - lo))
        total = None if total is None else total - (high - at_rank)
        trained = at_rank
    return finetuning_section(
        checkpoint=grid.checkpoint,
        # This trial's own rank, not the grid's range.
        trainable=trainable_text(model, [lora_r]) if lora_r is not None else grid.trainable,
        lora_r=lora_r,
        trained=trained,
        total=total,
        pretrained=pretrained,
    )


def run_finetuning(prepared: Any) -> dict[str, Any]:
    """The ``finetuning`` section of a ``dpsweep train`` card, from the run as prepared
    (:class:`sweeper.runs.single_run.PreparedRun`: its pinned spec, its pack's model with the
    resolved checkpoint, its loaded data)."""
    from workers.checkpoint_store import checkpoint_facts  # deferred: only with a checkpoint

    model = prepared.pack.model
    facts = None
    if model.checkpoint is not None:
        facts = checkpoint_facts(model.checkpoint)
        if model.checkpoint.name is None:
            facts["path"] = model.checkpoint.path
    trained = total = None
    try:
        # deferred: imports torch (the model is built again, on the meta device if it can be)
        from workers.param_count import parameter_counts

        data = prepared.data
        trained, total = parameter_counts(
            model,
            input_shape=tuple(data.input_shape),
            num_classes=int(data.num_classes),
            vocab_size=getattr(data, "vocab_size", None),
        )
    except Exception:  # the counts are a statement on the card; the run already trained
        pass
    lora = getattr(model, "lora", None)
    return finetuning_section(
        pretrained=_run_pretrained(prepared),
        checkpoint=facts,
        trainable=trainable_text(prepared.spec.model, [lora.r] if lora is not None else None),
        lora_r=lora.r if lora is not None else None,
        trained=trained,
        total=total,
    )


def _run_pretrained(prepared: Any) -> dict[str, Any] | None:
    """A ``dpsweep train`` run's public pre-training (None without one): the public set, the
    cached weights' digest (as the run's pack model read them) and the recipe."""
    ref = getattr(prepared.pack, "pretrain", None)
    if ref is None:
        return None
    # deferred: torch-side (the cached weights are read back)
    from workers.pretraining import pretrained
    from workers.training.prepare import with_data_vocab  # deferred: torch-side

    model = with_data_vocab(prepared.pack.model, getattr(prepared.data, "vocab_size", None))
    return {
        "dataset": ref.dataset.name,
        "digest": pretrained(model, ref).digest,
        "recipe": dict(ref.recipe),
    }


def finetuning_markdown(section: Mapping[str, Any] | None) -> list[str]:
    """The card's README lines for its ``finetuning`` section (none for cards without one)."""
    if not section:
        return []
    lines = ["## Starting weights and what was trained", ""]
    ckpt = section.get("checkpoint")
    if ckpt is None:
        lines.append("- Weights started random (no checkpoint).")
    else:
        name = ckpt.get("name") or ckpt.get("path")
        lines.append(f"- Checkpoint `{name}` ({ckpt.get('kind')}), digest `{ckpt.get('digest')}`.")
        lines.append(f"- {ckpt.get('statement')}.")
    pre = section.get("pretrained")
    if pre:
        then = "Then" if ckpt is not None else "Then they were"
        lines.append(
            f"- {then} pre-trained without noise (epsilon 0, nothing charged) on the public "
            f"dataset `{pre.get('dataset')}`; those weights' digest `{pre.get('digest')}`."
        )
    rank = f", LoRA rank {section['lora_r']}" if section.get("lora_r") is not None else ""
    trained, total = section.get("trained_parameters"), section.get("total_parameters")
    counts = f": {trained:,} of {total:,} parameters" if trained is not None and total else ""
    lines += [f"- Trained: {section.get('trainable')}{rank}{counts}.", f"- {section['note']}.", ""]
    return lines


__all__ = [
    "checkpoint_section",
    "finetuning_markdown",
    "finetuning_section",
    "run_finetuning",
    "trial_finetuning",
]
