"""Dataset names: built-in sets, uploads, registered names and the formats each may have.

A sweep spec names its dataset by registry name (``digits``), by file (``csv`` with a
``path``, local use), by an upload's id (``ds_...``, through the API), or by a name an
operator registered (``dpsweep datasets register FILE --name NAME``). Uploads and registered
names are *in the catalog* (the ``datasets`` table); loader names are not.
"""

from __future__ import annotations

import re
from pathlib import Path

from dpsweep.errors import ConfigError

UPLOAD_PREFIX = "ds_"
UPLOAD_FORMATS = ("csv", "npz")
# Registry names that need no file: every user may run sweeps on them.
BUILTIN = ("digits", "breast_cancer", "wine", "synthetic")
#: Formats of ``dpsweep datasets register``: ``image_folder`` is a directory
#: (``root/<label>/<image>``), ``text_csv`` a CSV of texts (given with ``--format text_csv``).
REGISTER_FORMATS = ("csv", "npz", "idx", "image_folder", "text_csv")
# Names given with `dpsweep datasets register`: no ":" (file names in specs are "csv:PATH", and
# identity keys "sha256:HEX"), so a registered name can never be mistaken for either.
_REGISTERED = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,99}$")


def is_upload(name: str) -> bool:
    """Whether a dataset name is an upload's id (``ds_...``)."""
    return name.startswith(UPLOAD_PREFIX)


def in_catalog(name: str) -> bool:
    """Whether a spec's dataset name is looked up in the catalog (an upload or a registered
    name) rather than being a loader of :mod:`workers.datasets` (``digits``, ``csv``...)."""
    from workers.datasets.registry import has_loader

    return is_upload(name) or not has_loader(name)


def unknown_dataset(name: str) -> str:
    """The message for a dataset name that reads nothing (or nothing the asker may see)."""
    if is_upload(name):
        return f"no uploaded dataset {name!r}; GET /api/v1/datasets lists yours"
    from workers.datasets.registry import dataset_names

    return (
        f"unknown dataset {name!r}: neither a loader ({', '.join(dataset_names())}) nor a name "
        "registered with `dpsweep datasets register` (`dpsweep datasets list` lists them)"
    )


def format_of(path: Path, fmt: str | None) -> str:
    """A registered file's format: ``fmt`` when given, else told from the file's name (a
    directory is an ``image_folder``; a ``.csv`` file is read as numeric ``csv``, texts need
    ``text_csv`` given).

    Raises:
        ConfigError: an unknown format, or a name that does not tell it.
    """
    if fmt is not None:
        if fmt not in REGISTER_FORMATS:
            raise ConfigError(
                f"unknown format {fmt!r}; choose one of {', '.join(REGISTER_FORMATS)}",
                field="format",
            )
        return fmt
    if path.is_dir():
        return "image_folder"
    suffixes = [x.lower() for x in path.suffixes]
    if suffixes[-1:] == [".csv"]:
        return "csv"
    if suffixes[-1:] == [".npz"]:
        return "npz"
    if ".idx" in suffixes or "ubyte" in path.name.lower():
        return "idx"
    raise ConfigError(
        f"cannot tell the format of {path.name!r} from its name; give --format "
        f"({', '.join(REGISTER_FORMATS)})",
        field="format",
    )


def check_registered_name(name: str) -> None:
    """Refuse a name that could be mistaken for another kind of dataset name.

    Raises:
        ConfigError: naming the rule.
    """
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
