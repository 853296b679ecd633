"""Dataset files as the workers read them, and what may be shown of them.

Every loader (the planner, an upload's check, the workers) reads a dataset through one
:class:`workers.datasets.DatasetSpec`, built here from a spec's section or a stored row, so
all of them split, scale and bound the inputs the same way.

What is shown of a file is what the planner and the model need and treats as public: the
number of examples (it sets the sample rate and bounds δ), of features and of classes. Never
rows, labels or class names: those are the private data.

The class list of a stored file is declared once, when its owner uploads or registers it
(:func:`load_declared`, stored in the row's ``config["classes"]``), and every later load of
the file (planning, workers, descriptions) encodes labels by it
(:attr:`workers.datasets.records.DatasetSpec.classes`): the class count and encoding are then
part of the registered description, never computed from the records an analyst's outputs
depend on. Rows stored before declarations have no ``classes``; their loads still count the
classes in the records, until their owner uploads or registers the file again.

**Privacy units.** A stored file's privacy unit (the column saying whose each row is, e.g.
``patient_id``: issue 54) is its owner's declaration too, stored as ``config["privacy_unit"]``
and given to every load of the file (:func:`file_spec`), whatever a spec says. The number of
units is counted once, at upload or registration (``n_units``), and shown like the number of
records: to the owner, and to analysts only once declared. How many rows a unit has is
never counted nor shown, to anyone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from dpsweep.errors import ConfigError, DatasetError
from sweeper.store import Dataset


class _FromSection:
    """The type of :data:`FROM_SECTION`."""


#: ``worker_spec(privacy_unit=FROM_SECTION)``: the unit is the spec section's own.
FROM_SECTION = _FromSection()


def worker_spec(
    d: Any,
    *,
    path: str | None,
    name: str,
    label_column: str | None,
    labels_path: str | None = None,
    stored_options: dict[str, Any] | None = None,
    classes: Sequence[str] | None = None,
    privacy_unit: str | _FromSection | None = FROM_SECTION,
) -> Any:
    """The :class:`workers.datasets.DatasetSpec` of loader ``name`` (for a stored file: its
    format) at ``path``, with the split and scaling settings of ``d`` (a spec's ``dataset``
    section, or a dict). A stored file's own options (``stored_options``: its vocabulary,
    image size...) apply unless the spec's options override them; ``classes`` is its declared
    class list (None: the records' distinct labels).

    ``privacy_unit``: the unit column of a stored file, as its owner declared it (None: none,
    each row its own unit); by default (:data:`FROM_SECTION`) ``d``'s: a local file or a
    loader named by a spec, whose unit the spec gives. A stored file never takes the spec's:
    its owner fixed it (:func:`file_spec`; :func:`sweeper.datasets.fixed_view.apply_view`
    refuses another)."""
    # deferred: workers.datasets pulls numpy and every loader
    from workers.datasets.records import DatasetSpec

    get = d.get if isinstance(d, dict) else lambda k, default=None: getattr(d, k, default)
    # The scaling settings travel with the dataset: every loader (planner, upload check,
    # workers) must bound the inputs the same way. JSON gives the bounds back as a list.
    bounds, feature_clip = get("input_bounds"), get("feature_clip")
    unit = get("privacy_unit") if isinstance(privacy_unit, _FromSection) else privacy_unit
    return DatasetSpec(
        name=name,
        path=path,
        labels_path=labels_path or get("labels_path"),
        label_column=label_column,
        test_fraction=float(get("test_fraction", 0.2)),
        split_seed=int(get("split_seed", 0)),
        options={**(stored_options or {}), **dict(get("options", {}) or {})},
        input_bounds=None if bounds is None else (float(bounds[0]), float(bounds[1])),
        feature_clip=5.0 if feature_clip is None else float(feature_clip),
        classes=None if classes is None else tuple(str(c) for c in classes),
        privacy_unit=None if unit is None else str(unit),
    )


def file_spec(row: Dataset, dataset: Any = None) -> Any:
    """The worker spec of a stored file (an upload or a registered name); split and scaling
    settings from ``dataset`` (a spec's), the file's own settings from the row, its declared
    class list and privacy unit among them (None for rows stored before declarations: see the
    module docstring)."""
    cfg = dict(row.config or {})
    assert row.storage_path is not None and row.format is not None
    return worker_spec(
        dataset if dataset is not None else {},
        path=row.storage_path,
        name=row.format,
        label_column=cfg.get("label_column"),
        labels_path=cfg.get("labels_path"),
        stored_options=dict(cfg.get("options") or {}),
        classes=cfg.get("classes"),
        privacy_unit=cfg.get("privacy_unit"),
    )


def load_file(spec: Any, shown_as: str) -> tuple[dict[str, Any], str]:
    """What may be shown of a dataset file (see the module docstring), and its identity.

    Raises:
        DatasetError: the file cannot be loaded (named ``shown_as``, not by its path).
    """
    info, identity, _ = _load(spec, shown_as)
    return info, identity


def load_declared(spec: Any, shown_as: str) -> tuple[Any, dict[str, Any], str]:
    """Load a file its owner is uploading or registering, and declare its class list.

    The list (:func:`workers.datasets.loading.class_names`) is computed from the records
    here, once, as the owner's action on the owner's file; stored in the row's
    ``config["classes"]`` it becomes part of the registered description, and every later
    load uses it (module docstring). What is shown is what those loads give
    (``num_classes`` is the list's length).

    Returns:
        ``spec`` with its declared ``classes``, what may be shown of the file
        (:func:`load_file`), and its identity.

    Raises:
        DatasetError: the file cannot be loaded (named ``shown_as``, not by its path).
    """
    info, identity, data = _load(spec, shown_as)
    declared = replace(spec, classes=tuple(data.declared_classes))
    if len(declared.classes) != info["num_classes"]:
        # Two spellings of one class ("1" and "1.0") are one declared class: later loads
        # encode (and split) by the list, so describe what they will load.
        info, identity, _ = _load(declared, shown_as)
    return declared, info, identity


def _load(spec: Any, shown_as: str) -> tuple[dict[str, Any], str, Any]:
    """:func:`load_file`, with the loaded :class:`workers.datasets.records.Dataset`."""
    # deferred: workers.datasets pulls numpy and every loader
    from workers.datasets.loading import load_dataset

    try:
        data = load_dataset(spec)
    except (DatasetError, ConfigError) as exc:
        # Say what is wrong with the file without naming where the server keeps it.
        raise DatasetError(str(exc).replace(str(spec.path), shown_as)) from None
    info = {
        "n_examples": int(data.n_train + data.x_test.shape[0]),
        "n_train": int(data.n_train),
        "input_shape": list(data.input_shape),
        "num_classes": int(data.num_classes),
        "kind": data.kind,
    }
    if data.has_units:
        # Counted once, at upload or registration (the owner's action on the owner's file):
        # shown to the owner, and to analysts only once declared (fixed_view). No unit is on
        # both sides of the split, so the two counts add up to the distinct units. How many
        # rows each unit has is never counted here: it is private, whoever asks.
        info["privacy_unit"] = str(data.privacy_unit)
        info["n_units"] = int(data.n_units_train + data.n_units_test)
    return info, data.content_sha256, data


def describe_file(spec: Any, shown_as: str) -> dict[str, Any]:
    """What may be shown of a dataset file (:func:`load_file` without the identity)."""
    return load_file(spec, shown_as)[0]


_BUILTIN_CACHE: dict[str, dict[str, Any]] = {}


def builtin_description(name: str) -> dict[str, Any]:
    """A built-in set as the API shows it (loaded once per process)."""
    if name not in _BUILTIN_CACHE:
        _BUILTIN_CACHE[name] = {
            "id": name,
            "name": name,
            "kind": "builtin",
            "format": None,
            "owner": None,
            "size_bytes": None,
            "created_at": None,
            # Each row its own unit, unless the loader has built-in units (mnist1d-people).
            "privacy_unit": "example",
            "n_units": None,
            **describe_file(worker_spec({}, path=None, name=name, label_column=None), name),
        }
        # A shared set with units shows the number its descriptor declares, not a count.
        from workers.datasets.descriptors import get_dataset_descriptor  # deferred: numpy

        declared = get_dataset_descriptor(name).units
        if declared is not None:
            _BUILTIN_CACHE[name]["n_units"] = int(declared)
    return dict(_BUILTIN_CACHE[name])
