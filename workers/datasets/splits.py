"""Separating evaluation records from training records (modes ``carve-out`` and ``dp``).

* ``carve-out``: :func:`_split`, a seeded, stratified shuffle; the held-out records are
  treated as public.
* ``dp``: :func:`_keyed_split`, keyed by each record's own content and the public
  ``split_seed``, so adding or removing one record moves no other record across the split:
  neighbouring datasets differ in one record on one side.

With a privacy unit (issue 54) both split units, not rows: :func:`_unit_split` (seeded) and
:func:`_keyed_unit_split` (keyed by each unit's own value); every row follows its unit.

Mode ``public`` trains on every record and evaluates on another dataset
(:func:`workers.datasets.public_eval._public_eval_records`).
"""

from __future__ import annotations

import hashlib
from importlib.metadata import version
from pathlib import Path

import numpy as np

from dpsweep.errors import DatasetError
from workers.datasets.data_cache import data_cache_dir, write_npz
from workers.datasets.identity import _canonical_records
from workers.datasets.records import DatasetSpec, RawData


def split_rows(
    spec: DatasetSpec, raw: RawData, y: np.ndarray, units: list[bytes] | None
) -> tuple[np.ndarray, np.ndarray]:
    """Training and evaluation row indices of modes ``carve-out`` and ``dp``.

    Args:
        spec: its ``evaluation``, ``test_fraction``, ``split_seed`` and (for the split
            cache's scope) ``path`` or ``name``.
        raw: the records (mode ``dp`` without a unit hashes each one).
        y: each record's class index (the carve-out is stratified without a unit).
        units: each row's canonical unit (:func:`workers.datasets.unit_values.unit_keys`),
            or None: each row its own unit. With units, no unit is on both sides.

    Raises:
        DatasetError: a side left empty, saying how to fix it.
    """
    if units is not None:
        by_unit = _keyed_unit_split if spec.evaluation == "dp" else _unit_split
        return by_unit(units, spec.test_fraction, spec.split_seed)
    if spec.evaluation == "dp":
        return _keyed_split(raw, spec.test_fraction, spec.split_seed)
    scope = str(spec.path or spec.name)
    return _split(len(y), y, spec.test_fraction, spec.split_seed, scope=scope)


