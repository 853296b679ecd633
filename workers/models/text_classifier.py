"""``text_classifier``: token embedding, a pre-norm transformer encoder, masked mean pooling.

Input: token ids ``[B, T]`` (input kind ``"tokens"``, as the text datasets load them: 0 the
padding id, 1 the unknown token, which ids outside ``[0, vocab_size)`` also read as, so that no
record can crash a step). Padding is masked out of attention (as keys) and of the pooled mean.
A sequence of padding only attends to its first position (instead of to nothing, which would
give NaN) and pools to zero.

The encoder layer is the computation of ``nn.TransformerEncoderLayer(norm_first=True,
batch_first=True, activation="gelu")`` written out from ``nn.Linear`` and ``nn.LayerNorm``:
``nn.MultiheadAttention`` runs fused kernels that per-sample gradient engines (Opacus's hooks,
its ModuleValidator) refuse, while these layers are supported everywhere (Opacus hooks and
ghost norms, torch.func).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from dpsweep.errors import ConfigError
from workers.models.descriptors import TEXT_CLASSIFIER
from workers.models.registry import register_model

#: The padding token id (masked everywhere).
PAD_ID = 0
#: Where an id outside ``[0, vocab_size)`` is read (a record must not crash a step).
UNKNOWN_ID = 1


def _dropout(p: float) -> nn.Module:
    # nn.Identity rather than Dropout(0): no random call at all (vmap'd engines refuse those).
    return nn.Dropout(p) if p > 0 else nn.Identity()


class SelfAttention(nn.Module):
    """Multi-head self-attention from Linear layers; ``pad`` ``[B, T]`` marks masked keys."""

    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.drop = _dropout(dropout)

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)  # [B, H, T, T]
        scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
        attn = self.drop(torch.softmax(scores, dim=-1))
        return self.out((attn @ v).transpose(1, 2).reshape(b, t, d))


class EncoderLayer(nn.Module):
    """Pre-norm: ``x + attn(LN(x))``, then ``x + FF(LN(x))`` with a GELU feed-forward."""

    def __init__(self, d: int, heads: int, ff: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = SelfAttention(d, heads, dropout)
        self.norm2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.GELU(), _dropout(dropout), nn.Linear(ff, d))
        self.drop = _dropout(dropout)

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:
        x = x + self.drop(self.attn(self.norm1(x), pad))
        return x + self.drop(self.ff(self.norm2(x)))


class TextClassifier(nn.Module):
    """Embedding (tokens + learned positions), encoder layers, final LayerNorm, mean, head."""

    def __init__(
        self,
        num_classes: int,
        *,
        vocab_size: int,
        d_model: int,
        heads: int,
        layers: int,
        ff_mult: int,
        max_len: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        self.position = nn.Embedding(max_len, d_model)
        self.drop = _dropout(dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, heads, ff_mult * d_model, dropout) for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, ids: Tensor) -> Tensor:
        # Data loaders may hand ids over as floats; longer sequences keep their first max_len.
        ids = ids[:, : self.max_len].long()
        ids = torch.where((ids >= 0) & (ids < self.vocab_size), ids, UNKNOWN_ID)
        pad = ids == PAD_ID
        # An all-padding sequence attends to its first position (masking every key is NaN).
        first = torch.zeros_like(pad)
        first[:, 0] = True
        attn_pad = pad & ~(pad.all(dim=1, keepdim=True) & first)
        # Batch-first positions [B, T]: per-sample gradient hooks (Opacus) read dim 0 as the batch.
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids).contiguous()
        x = self.drop(self.embed(ids) + self.position(positions))
        for layer in self.layers:
            x = layer(x, attn_pad)
        x = self.norm(x)
        keep = (~pad).unsqueeze(-1).to(x.dtype)
        pooled = (x * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)
        return self.head(pooled)


@register_model(TEXT_CLASSIFIER)
def _text_classifier(
    input_shape: tuple[int, ...],
    num_classes: int,
    vocab_size: int = 32768,
    d_model: int = 128,
    heads: int = 4,
    layers: int = 2,
    ff_mult: int = 4,
    max_len: int = 512,
    dropout: float = 0.0,
) -> nn.Module:
    if int(d_model) % int(heads):
        raise ConfigError(
            f"text_classifier d_model ({d_model}) must be a multiple of heads ({heads})",
            field="model.options.heads",
        )
    return TextClassifier(
        num_classes,
        vocab_size=int(vocab_size),
        d_model=int(d_model),
        heads=int(heads),
        layers=int(layers),
        ff_mult=int(ff_mult),
        max_len=int(max_len),
        dropout=float(dropout),
    )
