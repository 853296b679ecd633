"""An image folder: ``root/<label>/<image>``, decoded with Pillow into uint8 ``[N, C, H, W]``.

Importing this module registers the ``image_folder`` loader. The labels are the sorted names
of the class folders: the owner declares them by the layout, so they are as public as a CSV
header. Every image has one size (option ``size``, default the first image's); an image of
another size is refused, naming the file and both sizes (never a pixel value), unless option
``resize`` resamples it. Option ``mode`` chooses grey (1 channel) or RGB (3 channels);
``auto`` is grey when every image is and RGB when every image is in colour, and refuses a
mix (naming a file): one record must not silently change the input shape, which is public.

The defaults of ``size`` and ``mode`` are read from the records (the first image's size,
whether every image is grey), and the input shape they give is shown and shapes the model.
So they are defaults for local use by path only: a registered folder always carries both,
resolved once at registration (:func:`registered_options`, the owner's action on the owner's
file) and stored with its options, so no later load derives them from a record.
8-bit pixels are scaled by the format's fixed range
[0, 255] (:mod:`workers.datasets.scaling`), never by statistics of the records, and the
identity (:func:`workers.datasets.identity.content_sha256`) covers the decoded records
whatever the files' names or order.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dpsweep.errors import ConfigError, DatasetError
from workers.datasets.descriptors import IMAGE_FOLDER
from workers.datasets.records import DatasetSpec, RawData
from workers.datasets.registry import register_dataset

#: File names read as images (case-insensitive); hidden files (``.DS_Store``) are skipped.
IMAGE_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg")
# Pillow modes that are grey; 16-bit and float modes are refused (converting them to 8 bits
# would clip their values silently).
_GREY_MODES = frozenset({"1", "L", "LA", "La"})
_WIDE_MODES = frozenset({"I", "F"})


def image_files(root: Path) -> list[tuple[str, Path]]:
    """``(label, file)`` of every image under ``root``, in sorted order.

    Raises:
        DatasetError: fewer than two class folders, an empty class folder, a nested folder or
            a file that is not an image (each named).
    """
    if not root.is_dir():
        raise DatasetError(f"{root}: not a folder (an image folder is root/<label>/<image>)")
    classes = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if len(classes) < 2:
        raise DatasetError(
            f"{root}: an image folder needs one sub-folder per class (root/<label>/<image>), "
            f"at least two; found {len(classes)}"
        )
    files: list[tuple[str, Path]] = []
    for folder in classes:
        found = 0
        for f in sorted(folder.iterdir()):
            if f.name.startswith("."):
                continue
            if f.is_dir():
                raise DatasetError(
                    f"{f}: a folder inside class folder {folder.name!r}; put the images "
                    "directly in root/<label>/"
                )
            if f.suffix.lower() not in IMAGE_SUFFIXES:
                raise DatasetError(
                    f"{f}: not an image file ({', '.join(IMAGE_SUFFIXES)}); move it out of "
                    "the image folder"
                )
            files.append((folder.name, f))
            found += 1
        if not found:
            raise DatasetError(f"{folder}: class folder {folder.name!r} holds no image")
    return files


def registered_options(root: str | Path, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options an image folder is registered with: ``options`` as given, plus the
    defaults the loader would otherwise derive from the records, resolved once.

    * ``size`` (not given, and ``resize`` is ``none``): the first image's ``[H, W]``, the
      size the loader picks without it. With ``resize`` the owner must give it (the loader
      refuses without).
    * ``mode`` (``auto`` or not given): ``grayscale`` when every image is grey, ``rgb`` when
      every image is in colour, as the loader would choose; left ``auto`` for a mix, which the
      loader refuses (naming a file).

    Only headers are read. Every later load of the registered folder then reads its size and
    channels from the registered description, never from a record (module docstring).

    Raises:
        ConfigError: an invalid option.
        DatasetError: not an image folder, or an unreadable image (named).
    """
    opts = IMAGE_FOLDER.validate(dict(options))
    out = dict(options)
    need_size = opts["size"] is None and str(opts["resize"]) == "none"
    need_mode = str(opts["mode"]) == "auto"
    if not (need_size or need_mode):
        return out
    grey: set[bool] = set()
    for i, (_, f) in enumerate(image_files(Path(root))):
        with _open(f) as im:
            mode, (w, h) = im.mode, im.size
        if i == 0 and need_size:
            out["size"] = [int(h), int(w)]
        if not need_mode:
            break
        grey.add(mode in _GREY_MODES)
        if len(grey) == 2:
            break
    if need_mode and len(grey) == 1:
        out["mode"] = "grayscale" if True in grey else "rgb"
    return out


