"""User modules the fast packed path does not cover: embeddings, attention, residuals, LayerNorm."""

from __future__ import annotations

import torch
from torch import nn

VOCAB, TOKENS, CLASSES = 20, 6, 3


class TinyTransformer(nn.Module):
    """Token ids ``[B, T]`` -> logits: embedding, self-attention with a residual, LayerNorm.

    Inside, activations are sequence-first (``[T, B, d]``): Opacus's hooks, which the tests
    compare with, handle attention only in that layout (its batch-first DPMultiheadAttention
    computes something else than ``nn.MultiheadAttention``).
    """

    def __init__(self, vocab: int = VOCAB, d: int = 8, heads: int = 2, classes: int = CLASSES):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.attn = nn.MultiheadAttention(d, heads)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x.t())
        a, _ = self.attn(h, h, h, need_weights=False)
        h = self.norm(h + a)  # the residual connection
        return self.head(h).mean(dim=0)


class FeatureMixer(nn.Module):
    """Float features ``[B, F]`` read as tokens, attention with a residual, LayerNorm."""

    def __init__(self, features: int, classes: int, tokens: int = 8, d: int = 8):
        super().__init__()
        self.tokens = tokens
        self.proj = nn.Linear(features // tokens, d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x.reshape(x.shape[0], self.tokens, -1))
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.head(self.norm(h + a).mean(dim=1))


def token_problem(n: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(VOCAB, (n, TOKENS), generator=gen)
    y = torch.randint(CLASSES, (n,), generator=gen)
    return x, y


def transformers(k: int, seed: int = 0) -> list[nn.Module]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return [TinyTransformer() for _ in range(k)]


class TiedLM(nn.Module):
    """Token ids -> next-token logits with the output layer tied to the embedding."""

    def __init__(self, vocab: int = VOCAB, d: int = 8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.Linear(d, d)
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.emb.weight  # tied: one parameter, two uses

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x).mean(dim=1)
        return self.out(torch.tanh(self.mix(h)) + h)


class ResidualConv(nn.Module):
    """Images ``[B, 1, 8, 8]`` -> logits: convolutions with GroupNorm and a skip connection."""

    def __init__(self, classes: int = CLASSES):
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.block = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ELU())
        self.head = nn.Linear(4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = h + self.block(h)
        return self.head(h.mean(dim=(2, 3)))
