"""A dataset-format plug-in (entry-point group ``dpsweep.datasets``): semicolon-separated
values (``.ssv``): a header row, numeric feature columns and a label column."""

from __future__ import annotations

from typing import Any

from dpsweep_testplugins import DATASET_FORMAT


def register() -> None:
    """Register the format's descriptor (registerable, suffix ``.ssv``) and its loader."""
    import numpy as np

    from workers.datasets import (
        DatasetDescriptor,
        RawData,
        register_dataset,
        register_dataset_descriptor,
    )

    register_dataset_descriptor(
        DatasetDescriptor(
            name=DATASET_FORMAT,
            input_kind="flat",
            description="semicolon-separated values (a test plug-in)",
            needs=("path", "label_column"),
            registerable=True,
            uploadable=True,
            suffixes=(".ssv",),
        )
    )

    @register_dataset(DATASET_FORMAT)
    def load(spec: Any) -> Any:
        with open(spec.path, encoding="utf-8") as f:
            lines = [line for line in f.read().splitlines() if line]
        header = lines[0].split(";")
        at = header.index(spec.label_column)
        rows = [line.split(";") for line in lines[1:]]
        x = np.array([[float(v) for i, v in enumerate(r) if i != at] for r in rows])
        y = np.array([r[at] for r in rows])
        return RawData(x=x, y=y, kind="tabular")
