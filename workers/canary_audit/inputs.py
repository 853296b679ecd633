"""Input canaries of a black-box audit: random inputs with random labels, each appended to the
training split with probability ½ and scored by its loss under each trial's final model.

At the row level each canary is one record. On data with a privacy unit (issue 54) each is a
whole unit of ``rows`` records (their inputs and labels drawn independently), appended as a
unit with a new id after the data's or left out as a unit, and scored by the mean loss of its
rows: the audit then bounds the epsilon per unit that the plan claims.

The inputs, labels and inclusion bits come from the OS CSPRNG, afresh for every audit.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpsweep.errors import ConfigError
from workers.checkpoints import build_trained
from workers.datasets.records import Dataset
from workers.training.specs import TrialResult


@dataclass(frozen=True)
class InputCanaries:
    """The data with its canaries, and what scores them.

    Attributes:
        data: the training data with the included canaries appended (shuffled in).
        included: ``[m]`` the inclusion bits (secret until scored).
        x: ``[m * rows, ...]`` every canary's inputs, canary j's rows ``j*rows .. j*rows+rows-1``.
        y: ``[m * rows]`` their labels.
        rows: rows per canary (1 at the row level).
    """

    data: Dataset
    included: np.ndarray
    x: np.ndarray
    y: np.ndarray
    rows: int

    def __repr__(self) -> str:
        return f"InputCanaries(rows={self.rows}, <secret>)"


def with_input_canaries(data: Dataset, m: int, *, rows: int = 1) -> InputCanaries:
    """The data with each of m input canaries (``rows`` records each: a unit when the data has
    a privacy unit) appended with probability ½.

    Raises:
        ConfigError: a dataset of tokens or without classes (field ``setting``).
    """
    if data.kind == "tokens" or data.num_classes < 2:
        raise ConfigError(
            "black-box canaries are random inputs with random labels: they need a classifier "
            "on numeric inputs",
            field="setting",
        )
    rng = np.random.default_rng(secrets.randbits(128))
    lo, hi = (data.input_scaling or {}).get("clip") or (-1.0, 1.0)
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        lo, hi = -1.0, 1.0
    shape = (m * rows, *data.x_train.shape[1:])
    x_can = rng.uniform(lo, hi, size=shape).astype(data.x_train.dtype)
    y_can = rng.integers(0, data.num_classes, size=m * rows).astype(data.y_train.dtype)
    included = rng.random(m) < 0.5
    in_rows = np.repeat(included, rows)
    x_train = np.concatenate([data.x_train, x_can[in_rows]])
    y_train = np.concatenate([data.y_train, y_can[in_rows]])
    # Shuffle so that the canaries' positions say nothing (sampling ignores order anyway).
    perm = rng.permutation(len(x_train))
    update: dict[str, Any] = {"x_train": x_train[perm], "y_train": y_train[perm]}
    if data.has_units:
        update.update(_unit_update(data, included, rows, perm, m))
    elif data.declared_size is not None:
        # q comes from the declared size (the records' own count is private): add the
        # canaries' expected number, so that q reveals neither the count nor the bits.
        update["declared_size"] = data.declared_size + m // 2
    return InputCanaries(
        data=dataclasses.replace(data, **update), included=included, x=x_can, y=y_can, rows=rows
    )


def _unit_update(
    data: Dataset, included: np.ndarray, rows: int, perm: np.ndarray, m: int
) -> dict[str, Any]:
    """The training units with each included canary a new whole unit (ids after the data's,
    dense), permuted as the rows are; the declared units with the canaries' expected number."""
    if data.units_train is None:
        raise ConfigError(
            "the dataset declares a privacy unit but its loader gave no unit per training row",
            field="dataset.privacy_unit",
        )
    n_in = int(included.sum())
    new = data.n_units_train + np.repeat(np.arange(n_in, dtype=np.int64), rows)
    units = np.concatenate([data.units_train.astype(np.int64), new])[perm]
    update: dict[str, Any] = {"units_train": units}
    if data.declared_units is not None:
        # q counts the declared units: add the canary units' expected number (q then reveals
        # neither the count nor the bits), as the row level adds to the declared size.
        update["declared_units"] = data.declared_units + m // 2
    return update


def canary_losses(result: TrialResult, canaries: InputCanaries) -> np.ndarray:
    """``[m]`` each canary's cross-entropy under the trial's final model (a unit's: the mean
    over its rows)."""
    if result.weights is None:
        raise ConfigError("the audited trial diverged: lower the learning rate", field="lr")
    # The canaries are scaled inputs (drawn inside the clip range): the bare network.
    module = build_trained(result.model_info, result.weights, raw_inputs=False)
    with torch.no_grad():
        out = module(torch.from_numpy(canaries.x))
        y = torch.from_numpy(canaries.y).long()
        loss = torch.nn.functional.cross_entropy(out, y, reduction="none")
    return loss.numpy().reshape(-1, canaries.rows).mean(axis=1)


__all__ = ["InputCanaries", "canary_losses", "with_input_canaries"]
