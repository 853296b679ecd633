"""Content identity: the hash of a dataset's records that keys its privacy ledger.

The identity is the same whatever the file's name, path, format or row order
(:func:`content_sha256`); the canonical form of each record it hashes is also what the keyed
evaluation split of mode ``dp`` (:func:`workers.datasets.splits._keyed_split`) hashes.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator

import numpy as np

from workers.datasets.records import _CHUNK_VALUES, RawData

# Names the canonical form below; a new form gets a new tag, so identities of two forms can
# never be mistaken for each other (and a ledger keyed by an old one is not silently reused).
_IDENTITY_TAG = b"dpsweep-dataset-content-v1\0"


def content_sha256(raw: RawData) -> str:
    """The identity of a dataset's records: a SHA-256 over all of them, as lowercase hex.

    Two files hold the same records when they give the same identity, whatever their name,
    path, format (CSV, NPZ, IDX) or row order. The privacy ledger is keyed by it: ε spent on
    records is spent whatever name they were registered under, so the same records uploaded
    again or registered under another name must find the same ledger.

    Canonical form of a record: its inputs as little-endian float64 (``-0.0`` as ``0.0``; a
    uint8 pixel and the float 3.0 agree), followed by its label canonicalised so that ``1``,
    ``1.0`` and ``"1"`` agree (:func:`_canonical_labels`). Each record is hashed on its own;
    the digests are sorted (a multiset: duplicates count) and hashed together with the
    record shape (as trained: images with their channel axis) and the number of records.
    Call it after the finite check and before the split and the scaling (which depend on the
    spec, not on the records).

    Text records (kind ``tokens``, :attr:`RawData.texts`) are hashed by their text as read
    (UTF-8, length-prefixed), not by their token ids: the tokenizer is a public choice, and the
    same records tokenized another way must find the same ledger. Their shape is ``"text"``.

    The result holds no record's value, but it is a deterministic function of every record:
    see :class:`Dataset` on who may see it.

    Args:
        raw: What a loader returned.

    Returns:
        64 hex digits.
    """
    x = raw.x
    n = len(x)
    shape = tuple(int(s) for s in x.shape[1:])
    if raw.kind == "image" and x.ndim == 3:
        shape = (1, *shape)  # load_dataset adds this channel axis: [H, W] and [1, H, W] agree
    shape_text = "text" if raw.texts is not None else repr(shape)
    sha = hashlib.sha256
    digests: list[bytes] = []
    for inputs, label in _canonical_records(raw):
        h = sha(inputs)
        # Every row has the same length, so inputs || label is unambiguous.
        h.update(label)
        digests.append(h.digest())
    digests.sort()
    total = sha(_IDENTITY_TAG)
    total.update(shape_text.encode() + b"\0" + n.to_bytes(8, "little"))
    total.update(b"".join(digests))
    return total.hexdigest()


def _canonical_records(raw: RawData) -> Iterator[tuple[memoryview, bytes]]:
    """Each record in its canonical form (see :func:`content_sha256`), in file order: its
    inputs as little-endian float64 bytes (``-0.0`` as ``0.0``) and its canonical label.

    Converted in chunks of about ``_CHUNK_VALUES`` values; the caller's array is not touched.
    Text records (:attr:`RawData.texts`): their UTF-8 text after its length (8 bytes), so that
    text || label is unambiguous.
    """
    x = raw.x
    n = len(x)
    labels = _canonical_labels(raw.y)
    if raw.texts is not None:
        for text, label in zip(raw.texts, labels, strict=True):
            data = text.encode("utf-8", "surrogatepass")
            yield memoryview(len(data).to_bytes(8, "little") + data), label
        return
    flat = x.reshape(n, -1)
    width = flat.shape[1] if flat.ndim == 2 else 0
    row_bytes = 8 * width
    step = max(1, _CHUNK_VALUES // max(1, width))
    for start in range(0, n, step):
        # astype always copies: the canonicalisation below must not touch the caller's array.
        chunk = flat[start : start + step].astype("<f8")
        chunk += 0.0  # -0.0 + 0.0 == +0.0: one byte form per number
        buf = memoryview(chunk.reshape(-1).view(np.uint8).tobytes())
        for j in range(len(chunk)):
            yield buf[j * row_bytes : (j + 1) * row_bytes], labels[start + j]


def _canonical_labels(y: np.ndarray) -> list[bytes]:
    """Each label as bytes that agree across formats: numbers as the shortest form of their
    value (``1``, ``1.0``, ``"1"``, ``" 1.0 "`` all give ``b"1"``; ``0.5`` gives ``b"0.5"``),
    other text stripped. A text label is never the canonical form of a number (that would
    parse), so a class named ``"1"`` cannot collide with a class named ``"one"``."""
    if y.dtype.kind in "biu":
        return [str(int(v)).encode() for v in y.tolist()]
    if y.dtype.kind == "f":
        return [_canonical_number(float(v)) for v in y.tolist()]
    out: list[bytes] = []
    for v in y.tolist():
        text = (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)).strip()
        try:
            number = float(text)
        except ValueError:
            out.append(b"s:" + text.encode())
            continue
        out.append(_canonical_number(number) if math.isfinite(number) else b"s:" + text.encode())
    return out


def _canonical_number(v: float) -> bytes:
    if v == 0.0:
        return b"0"  # also -0.0
    if v.is_integer():
        return str(int(v)).encode()
    return repr(v).encode()
