"""Fixtures shared by the generic-path tests."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from torch import nn

from tests.workers.generic.nets import FeatureMixer
from workers.models.descriptors import DESCRIPTORS, ModelDescriptor
from workers.models.registry import MODELS, ModelEntry

MIXER = "test_generic_mixer"


@pytest.fixture
def mixer_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A user model (attention, residual, LayerNorm) registered for this test only."""
    desc = ModelDescriptor(MIXER, input_kind="any", description="attention over feature tokens")

    def build(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        return FeatureMixer(math.prod(input_shape), num_classes)

    monkeypatch.setitem(DESCRIPTORS, MIXER, desc)
    monkeypatch.setitem(MODELS, MIXER, ModelEntry(desc, build))  # type: ignore[arg-type]
    yield MIXER