def _open(path: Path) -> Any:
    """The image at ``path``, opened lazily (its mode and size are read, not its pixels)."""
    from PIL import Image  # deferred: only image folders need Pillow (not a declared dependency)

    try:
        return Image.open(path)
    except Exception as exc:  # Pillow raises several unrelated types on bad files
        raise DatasetError(f"{path}: not a readable image ({type(exc).__name__})") from None


@register_dataset("image_folder")
def _image_folder(spec: DatasetSpec) -> RawData:
    if not spec.path:
        raise ConfigError(
            "dataset 'image_folder' needs path (the folder root/<label>/<image>)",
            field="dataset.path",
        )
    opts = IMAGE_FOLDER.validate(spec.options)
    files = image_files(Path(spec.path))
    resize = str(opts["resize"])
    if resize != "none" and opts["size"] is None:
        raise ConfigError(
            f"resize {resize} needs the size to resize to (dataset.options.size: [H, W])",
            field="dataset.options.size",
        )
    # First pass, headers only: every image's mode and size, before any pixel is decoded.
    kinds: dict[bool, Path] = {}  # grey or not -> the first such file
    target: tuple[int, int] | None = None if opts["size"] is None else tuple(opts["size"])
    first: Path | None = None
    for _, f in files:
        with _open(f) as im:
            mode, (w, h) = im.mode, im.size
        if mode in _WIDE_MODES or mode.startswith("I;"):
            raise DatasetError(
                f"{f}: 16-bit or floating-point pixels (mode {mode}); store the images with "
                "8 bits per channel, or as a float NPZ with dataset.input_bounds"
            )
        kinds.setdefault(mode in _GREY_MODES, f)
        if resize != "none":
            continue
        if target is None:
            target, first = (h, w), f
        elif (h, w) != target:
            where = f"the first image {first.name}'s" if first is not None else "the declared"
            raise DatasetError(
                f"{f}: {h}x{w} pixels (HxW), not {where} size {target[0]}x{target[1]}; every "
                "image must have one size (or set dataset.options.size and resize)"
            )
    assert target is not None
    mode_name = str(opts["mode"])
    if mode_name == "auto" and len(kinds) == 2:
        raise DatasetError(
            f"{spec.path}: grey images (e.g. {kinds[True]}) and colour images (e.g. "
            f"{kinds[False]}) are mixed; set dataset.options.mode to grayscale or rgb"
        )
    pil_mode = "L" if mode_name == "grayscale" or (mode_name == "auto" and True in kinds) else "RGB"
    channels = 1 if pil_mode == "L" else 3
    x = np.empty((len(files), channels, target[0], target[1]), dtype=np.uint8)
    for i, (_, f) in enumerate(files):
        x[i] = (
            _decode(f, pil_mode, target, resize)
            .reshape(target[0], target[1], channels)
            .transpose(2, 0, 1)
        )
    return RawData(x=x, y=np.asarray([label for label, _ in files]), kind="image", pixel_max=255.0)


def _decode(path: Path, pil_mode: str, size: tuple[int, int], resize: str) -> np.ndarray:
    """One image's pixels, converted to ``pil_mode`` and (with ``resize``) resampled."""
    from PIL import Image  # deferred: only image folders need Pillow (not a declared dependency)

    try:
        with _open(path) as im:
            out = im.convert(pil_mode)
            if resize != "none" and out.size != (size[1], size[0]):
                method = (
                    Image.Resampling.BILINEAR if resize == "bilinear" else Image.Resampling.NEAREST
                )
                out = out.resize((size[1], size[0]), method)
            return np.asarray(out, dtype=np.uint8)
    except DatasetError:
        raise
    except Exception as exc:  # a truncated or corrupt file fails when decoded
        raise DatasetError(f"{path}: not a readable image ({type(exc).__name__})") from None
