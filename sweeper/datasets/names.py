"""Dataset names: built-in sets, uploads, registered names and the formats each may have.

A sweep spec names its dataset by registry name (``digits``), by file (``csv`` with a
``path``, local use), by an upload's id (``ds_...``, through the API), or by a name an
operator registered (``dpsweep datasets register FILE --name NAME``). Uploads and registered
names are *in the catalog* (the ``datasets`` table); loader names are not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, overload

from dpsweep.errors import ConfigError

if TYPE_CHECKING:
    from workers.datasets.descriptors import DatasetDescriptor

UPLOAD_PREFIX = "ds_"


def _descriptors() -> list[DatasetDescriptor]:
    """The dataset registry's descriptors, built-ins first, plug-ins' included (imported when
    first asked: importing this module imports no numpy and no torch)."""
    # deferred: workers.datasets pulls numpy and every loader
    from workers.datasets.descriptors import dataset_descriptors

    return dataset_descriptors()


class RegistryNames(Sequence[str]):
    """The names of the registry's datasets that have a property, read when used (so that
    plug-ins count), in registration order; reads like a tuple (``in``, iteration, ``join``).
    """

    def __init__(self, picks: Callable[[DatasetDescriptor], bool], what: str) -> None:
        self._picks = picks
        self._what = what

    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in _descriptors() if self._picks(d))

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...
    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        return self.names()[index]

    def __len__(self) -> int:
        return len(self.names())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RegistryNames):
            other = other.names()
        return isinstance(other, tuple | list) and self.names() == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{self._what}: {self.names()!r}>"


#: Formats a user may upload (the descriptor's ``uploadable``): ``csv``, ``npz``, plug-ins'.
UPLOAD_FORMATS = RegistryNames(lambda d: d.uploadable, "upload formats")
#: Registry names that need no file (the descriptor's ``shared``): every user may run sweeps
#: on them.
BUILTIN = RegistryNames(lambda d: d.shared, "shared sets")
#: Formats of ``dpsweep datasets register`` (the descriptor's ``registerable``):
#: ``image_folder`` is a directory (``root/<label>/<image>``), ``text_csv`` a CSV of texts
#: (given with ``--format text_csv``), plug-ins' too.
REGISTER_FORMATS = RegistryNames(lambda d: d.registerable, "register formats")


def upload_format_of(filename: str) -> str:
    """An upload's format told from its file's name: the uploadable format that takes its
    last suffix; else that suffix (or the name) as written, which the upload then refuses."""
    for d in _descriptors():
        if d.uploadable and d.takes(filename, last_only=True):
            return d.name
    return filename.rsplit(".", 1)[-1].lower()


def upload_suffix(fmt: str) -> str:
    """The suffix an upload of a format is stored under (its descriptor's first)."""
    # deferred: workers.datasets pulls numpy and every loader
    from workers.datasets.descriptors import get_dataset_descriptor

    suffixes = get_dataset_descriptor(fmt).suffixes
    return suffixes[0] if suffixes else f".{fmt}"


def file_noun(fmt: str) -> str:
    """What messages call a file of a format: its first suffix in capitals (``CSV``)."""
    # deferred: workers.datasets pulls numpy and every loader
    from workers.datasets.descriptors import get_dataset_descriptor

    suffixes = get_dataset_descriptor(fmt).suffixes
    return suffixes[0].lstrip(".").upper() if suffixes else fmt


def article(noun: str) -> str:
    """``a`` or ``an`` before a noun in capitals (``an IDX``, ``a CSV``)."""
    return "an" if noun[:1].upper() in "AEIOU" else "a"


# Names given with `dpsweep datasets register`: no ":" (file names in specs are "csv:PATH", and
# identity keys "sha256:HEX"), so a registered name can never be mistaken for either.
_REGISTERED = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,99}$")


def is_upload(name: str) -> bool:
    """Whether a dataset name is an upload's id (``ds_...``)."""
    return name.startswith(UPLOAD_PREFIX)


def in_catalog(name: str) -> bool:
    """Whether a spec's dataset name is looked up in the catalog (an upload or a registered
    name) rather than being a loader of :mod:`workers.datasets` (``digits``, ``csv``...)."""
    # deferred: workers.datasets pulls numpy and every loader
    from workers.datasets.registry import has_loader

    return is_upload(name) or not has_loader(name)


def unknown_dataset(name: str) -> str:
    """The message for a dataset name that reads nothing (or nothing the asker may see)."""
    if is_upload(name):
        return f"no uploaded dataset {name!r}; GET /api/v1/datasets lists yours"
    # deferred: workers.datasets pulls numpy and every loader
    from workers.datasets.registry import dataset_names

    return (
        f"unknown dataset {name!r}: neither a loader ({', '.join(dataset_names())}) nor a name "
        "registered with `dpsweep datasets register` (`dpsweep datasets list` lists them)"
    )


def format_of(path: Path, fmt: str | None) -> str:
    """A registered file's format: ``fmt`` when given, else told from the file's name by the
    registerable formats' descriptors (a directory is the directory format's,
    ``image_folder``; a file's last suffix, then the other marks in its name: a ``.csv`` file
    is read as numeric ``csv``, texts need ``text_csv`` given).

    Raises:
        ConfigError: an unknown format, or a name that does not tell it.
    """
    formats = [d for d in _descriptors() if d.registerable]
    names = ", ".join(d.name for d in formats)
    if fmt is not None:
        if fmt not in {d.name for d in formats}:
            raise ConfigError(f"unknown format {fmt!r}; choose one of {names}", field="format")
        return fmt
    if path.is_dir():
        for d in formats:
            if d.directory:
                return d.name
    else:
        files = [d for d in formats if not d.directory]
        for last_only in (True, False):
            for d in files:
                if d.takes(path.name, last_only=last_only):
                    return d.name
    raise ConfigError(
        f"cannot tell the format of {path.name!r} from its name; give --format ({names})",
        field="format",
    )


def check_registered_name(name: str) -> None:
    """Refuse a name that could be mistaken for another kind of dataset name.

    Raises:
        ConfigError: naming the rule.
    """
    # deferred: workers.datasets pulls numpy and every loader
    from workers.datasets.registry import dataset_names, has_loader

    if not _REGISTERED.match(name) or is_upload(name):
        raise ConfigError(
            f"dataset name {name!r}: use 1-100 letters, digits and . _ - starting with a "
            f"letter, not starting with {UPLOAD_PREFIX!r} (upload ids)",
            field="name",
        )
    if has_loader(name):
        raise ConfigError(
            f"{name!r} is a loader of dpsweep ({', '.join(sorted(dataset_names()))}); choose "
            "another name",
            field="name",
        )
