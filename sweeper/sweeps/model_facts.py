"""What a grid's model starts from and what it trains, as its plan states it.

Each grid's plan carries the checkpoint (name, kind, digest and its registration's
declaration), ``trainable`` in words, and the number of parameters DP-SGD trains of the total,
counted on the model as a trial builds it (:func:`workers.param_count.parameter_counts`). A
LoRA grid whose ``lora_r`` axis gives several ranks states the range: the fewest and the most
trained parameters (at its smallest and largest rank), the total at the largest. A built-in
packed model from random weights that trains every parameter is not built for this (planning it
imports no torch): its counts are null. Public facts of the spec and the data's shape: nothing
here reads a record.
"""

from __future__ import annotations

from typing import Any

from dpsweep.spec import ArmConfig, SweepSpec
from sweeper.sweeps.checkpoints import (
    arm_ranks,
    checkpoint_plan_facts,
    configured_checkpoints_dir,
    trainable_text,
)
from workers.models import get_model_descriptor, model_spec


class ModelFacts:
    """The model's plan fields per arm, each model built once per rank.

    Args:
        spec: The sweep spec (its checkpoint already resolved by the model check).
        data: The loaded dataset (its input shape, classes, vocabulary).
        checkpoints_dir: The registered checkpoints (default: ``DPSWEEP_CHECKPOINTS_DIR``).
        allow_paths: ``model.checkpoint`` may be a path (the local command line only).
    """

    def __init__(
        self,
        spec: SweepSpec,
        data: Any,
        *,
        checkpoints_dir: str | None = None,
        allow_paths: bool = False,
    ) -> None:
        self._spec = spec
        self._data = data
        self._dir = configured_checkpoints_dir(checkpoints_dir)
        self._allow = allow_paths
        self._counts: dict[int | None, tuple[int, int] | None] = {}
        # Counted where the model check builds the model anyway (a checkpoint, frozen parts,
        # a model not declared packed): a built-in packed model is planned without torch.
        model = spec.model
        self._built = (
            model.checkpoint is not None
            or model.trainable != "all"
            or get_model_descriptor(model.name).engine_path != "packed"
        )
        self._checkpoint = checkpoint_plan_facts(
            spec.model, checkpoints_dir=self._dir, allow_paths=allow_paths
        )

    def of(self, arm: ArmConfig) -> dict[str, Any]:
        """The :class:`~dpsweep.plan.GridPlan` fields of ``arm``'s grids (``checkpoint``,
        ``pretrained_on``, ``trainable``, ``trained_parameters``, ``trained_parameters_max``,
        ``total_parameters``)."""
        ranks = arm_ranks(self._spec.model, arm.grid, arm.params)
        low = self._count(ranks[0] if ranks else None)
        high = self._count(ranks[-1] if ranks else None)
        return {
            "checkpoint": dict(self._checkpoint) if self._checkpoint is not None else None,
            "pretrained_on": self._spec.model.pretrain_on,
            "trainable": trainable_text(self._spec.model, ranks or None),
            "trained_parameters": low[0] if low is not None else None,
            "trained_parameters_max": high[0] if high is not None else None,
            "total_parameters": high[1] if high is not None else None,
        }

    def _count(self, rank: int | None) -> tuple[int, int] | None:
        """``(trained, total)`` at LoRA rank ``rank`` (None: the model section's), or None: a
        built-in packed model from random weights, every parameter trained (not built for
        the plan), or a model that cannot be built outside a trial (the model check passed
        it; the plan then says the parameters were not counted)."""
        if not self._built:
            return None  # a plain packed model: counting would import torch for the plan alone
        if rank not in self._counts:
            # deferred: imports torch (the model is built, on the meta device where it can be)
            from workers.param_count import parameter_counts

            model = model_spec(
                self._spec.model, checkpoints_dir=self._dir, allow_paths=self._allow, lora_r=rank
            )
            try:
                self._counts[rank] = parameter_counts(
                    model,
                    input_shape=tuple(self._data.input_shape),
                    num_classes=int(self._data.num_classes),
                    vocab_size=getattr(self._data, "vocab_size", None),
                )
            except Exception:  # the count is a statement; the model check already decided
                self._counts[rank] = None
        return self._counts[rank]


__all__ = ["ModelFacts"]
