"""Tiny checkpoints built from configs and saved locally (no network): a BERT classifier with
its own word-level tokenizer, a built-in MLP's state dict, and a small text CSV."""

from __future__ import annotations

import csv
from pathlib import Path

import torch

#: The tiny tokenizer's words (after the special tokens).
WORDS = [
    "the",
    "a",
    "good",
    "bad",
    "movie",
    "film",
    "great",
    "awful",
    "plot",
    "actor",
    "loved",
    "hated",
    "it",
    "was",
    "is",
    "and",
    "not",
    "very",
    "fun",
    "dull",
    "boring",
    "superb",
]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_bert(out: Path, *, num_labels: int = 3, seed: int = 0) -> Path:
    """A 2-layer BertForSequenceClassification (hidden 32) and its tokenizer, in ``out``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=num_labels,
    )
    BertForSequenceClassification(config).save_pretrained(out)
    fast.save_pretrained(out)
    return out


def text_csv(path: Path, *, rows: int = 120, seed: int = 0) -> Path:
    """A two-class sentiment CSV (``text``, ``label``) in the tiny tokenizer's words."""
    g = torch.Generator().manual_seed(seed)
    good = ["good", "great", "loved", "fun", "superb"]
    bad = ["bad", "awful", "hated", "dull", "boring"]
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(rows):
            words = good if i % 2 else bad
            pick = [words[int(j)] for j in torch.randint(0, 5, (3,), generator=g)]
            w.writerow(
                [f"the movie was {' '.join(pick)} and very {pick[0]}", "pos" if i % 2 else "neg"]
            )
    return path


def tiny_vit(out: Path, *, mean: float = 0.5, std: float = 0.25, seed: int = 0) -> Path:
    """A 1-layer ViTForImageClassification on 8x8 RGB images, with a processor config (size
    8, the given mean and std), in ``out``."""
    import json

    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    config = ViTConfig(
        image_size=8,
        patch_size=4,
        num_channels=3,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    config.num_labels = 5
    ViTForImageClassification(config).save_pretrained(out)
    processor = {
        "do_resize": True,
        "size": {"height": 8, "width": 8},
        "do_normalize": True,
        "image_mean": [mean] * 3,
        "image_std": [std] * 3,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(processor))
    return out
