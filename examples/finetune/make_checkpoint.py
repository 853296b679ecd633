"""Write a small BERT-like checkpoint and a text CSV for ``examples/finetune-lora.yaml``.

Usage: ``python examples/finetune/make_checkpoint.py [DIR] [--pretrain-steps N]`` (default:
this directory, 150 steps). It
writes ``DIR/tiny-bert`` (a ``BertForSequenceClassification`` built from a config, with its own
word-level tokenizer, saved with ``save_pretrained``) and ``DIR/reviews.csv`` (600 short
two-class reviews). Nothing is downloaded. The model is pre-trained here, without noise, on
1,000 other reviews drawn with another seed (public stand-ins: none of them is in
``reviews.csv``'s sample), so the checkpoint plays the part of a public pre-trained model; the
example shows the mechanics of fine-tuning a local checkpoint under DP (digest, LoRA ranks,
cards). Point ``model.checkpoint`` at your own directory for a real model. Needs the
``finetune`` extra (transformers, peft) and ``tokenizers``.
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from pathlib import Path

GOOD = ["good", "great", "loved", "fun", "superb", "moving", "clever", "warm"]
BAD = ["bad", "awful", "hated", "dull", "boring", "flat", "silly", "cold"]
FILLER = ["the", "a", "movie", "film", "plot", "actor", "it", "was", "is", "and", "very", "not"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_checkpoint(out: Path, *, pretrain_steps: int = 150) -> Path:
    """A 4-layer BERT classifier (hidden 128) and its tokenizer, saved to ``out``."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIAL + sorted(set(GOOD + BAD + FILLER)))}
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
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=64,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    _pretrain(model, fast, steps=pretrain_steps)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


def _pretrain(model: object, tokenizer: object, *, steps: int = 150) -> None:
    """A few Adam steps on 1,000 public reviews (seed 1), without noise: public data only."""
    import torch

    rows = _reviews(1000, seed=1)
    enc = tokenizer([t for t, _ in rows], padding=True, return_tensors="pt")  # type: ignore[operator]
    labels = torch.tensor([y for _, y in rows])
    net: torch.nn.Module = model  # type: ignore[assignment]
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    order = torch.Generator().manual_seed(1)
    net.train()
    for _ in range(steps):
        idx = torch.randint(0, len(rows), (32,), generator=order)
        out = net(
            input_ids=enc["input_ids"][idx],
            attention_mask=enc["attention_mask"][idx],
            labels=labels[idx],
        )
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    net.eval()


def _reviews(rows: int, *, seed: int) -> list[tuple[str, int]]:
    """``rows`` reviews and their labels (1: positive), by the words they use."""
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        words = GOOD if i % 2 else BAD
        text = " ".join(rng.choice(FILLER) for _ in range(4))
        text += " " + " ".join(rng.choice(words) for _ in range(2))
        out.append((text, i % 2))
    return out


def write_reviews(path: Path, *, rows: int = 600, seed: int = 0) -> Path:
    """Short reviews labelled ``pos`` / ``neg`` by the words they use."""
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for text, label in _reviews(rows, seed=seed):
            w.writerow([text, "pos" if label else "neg"])
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--pretrain-steps", type=int, default=150)
    args = parser.parse_args(argv)
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    print(write_checkpoint(out / "tiny-bert", pretrain_steps=args.pretrain_steps))
    print(write_reviews(out / "reviews.csv"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
