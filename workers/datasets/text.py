"""Text from CSV: a text column and a label column, tokenized by a tokenizer that is public.

Importing this module registers the ``text_csv`` loader. Its records are int64 token ids
``[max_length]`` (kind ``tokens``): 0 pads, 1 is an unknown token, longer texts are cut.

Privacy: a vocabulary or tokenizer built from the private records would be a release of
them that no noise covers (which words occur, how often), so none is ever built here. The
tokenizer is one of two public files the operator provides, and no option builds one:

* ``vocab``: one token per line (blank lines skipped, the first of duplicates kept), ids 2,
  3, ... in file order; texts are lowercased and split into words and punctuation marks
  (:func:`simple_tokens`);
* ``tokenizer``: a pretrained ``tokenizer.json`` of the ``tokenizers`` library; its ids + 2
  (its own unknown token becomes 1), padding and truncation as here, not as in the file. Or a
  checkpoint directory (a model's ``model.checkpoint``, registered or local): its own tokenizer,
  read with ``transformers.AutoTokenizer`` from local files only (never remote code), special
  tokens added as the tokenizer adds them, ids + 2 likewise; the model maps them back
  (:mod:`workers.models.pretrained`).

Neither may be the data file itself. Messages name lines and columns, never a text.
A declared privacy unit (``DatasetSpec.privacy_unit``) is another column, read into
:attr:`RawData.units`, never a text or a label.
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpsweep.errors import ConfigError, DatasetError
from workers.checkpoint_store import cached_digest, check_code_free
from workers.datasets.descriptors import TEXT_CSV
from workers.datasets.records import DatasetSpec, RawData
from workers.datasets.registry import register_dataset
from workers.datasets.unit_values import unit_cell, unit_column

PAD_ID = 0
UNKNOWN_ID = 1
#: Ids below this are reserved (pad, unknown); a vocabulary's tokens start here.
FIRST_ID = 2
_WORDS = re.compile(r"\w+|[^\w\s]")


def simple_tokens(text: str) -> list[str]:
    """The ``vocab`` tokenizer: lowercase, then words (``\\w+``) and single punctuation marks."""
    return _WORDS.findall(text.lower())


def read_vocab(path: Path) -> dict[str, int]:
    """A public vocabulary file: token -> id (from :data:`FIRST_ID`, in file order).

    Raises:
        DatasetError: a file that is not UTF-8 text or holds no token (never quoting it).
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(
            f"{path}: not a readable UTF-8 vocabulary ({type(exc).__name__})"
        ) from None
    vocab: dict[str, int] = {}
    for line in lines:
        token = line.strip().lower()
        if token and token not in vocab:
            vocab[token] = FIRST_ID + len(vocab)
    if not vocab:
        raise DatasetError(f"{path}: the vocabulary holds no token (one token per line)")
    return vocab


def _public_file(option: str, value: str, data: Path) -> Path:
    """The public file an option names; refused when it is the data file itself."""
    path = Path(value).expanduser()
    if option == "tokenizer" and path.is_dir():
        return path  # a checkpoint directory: its own tokenizer (_checkpoint_encoder)
    if not path.is_file():
        raise DatasetError(f"{path}: file not found (dataset.options.{option})")
    if data.is_file() and path.resolve() == data.resolve():
        raise ConfigError(
            f"dataset.options.{option} is the data file itself: a vocabulary built from the "
            "private records would release them; give a public vocabulary or tokenizer",
            field=f"dataset.options.{option}",
        )
    return path


def _vocab_encoder(path: Path) -> tuple[Callable[[list[str]], list[list[int]]], int, str]:
    vocab = read_vocab(path)

    def encode(texts: list[str]) -> list[list[int]]:
        return [[vocab.get(t, UNKNOWN_ID) for t in simple_tokens(text)] for text in texts]

    return encode, FIRST_ID + len(vocab), "vocab-words"


def _tokenizer_encoder(path: Path) -> tuple[Callable[[list[str]], list[list[int]]], int, str]:
    try:
        # optional here: only a tokenizer.json needs it (the error below says what to install)
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError(
            "dataset.options.tokenizer needs the tokenizers package (pip install tokenizers)",
            field="dataset.options.tokenizer",
        ) from None
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises plain Exceptions
        raise DatasetError(
            f"{path}: not a tokenizer.json the tokenizers library reads ({type(exc).__name__})"
        ) from None
    tok.no_padding()
    tok.no_truncation()
    unk_token = getattr(tok.model, "unk_token", None)
    unk = tok.token_to_id(unk_token) if unk_token else None
    size = int(tok.get_vocab_size(with_added_tokens=True)) + FIRST_ID

    def encode(texts: list[str]) -> list[list[int]]:
        return [
            [UNKNOWN_ID if i == unk else i + FIRST_ID for i in e.ids]
            for e in tok.encode_batch(texts)
        ]

    return encode, size, "tokenizers"


