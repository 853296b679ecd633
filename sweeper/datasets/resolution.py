"""Resolving a spec's dataset: the worker spec of its training and its evaluation records.

Uploads (``ds_...``) and registered names are looked up in the catalog (their stored file,
format and label column); loader names (``digits``, ``csv`` with a path) are passed through.

**Public datasets.** The owner of a registered file may declare its records public
(``dpsweep datasets register FILE --name NAME --public``, stored as ``public`` in the row's
``config``): such a name may then be a spec's public evaluation dataset (``eval: {mode:
public, dataset: NAME}``, :func:`resolve`), or the dataset an arm tunes on before its private
grid (``tune_on: NAME``, :func:`resolve`'s ``tune_on``), whose records no epsilon covers.
Registering a name again sets the flag to what is given then (without ``--public``: not
public), so a declaration never outlives the file it was made for. Uploads are never declared
public, nor are loader names, except the shared sets whose descriptor declares them public
(``mnist1d-test``, :attr:`workers.datasets.descriptors.DatasetDescriptor.public`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError
from sweeper.datasets.files import file_spec, worker_spec
from sweeper.datasets.fixed_view import view_of
from sweeper.datasets.names import in_catalog, is_upload, unknown_dataset
from sweeper.store import Dataset


def resolve(
    engine: Engine | None,
    dataset: Any,
    evaluation: Any = None,
    *,
    tune_on: Mapping[str, str] | None = None,
) -> Any:
    """The worker-side :class:`workers.datasets.DatasetSpec` of a spec's dataset.

    Uploads (``ds_...``) and registered names are looked up in the catalog (their stored
    file, format and label column); loader names (``digits``, ``csv`` with a path) are
    passed through.

    Args:
        engine: The store's engine (None: local use without a database; catalog names then
            cannot be resolved).
        dataset: The spec's ``dataset`` section (a :class:`dpsweep.spec.DatasetConfig` or a
            dict).
        evaluation: The spec's ``eval`` section (:class:`dpsweep.spec.EvalConfig`, or a dict
            with ``mode`` and ``dataset``); None: mode ``carve-out``. Mode ``public`` resolves
            ``dataset`` to a registered name its owner declared public
            (:func:`public_eval_spec`).
        tune_on: The public datasets the arms tune on, arm label to name (an arm's
            ``tune_on``, :func:`tuning_names`); each is resolved as a public evaluation
            dataset is (:func:`public_eval_spec`, field ``arms.<label>.tune_on``) and read with
            the training dataset's scaling settings.

    Returns:
        The worker spec with ``evaluation`` (and in mode ``public`` ``eval_dataset``) set, and
        ``tune_datasets`` holding each tuning dataset once.

    Raises:
        ConfigError: an upload id or name that does not exist, a path given with a
            registered name, or an option its loader does not declare or a value out of its
            range (field ``dataset.*``); an evaluation dataset that is not a
            registered name declared public, or is the training dataset (``eval.dataset``); a
            tuning dataset refused for the same reasons (``arms.<label>.tune_on``).
    """
    spec = _resolve_training(engine, dataset)
    _check_options(spec)
    get = dataset.get if isinstance(dataset, dict) else lambda k, d=None: getattr(dataset, k, d)
    if tune_on:
        spec = replace(spec, tune_datasets=_tuning_specs(engine, tune_on, spec, str(get("name"))))
    mode, eval_name = _eval_settings(evaluation)
    if mode == "carve-out":
        return spec
    if mode == "dp":
        return replace(spec, evaluation="dp")
    eval_spec = public_eval_spec(engine, eval_name, training=str(get("name")))
    return replace(spec, evaluation="public", eval_dataset=eval_spec)


def tuning_names(arms: Iterable[Any]) -> dict[str, str]:
    """Arm label to the public dataset it tunes on (its ``tune_on``), for :func:`resolve`."""
    return {a.label: str(a.tune_on) for a in arms if getattr(a, "tune_on", None)}


def tuning_spec(
    engine: Engine | None, name: str, training: Any, *, training_name: str, field: str
) -> Any:
    """The worker spec of one public tuning dataset (:func:`public_eval_spec` with ``field``),
    read with the training spec's (``training``, named ``training_name`` in the spec) split and
    scaling settings, so that the tuned model sees inputs bounded as the private runs' are."""
    public = public_eval_spec(engine, name, training=training_name, field=field)
    return replace(
        public,
        input_bounds=training.input_bounds,
        feature_clip=training.feature_clip,
        test_fraction=training.test_fraction,
        split_seed=training.split_seed,
    )


def _tuning_specs(
    engine: Engine | None, tune_on: Mapping[str, str], training: Any, training_name: str
) -> tuple[tuple[str, Any], ...]:
    out: dict[str, Any] = {}
    for label, name in tune_on.items():
        if name not in out:
            out[name] = tuning_spec(
                engine, name, training, training_name=training_name, field=f"arms.{label}.tune_on"
            )
    return tuple(out.items())


def _check_options(spec: Any) -> None:
    """The loader's options against its torch-free descriptor (name, ranges, unknown options),
    so that a bad ``dataset.options`` value is refused when the sweep is planned, before any
    budget is reserved (the loader checks the same declaration again when it runs)."""
    # deferred: workers.datasets pulls numpy and every loader; sweeper.datasets stays light
    from workers.datasets.descriptors import get_dataset_descriptor

    get_dataset_descriptor(spec.name).validate(spec.options)


