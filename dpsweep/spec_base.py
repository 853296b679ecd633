"""The base of every section of the sweep spec (:mod:`dpsweep.spec`): unknown keys are refused."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictSection(BaseModel):
    """A spec section: a pydantic model that refuses any key it does not declare."""

    model_config = ConfigDict(extra="forbid")


__all__ = ["StrictSection"]
