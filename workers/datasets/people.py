"""``mnist1d-people``: MNIST-1D's 4,000 training records grouped into synthetic people.

A built-in with a privacy unit (issue 54), for trying user-level DP without a file: the records
of ``mnist1d`` (same generation, same order, so the same identity and ledger), each belonging
to exactly one *person*. People have a skewed number of rows, 1 to 50 (a power law
``P(s) ~ 1 / s``, truncated), and a person's rows are drawn mostly from one or two classes of
its own, so that one person's rows are correlated: what makes user-level DP differ from
example-level DP.

The grouping is a deterministic function of the records' labels and a fixed public seed
(:data:`~workers.datasets.builtin_descriptors.MNIST1D_PEOPLE_SEED`). Its uniform draws are
keyed BLAKE2b digests, not a NumPy generator, so the grouping (and the number of people the
descriptor declares) cannot change with a NumPy version. The grouping is public by
construction; the usual rules still apply to what is computed from the records.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from dpsweep.errors import DatasetError
from workers.datasets.builtin import _no_options, mnist1d_parts
from workers.datasets.descriptors import MNIST1D_PEOPLE_SEED
from workers.datasets.records import DatasetSpec, RawData
from workers.datasets.registry import register_dataset

#: The unit's name: a built-in's own (a spec may repeat it or leave it out).
PERSON = "person"
#: The fewest and most rows of one person.
MIN_ROWS, MAX_ROWS = 1, 50
#: The share of a person's rows drawn from its own one or two classes (the rest: any class).
_OWN_CLASSES = 0.9
_PERSON = b"dpsweep-people54"


class _Draws:
    """Uniform draws in [0, 1) from keyed BLAKE2b digests of a counter: the same on every
    platform and library version."""

    def __init__(self, seed: int) -> None:
        self._key = str(int(seed)).encode()
        self._i = 0

    def uniform(self) -> float:
        h = hashlib.blake2b(
            self._i.to_bytes(8, "little"), digest_size=8, key=self._key, person=_PERSON
        )
        self._i += 1
        return int.from_bytes(h.digest(), "big") / 2.0**64

    def below(self, n: int) -> int:
        return min(n - 1, int(self.uniform() * n))


def person_sizes(n: int, draws: _Draws) -> list[int]:
    """People's numbers of rows, in order, summing to ``n``: each drawn from ``P(s) ~ 1 / s``
    on ``MIN_ROWS .. MAX_ROWS`` (the last one cut to what remains)."""
    s = np.arange(MIN_ROWS, MAX_ROWS + 1, dtype=np.float64)
    cdf = np.cumsum(1.0 / s)
    cdf /= cdf[-1]
    sizes: list[int] = []
    total = 0
    while total < n:
        size = MIN_ROWS + int(np.searchsorted(cdf, draws.uniform(), side="right"))
        size = min(size, MAX_ROWS, n - total)
        sizes.append(size)
        total += size
    return sizes


def group_people(y: np.ndarray, seed: int) -> np.ndarray:
    """Each record's person (int64 ids ``0 .. P - 1``, in ``y``'s order): people of
    :func:`person_sizes` rows, each row mostly of one of the person's two classes.

    Every record belongs to exactly one person. A person whose class has no record left
    takes one of the class with the most left (the lowest such class: deterministic).
    """
    classes = np.unique(y)
    draws = _Draws(seed)
    # Each class's records in a seeded order: people take them from the front.
    pools: list[list[int]] = []
    for c in classes:
        members = np.flatnonzero(y == c).tolist()
        keys = [draws.uniform() for _ in members]
        pools.append([m for _, m in sorted(zip(keys, members, strict=True))])
    units = np.full(len(y), -1, dtype=np.int64)
    for person, size in enumerate(person_sizes(len(y), draws)):
        own = (draws.below(len(classes)), draws.below(len(classes)))
        for _ in range(size):
            u = draws.uniform()
            if u < _OWN_CLASSES:
                c = own[0] if u < _OWN_CLASSES / 2 else own[1]
            else:
                c = draws.below(len(classes))
            if not pools[c]:
                c = max(range(len(pools)), key=lambda k: (len(pools[k]), -k))
            units[pools[c].pop(0)] = person
    return units


@functools.cache
def mnist1d_people_units() -> np.ndarray:
    """The person of each ``mnist1d`` training record (read-only; computed once a process)."""
    _, y, _, _ = mnist1d_parts()
    units = group_people(np.asarray(y), MNIST1D_PEOPLE_SEED)
    units.setflags(write=False)
    return units


@register_dataset("mnist1d-people")
def _mnist1d_people(spec: DatasetSpec) -> RawData:
    _no_options(spec)
    if spec.privacy_unit not in (None, PERSON):
        raise DatasetError(
            f"built-in dataset 'mnist1d-people' has its own privacy unit {PERSON!r}, not "
            f"{spec.privacy_unit!r}; set dataset.privacy_unit to {PERSON!r} or leave it out"
        )
    x, y, _, _ = mnist1d_parts()
    return RawData(
        x=x.copy(),
        y=y.copy(),
        kind="tabular",
        units=mnist1d_people_units().copy(),
        privacy_unit=PERSON,
    )


__all__ = ["MAX_ROWS", "MIN_ROWS", "PERSON", "group_people", "mnist1d_people_units"]