def _eval_settings(evaluation: Any) -> tuple[str, str | None]:
    """``(mode, dataset)`` of a spec's ``eval`` section (an EvalConfig, a dict or None)."""
    if evaluation is None:
        return "carve-out", None
    get = (
        evaluation.get
        if isinstance(evaluation, dict)
        else lambda k, d=None: getattr(evaluation, k, d)
    )
    name = get("dataset")
    mode = get("mode") or ("public" if name is not None else "carve-out")
    if mode not in ("carve-out", "public", "dp"):
        raise ConfigError(
            f"unknown eval mode {mode!r}; choose one of: carve-out, public, dp", field="eval.mode"
        )
    return str(mode), None if name is None else str(name)


_HOW_TO_PUBLISH = (
    "its owner registers public records with `dpsweep datasets register FILE --name NAME --public`"
)


def public_eval_spec(
    engine: Engine | None, name: str | None, *, training: str, field: str = "eval.dataset"
) -> Any:
    """The worker spec of a public evaluation dataset: a registered name whose owner declared
    its records public (``register_file(..., public=True)``). The same checks give an arm's
    public tuning dataset (``field="arms.<label>.tune_on"``, named in the messages).

    Raises:
        ConfigError (field ``field``, default ``eval.dataset``): no name; an upload id or a
            loader name (never declared public); the training dataset's own name or records; a
            name that is not registered or not declared public; no database.
    """
    from workers.datasets.registry import has_loader  # deferred: numpy (see _check_options)

    # Evaluation and tuning records are public: never the (private) training records.
    what = "evaluation" if field == "eval.dataset" else "public tuning"
    if not name:
        raise ConfigError(
            f"{field} needs a registered name declared public ({_HOW_TO_PUBLISH})", field=field
        )
    if name == training:
        raise ConfigError(
            f"{field} {name!r} is the training dataset, whose records are private: {what} "
            f"records are public ones; {_HOW_TO_PUBLISH} under a name of their own",
            field=field,
        )
    if is_upload(name):
        raise ConfigError(
            f"{field} {name!r} is an upload: uploads are never declared public; {_HOW_TO_PUBLISH}",
            field=field,
        )
    if has_loader(name) and public_builtin(name):
        # Records dpsweep generates or bundles and declares public (mnist1d-test): no file,
        # no owner; the same kind, shape and label checks apply when they are loaded.
        return worker_spec({}, path=None, name=name, label_column=None)
    if has_loader(name):
        raise ConfigError(
            f"{field} {name!r} is a loader of dpsweep, not a dataset declared public by its "
            f"owner; {_HOW_TO_PUBLISH}",
            field=field,
        )
    if engine is None:
        raise ConfigError(
            f"{field} {name!r} is in the catalog and needs the service's database",
            field=field,
        )
    with Session(engine) as session:
        row = session.scalars(select(Dataset).where(Dataset.name == name)).first()
        trained = (
            session.scalars(select(Dataset.content_sha256).where(Dataset.name == training)).first()
            if in_catalog(training)
            else None
        )
    if row is None or row.storage_path is None or row.format is None:
        raise ConfigError(
            f"no registered dataset {name!r} for {field} (`dpsweep datasets list` lists "
            f"them); {_HOW_TO_PUBLISH}",
            field=field,
        )
    if not _public_flag(row):
        raise ConfigError(
            f"{field} {name!r} is not declared public by its owner; register it with "
            f"`dpsweep datasets register FILE --name {name} --public`",
            field=field,
        )
    if trained and row.content_sha256 == trained:
        raise ConfigError(
            f"{field} {name!r} reads the same records as the training dataset: "
            f"{what} records are public ones; use other records",
            field=field,
        )
    return file_spec(row)


def _public_flag(row: Dataset) -> bool:
    return bool(dict(row.config or {}).get("public", False))


def public_builtin(name: str) -> bool:
    """Whether ``name`` is a shared set whose descriptor declares its records public."""
    from workers.datasets.descriptors import DATASET_DESCRIPTORS  # deferred: numpy

    d = DATASET_DESCRIPTORS.get(name)
    return d is not None and d.shared and d.public


def is_public(engine: Engine, name: str) -> bool:
    """Whether ``name`` is a registered file whose owner declared its records public, or a
    shared set declared public (``mnist1d-test``)."""
    if is_upload(name):
        return False
    if not in_catalog(name):
        return public_builtin(name)
    with Session(engine) as session:
        row = session.scalars(select(Dataset).where(Dataset.name == name)).first()
    return row is not None and bool(row.storage_path) and _public_flag(row)


def _resolve_training(engine: Engine | None, dataset: Any) -> Any:
    """:func:`resolve` of the training dataset alone (mode ``carve-out``)."""
    get = dataset.get if isinstance(dataset, dict) else lambda k, d=None: getattr(dataset, k, d)
    name = str(get("name"))
    if not in_catalog(name):
        return worker_spec(dataset, path=get("path"), name=name, label_column=get("label_column"))
    upload = is_upload(name)
    if not upload and (get("path") or get("labels_path")):
        raise ConfigError(
            f"dataset {name!r} is a registered name: it reads the file it was registered with; "
            "leave out path and labels_path",
            field="dataset.path",
        )
    if engine is None:
        raise ConfigError(f"dataset {name!r} is in the catalog and needs the service's database")
    with Session(engine) as session:
        row = session.scalars(select(Dataset).where(Dataset.name == name)).first()
    if row is None or row.storage_path is None or row.format is None:
        raise ConfigError(unknown_dataset(name), field="dataset.name")

    # Sizes come from the owner's declaration (sweeper.datasets.fixed_view), not from
    # counting the records: the plan must not depend on whether one record (or, with a
    # privacy unit, one person and all their rows) is there.
    view = view_of(row)
    return replace(
        file_spec(row, dataset), declared_size=view.n_examples, declared_units=view.n_units
    )
