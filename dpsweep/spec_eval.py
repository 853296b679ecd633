"""The spec's ``eval`` section: how the evaluation records are protected (what epsilon covers).

Its three modes (carve-out, public, dp) and, for dp, the noise of each noisy count or the share
of each grid's epsilon the evaluations may cost. Re-exported by :mod:`dpsweep.spec`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from dpsweep.spec_base import StrictSection

EVAL_MODES = ("carve-out", "public", "dp")
# DP evaluation: the share of each grid's epsilon its evaluations may cost on their own when
# eval.noise_multiplier is left out. Composition is sub-additive, so half the budget for the
# evaluations raises the training sigma by only ~18 % on the demo, while each noisy accuracy
# gets ~2.2x less noise than at 0.1: the picked models are better and the released best is
# closer to the truth (bench/eval_modes.py: true accuracy 0.90 vs 0.86 of the carve-out's,
# released best over-stated by 0.05 vs 0.18).
DEFAULT_EVAL_EPSILON_SHARE = 0.5


class EvalConfig(StrictSection):
    """How the evaluation records are protected: what epsilon covers.

    Evaluation records are never trained on. Three modes:

    * ``carve-out`` (default): ``dataset.test_fraction`` of the private dataset is held out and
      declared unprotected: metrics and the choice of the best checkpoint are released from it
      without DP; epsilon covers the training records only.
    * ``public``: ``dataset`` names a separately registered dataset that its owner declared
      public (``dpsweep datasets register FILE --name NAME --public``); every record of the
      private dataset is trained on, and epsilon covers all of them.
    * ``dp``: a carve-out (split by each record's own content, so adding a record moves no
      other) whose metrics are noisy counts: accuracy and the checkpoint choice only, charged
      in the plan and the ledger; epsilon covers every record, training and evaluation.
    """

    mode: Literal["carve-out", "public", "dp"] = Field(
        default="carve-out",
        description="carve-out (unprotected held-out split, the default), public (a dataset "
        "declared public by its owner) or dp (noisy accuracy, charged to the budget)",
    )
    dataset: str | None = Field(
        default=None,
        description="public: the registered name of the evaluation dataset, declared public",
    )
    noise_multiplier: float | None = Field(
        default=None,
        gt=0,
        description="dp: the Gaussian noise multiplier of each noisy count of correct "
        "predictions (sensitivity 1). Left out, each grid gets the smallest one whose releases "
        "alone cost at most epsilon_share of its budget",
    )
    epsilon_share: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description=f"dp: the share of each grid's epsilon the evaluations may cost on their "
        f"own when noise_multiplier is left out (default {DEFAULT_EVAL_EPSILON_SHARE})",
    )

    @model_validator(mode="before")
    @classmethod
    def _infer_mode(cls, data: Any) -> Any:
        # `eval: {dataset: NAME}` alone means a public evaluation dataset.
        if isinstance(data, dict) and data.get("dataset") is not None and "mode" not in data:
            return {**data, "mode": "public"}
        return data

    @model_validator(mode="after")
    def _fields_fit_mode(self) -> EvalConfig:
        if self.mode == "public" and not self.dataset:
            raise ValueError(
                "eval mode public needs dataset: the registered name of a dataset its owner "
                "declared public (dpsweep datasets register FILE --name NAME --public)"
            )
        if self.mode != "public" and self.dataset is not None:
            raise ValueError(f"eval.dataset applies to mode public only, not {self.mode}")
        if self.mode != "dp" and (self.noise_multiplier is not None or self.epsilon_share):
            raise ValueError(
                f"eval.noise_multiplier and eval.epsilon_share apply to mode dp only, not "
                f"{self.mode}"
            )
        if self.noise_multiplier is not None and self.epsilon_share is not None:
            raise ValueError(
                "give eval.noise_multiplier or eval.epsilon_share, not both: the share picks "
                "the noise multiplier"
            )
        if self.noise_multiplier is not None and not math.isfinite(self.noise_multiplier):
            raise ValueError("eval.noise_multiplier must be a finite number > 0")
        return self

    @property
    def share(self) -> float:
        """dp: the epsilon share used to pick the noise multiplier."""
        return self.epsilon_share or DEFAULT_EVAL_EPSILON_SHARE


__all__ = ["DEFAULT_EVAL_EPSILON_SHARE", "EVAL_MODES", "EvalConfig"]
