"""Tiny models with frozen parts for the frozen-parameter tests (built from configs, no network).

Each model returns one tensor of logits (the generic path's contract); the Hugging Face ones
are wrapped (:class:`Logits`). transformers and peft are imported inside the builders, so the
tests that need them skip where they are not installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch
from torch import Tensor, nn

VOCAB, CLASSES, SEQ = 100, 3, 8


class Logits(nn.Module):
    """A Hugging Face classifier as the generic path sees models: token ids in, logits out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        out: Any = self.model(input_ids=x)
        return out.logits


def freeze_except(module: nn.Module, keep: Callable[[str], bool]) -> nn.Module:
    """Freeze every parameter whose name ``keep`` rejects (what ``model.trainable`` does)."""
    for name, p in module.named_parameters():
        p.requires_grad_(keep(name))
    return module


def bert(seed: int = 0) -> nn.Module:
    """A tiny BertForSequenceClassification (hidden 32, 2 layers, vocab 100), dropout 0."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=CLASSES,
    )
    torch.manual_seed(seed)
    return transformers.BertForSequenceClassification(cfg)


def lora_bert(adapter_seed: int = 1, *, backbone_seed: int = 0, r: int = 4) -> nn.Module:
    """The tiny BERT (one backbone) with LoRA on query/value and a trained classifier copy.

    lora_B starts at zero in peft; it is redrawn here so that lora_A's gradients are not zero
    (a zero gradient would make the comparison with torch.func vacuous).
    """
    peft = pytest.importorskip("peft")
    base = bert(backbone_seed)
    torch.manual_seed(adapter_seed)
    cfg = peft.LoraConfig(
        r=r, lora_alpha=8, target_modules=["query", "value"], lora_dropout=0.0, task_type="SEQ_CLS"
    )
    model = peft.get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    return Logits(model)


class EmbedNet(nn.Module):
    """Token ids -> logits: a trained embedding (with a padding row), frozen layers after it."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8, padding_idx=0)
        self.mix = nn.Linear(8, 8)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.mix(self.emb(x))).mean(dim=1))


class NormNet(nn.Module):
    """Token ids -> logits: frozen embedding and linears around a trained LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.norm = nn.LayerNorm(8)
        self.mix = nn.Linear(8, 8)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.mix(self.norm(self.emb(x)))).mean(dim=1))


class TiedNet(nn.Module):
    """Token ids -> logits over the vocabulary, the output layer tied to the embedding; the
    tied weight is trained, the layer between is frozen."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.mix = nn.Linear(8, 8)
        self.out = nn.Linear(8, VOCAB, bias=False)
        self.out.weight = self.emb.weight  # tied: one parameter, two uses

    def forward(self, x: Tensor) -> Tensor:
        h = self.emb(x).mean(dim=1)
        return self.out(torch.tanh(self.mix(h)) + h)


def head_mlp(seed: int = 0) -> nn.Sequential:
    """An MLP whose hidden layers are frozen: only the last Linear (the head) is trained."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
    torch.manual_seed(100 + seed)
    net.append(nn.Linear(16, CLASSES))
    return net


def frozen_state(module: nn.Module) -> dict[str, Tensor]:
    """Copies of the frozen parameters, by name."""
    return {n: p.detach().clone() for n, p in module.named_parameters() if not p.requires_grad}


def any_match(patterns: Iterable[str]) -> Callable[[str], bool]:
    """A ``keep`` for :func:`freeze_except`: the names containing any of ``patterns``."""
    pats = list(patterns)
    return lambda name: any(p in name for p in pats)