def _split(
    n: int, y: np.ndarray, test_fraction: float, seed: int, *, scope: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    n_test = round(n * test_fraction)
    if n_test < 1 or n - n_test < 1:
        raise DatasetError(f"{n} examples cannot be split with test_fraction={test_fraction}")
    path = _split_cache_file(n, y, test_fraction, seed, scope)
    cached = _read_split(path, n, n_test)
    if cached is not None:
        return cached
    from sklearn.model_selection import train_test_split  # deferred: scikit-learn is heavy

    idx = np.arange(n)
    counts = np.bincount(y)
    # Stratify when every class can appear on both sides; it keeps small sets balanced.
    stratify = y if counts.min() >= 2 and n_test >= len(counts) else None
    train_idx, test_idx = train_test_split(
        idx, test_size=n_test, random_state=seed, shuffle=True, stratify=stratify
    )
    train, test = np.sort(train_idx), np.sort(test_idx)
    write_npz(path, train=train, test=test)
    return train, test


# The split is a pure function of (n, labels, test_fraction, seed) and scikit-learn's version;
# it is kept between processes under a digest of exactly those, so a fresh process (the driver
# that plans, each new worker) need not import scikit-learn (about a second) to redo it. The
# file lives only in the owner's local data cache; its name is a one-way digest. The digest
# also takes the file the records were read from (``scope``): a server's tenants share one
# cache, and a tenant whose upload of a guess found another tenant's cached split would time
# it (a hit skips the computation), a test of whether their guess equals the other's records.
_SPLIT_DIGEST_PERSON = b"dpsweep-splitkey"


def _split_cache_file(n: int, y: np.ndarray, test_fraction: float, seed: int, scope: str) -> Path:
    h = hashlib.blake2b(person=_SPLIT_DIGEST_PERSON, digest_size=20)
    labels = np.ascontiguousarray(y, dtype=np.int64)
    h.update(f"{scope}|{n}|{test_fraction!r}|{int(seed)}|{version('scikit-learn')}|".encode())
    h.update(labels.tobytes())
    return data_cache_dir() / "splits" / f"{h.hexdigest()}.npz"


def _read_split(path: Path, n: int, n_test: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The cached split, or None when missing or not a partition of ``range(n)`` of the right
    sizes (then it is recomputed)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            train, test = f["train"], f["test"]
    except (OSError, KeyError, ValueError):
        return None
    if train.shape != (n - n_test,) or test.shape != (n_test,):
        return None
    both = np.concatenate([train, test])
    if both.dtype.kind not in "iu" or not np.array_equal(np.sort(both), np.arange(n)):
        return None
    return train.astype(np.int64), test.astype(np.int64)


# The keyed split's hash: personalised, so its values are unrelated to any other use of the
# same bytes (content_sha256 uses SHA-256, unkeyed).
_KEYED_SPLIT_PERSON = b"dpsweep-evalsplt"


def _keyed_split(raw: RawData, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Mode ``dp``: each record's side from its own content and the public ``seed`` only.

    A record is an evaluation record iff ``BLAKE2b(key=seed)`` of its canonical form (the
    one :func:`content_sha256` hashes: float64 inputs and canonical label), read as a number
    in [0, 1), is below ``test_fraction``. Adding or removing a record therefore moves no
    other record across the split (neighbouring datasets differ in one record on one side),
    and equal records fall on the same side. The share of evaluation records is
    ``test_fraction`` only on average; classes are not stratified.

    Raises:
        DatasetError: either side empty, saying how to fix it.
    """
    key = str(int(seed)).encode()
    threshold = test_fraction * 2.0**64
    blake = hashlib.blake2b
    to_eval: list[bool] = []
    for inputs, label in _canonical_records(raw):
        h = blake(inputs, digest_size=8, key=key, person=_KEYED_SPLIT_PERSON)
        h.update(label)
        to_eval.append(int.from_bytes(h.digest(), "big") < threshold)
    mask = np.asarray(to_eval, dtype=bool).reshape(len(raw.x))
    test_idx, train_idx = np.flatnonzero(mask), np.flatnonzero(~mask)
    if len(test_idx) == 0 or len(train_idx) == 0:
        empty = "evaluation" if len(test_idx) == 0 else "training"
        raise DatasetError(
            f"eval mode dp splits each record by its own content: {len(mask)} records with "
            f"test_fraction={test_fraction} and split_seed={seed} leave no {empty} record; "
            "use more records, a test_fraction further from "
            f"{'0' if empty == 'evaluation' else '1'} or another dataset.split_seed"
        )
    return train_idx, test_idx


# ---------------------------------------------------------------------------------------------
# Splits by privacy unit (issue 54): with a declared unit, a unit is on one side only, with all
# its rows; a unit on both sides would let its evaluation rows (public in carve-out) say what
# its training rows are. Each unit is named by its canonical bytes
# (:func:`workers.datasets.unit_values.unit_keys`), so the split does not depend on the file's
# row order or format. Neither split reads or writes the split cache: they need no
# scikit-learn, and a cached example-level split of the same records must never stand in for a
# split by unit.

_UNIT_CARVE_PERSON = b"dpsweep-unitcarv"
_UNIT_SPLIT_PERSON = b"dpsweep-unitsplt"


def _unit_hash(unit: bytes, seed: int, person: bytes) -> int:
    """A unit's keyed 64-bit hash under the public ``seed``."""
    h = hashlib.blake2b(unit, digest_size=8, key=str(int(seed)).encode(), person=person)
    return int.from_bytes(h.digest(), "big")


def _unit_rows(keys: list[bytes], to_eval: set[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Training and evaluation row indices (ascending) when the units ``to_eval`` evaluate."""
    mask = np.fromiter((k in to_eval for k in keys), dtype=bool, count=len(keys))
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def _unit_split(
    keys: list[bytes], test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Mode ``carve-out`` with a unit: a seeded split of the units, every row with its unit.

    ``round(U * test_fraction)`` of the ``U`` distinct units evaluate: those with the
    smallest keyed hashes under ``seed`` (ties by value), so the split depends on the set of
    units and the seed only, not on the rows' order. Not stratified: a unit's rows may be of
    several classes.

    Args:
        keys: each row's unit, canonical (:func:`workers.datasets.unit_values.unit_keys`).
        test_fraction: the share of units that evaluate.
        seed: the public ``split_seed``.

    Returns:
        Training and evaluation row indices, ascending.

    Raises:
        DatasetError: either side without a unit, saying how to fix it (no count of units
            or rows: those are the private records').
    """
    distinct = sorted(set(keys))
    n_test = round(len(distinct) * test_fraction)
    if n_test < 1 or len(distinct) - n_test < 1:
        empty = "evaluation" if n_test < 1 else "training"
        raise DatasetError(
            f"the dataset's privacy units cannot be split with test_fraction={test_fraction}: "
            f"no unit would be left for {empty}; use a test_fraction further from "
            f"{'0' if empty == 'evaluation' else '1'}, records of more units, or eval mode "
            "public"
        )
    ranked = sorted(distinct, key=lambda k: (_unit_hash(k, seed, _UNIT_CARVE_PERSON), k))
    return _unit_rows(keys, set(ranked[:n_test]))


def _keyed_unit_split(
    keys: list[bytes], test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Mode ``dp`` with a unit: each unit's side from its own value and the public ``seed``.

    A unit evaluates, with all its rows, iff ``BLAKE2b(key=seed)`` of its canonical bytes,
    read as a number in [0, 1), is below ``test_fraction``. Adding or removing one unit (all
    its rows) therefore moves no other unit across the split: neighbouring datasets differ in
    one unit on one side. The share of evaluation units is ``test_fraction`` on average.

    Args:
        keys: each row's unit, canonical (:func:`workers.datasets.unit_values.unit_keys`).
        test_fraction: the probability that a unit evaluates.
        seed: the public ``split_seed``.

    Returns:
        Training and evaluation row indices, ascending.

    Raises:
        DatasetError: either side empty, saying how to fix it.
    """
    threshold = test_fraction * 2.0**64
    to_eval = {k for k in set(keys) if _unit_hash(k, seed, _UNIT_SPLIT_PERSON) < threshold}
    train_idx, test_idx = _unit_rows(keys, to_eval)
    if len(test_idx) == 0 or len(train_idx) == 0:
        empty = "evaluation" if len(test_idx) == 0 else "training"
        raise DatasetError(
            "eval mode dp splits each privacy unit by its own value: with "
            f"test_fraction={test_fraction} and split_seed={seed} no unit is left for "
            f"{empty}; use records of more units, a test_fraction further from "
            f"{'0' if empty == 'evaluation' else '1'} or another dataset.split_seed"
        )
    return train_idx, test_idx
