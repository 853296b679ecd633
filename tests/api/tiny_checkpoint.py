"""A tiny BERT-like classifier checkpoint for tests, built from a config (no network).

``BertForSequenceClassification`` with hidden size 32 and 2 layers, saved with
``save_pretrained`` beside a ``tokenizers`` WordLevel ``tokenizer.json`` (via
``PreTrainedTokenizerFast``), and a small text CSV whose labels the words predict.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

#: The checkpoint's parameter counts that tests compare plans with.
HIDDEN = 32
LAYERS = 2
LABELS = 2
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(60)]


def tiny_bert(out: Path) -> Path:
    """Write the tiny checkpoint directory to ``out`` (created) and return it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    special = {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]"}
    PreTrainedTokenizerFast(
        tokenizer_object=tok, sep_token="[SEP]", mask_token="[MASK]", **special
    ).save_pretrained(out)
    config = BertConfig(
        vocab_size=len(WORDS),
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=LABELS,
    )
    BertForSequenceClassification(config).save_pretrained(out)
    return out


def text_csv(path: Path, n: int = 200) -> Path:
    """A text CSV (columns ``text``, ``label``) whose words say the label."""
    rng = random.Random(0)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(n):
            y = i % 2
            w.writerow([" ".join(f"w{rng.randrange(30) + 30 * y}" for _ in range(8)), y])
    return path


def lora_trained(r: int, *, modules: int = 2) -> int:
    """Trained parameters with LoRA rank ``r`` on ``modules`` linear layers per encoder layer
    (query and value: ``r * (in + out)`` each) plus the classifier head."""
    return LAYERS * modules * r * (HIDDEN + HIDDEN) + head_size()


def head_size() -> int:
    """The classifier head's parameters (weight and bias)."""
    return HIDDEN * LABELS + LABELS