def _checkpoint_encoder(path: Path) -> tuple[Callable[[list[str]], list[list[int]]], int, str]:
    """A checkpoint directory's own tokenizer (transformers, local files, no remote code)."""
    # Code-free input, like the model's weights: the same refusal of code and pickles.
    check_code_free(path, "hf")
    try:
        # optional extra (finetune): only a checkpoint's tokenizer needs transformers
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError(
            "a checkpoint's tokenizer needs the transformers package: pip install "
            "'dpsweep[finetune]'",
            field="dataset.options.tokenizer",
        ) from None
    try:
        tok = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
    except (OSError, ValueError) as exc:
        raise DatasetError(
            f"{path}: no tokenizer transformers reads locally ({type(exc).__name__})"
        ) from None
    unk = tok.unk_token_id
    size = len(tok) + FIRST_ID

    def encode(texts: list[str]) -> list[list[int]]:
        ids = tok(texts, add_special_tokens=True, truncation=False)["input_ids"]
        return [[UNKNOWN_ID if i == unk else int(i) + FIRST_ID for i in row] for row in ids]

    return encode, size, "checkpoint"


@dataclass
class _TextRows:
    """A text CSV file's data rows: texts, labels and (with a declared unit) units."""

    texts: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    units: list[str] = field(default_factory=list)


def _read_rows(spec: DatasetSpec, path: Path, text_column: str) -> tuple[_TextRows, bool]:
    """The rows of a CSV file with a header row (extra columns are ignored), and whether a
    unit column was read (``spec.privacy_unit``: never a text or a label)."""
    label_column = str(spec.label_column)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not a UTF-8 text CSV file ({exc.reason})") from None
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise DatasetError(f"{path}: empty CSV file") from None
    except csv.Error as exc:
        raise DatasetError(f"{path}: line 1: not CSV ({exc})") from None
    for column, what in ((label_column, "label_column"), (text_column, "options.text_column")):
        if column not in header:
            raise DatasetError(
                f"{path}: no column named {column!r} (dataset.{what}); columns are {header}"
            )
    li, ti = header.index(label_column), header.index(text_column)
    taken = {label_column: "label_column", text_column: "options.text_column"}
    ui = unit_column(spec, header, path, taken)
    out = _TextRows()
    lineno = 1
    try:
        for row in reader:
            lineno = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise DatasetError(
                    f"{path}: line {lineno} has {len(row)} fields, header has {len(header)}"
                )
            label = row[li].strip()
            if not label or label.lower() in ("nan", "+nan", "-nan"):
                raise DatasetError(
                    f"{path}: line {lineno}: missing label in column {label_column!r}; give "
                    "every row a label or drop the row"
                )
            if ui is not None:
                out.units.append(unit_cell(row[ui], path, lineno, header[ui]))
            out.texts.append(row[ti])
            out.labels.append(label)
    except csv.Error as exc:
        raise DatasetError(f"{path}: line {reader.line_num}: not CSV ({exc})") from None
    if not out.texts:
        raise DatasetError(f"{path}: no data rows")
    return out, ui is not None


@register_dataset("text_csv")
def _text_csv(spec: DatasetSpec) -> RawData:
    if not spec.path:
        raise ConfigError("dataset 'text_csv' needs path (the CSV file)", field="dataset.path")
    if not spec.label_column:
        raise ConfigError(
            "dataset 'text_csv' needs label_column (the name of the label column)",
            field="dataset.label_column",
        )
    opts = TEXT_CSV.validate(spec.options)
    data = Path(spec.path)
    if not data.is_file():
        raise DatasetError(f"{data}: file not found (CSV file for dataset 'text_csv')")
    vocab, tokenizer = opts["vocab"], opts["tokenizer"]
    if (vocab is None) == (tokenizer is None):
        raise ConfigError(
            "dataset 'text_csv' needs exactly one public tokenizer: dataset.options.vocab (a "
            "vocabulary file, one token per line) or dataset.options.tokenizer (a pretrained "
            "tokenizer.json); a vocabulary is never built from the records",
            field="dataset.options.vocab" if vocab is None else "dataset.options.tokenizer",
        )
    option, value = ("vocab", vocab) if vocab is not None else ("tokenizer", tokenizer)
    public = _public_file(option, str(value), data)
    make = (
        _vocab_encoder
        if option == "vocab"
        else _checkpoint_encoder
        if public.is_dir()
        else _tokenizer_encoder
    )
    encode, vocab_size, method = make(public)
    rows, has_units = _read_rows(spec, data, str(opts["text_column"]))
    texts = rows.texts
    length = int(opts["max_length"])
    x = np.full((len(texts), length), PAD_ID, dtype=np.int64)
    for i, ids in enumerate(encode(texts)):
        row = ids[:length]
        x[i, : len(row)] = row
    if x.size and int(x.max()) >= vocab_size:
        raise DatasetError(f"{public}: the tokenizer gives ids beyond its own vocabulary size")
    return RawData(
        x=x,
        y=np.asarray(rows.labels),
        kind="tokens",
        texts=texts,
        vocab_size=vocab_size,
        encoding=_encoding(method, public, length),
        units=np.asarray(rows.units) if has_units else None,
        privacy_unit=spec.privacy_unit if has_units else None,
    )


def _encoding(method: str, public: Path, length: int) -> str:
    """A public description of the tokenization: method, the file's (or checkpoint
    directory's) SHA-256 and the length."""
    if public.is_dir():
        return f"{method}:{cached_digest(public).removeprefix('sha256:')}:{length}"
    digest = hashlib.sha256(public.read_bytes()).hexdigest()
    return f"{method}:{digest}:{length}"


__all__ = ["FIRST_ID", "PAD_ID", "UNKNOWN_ID", "read_vocab", "simple_tokens"]
