"""The owner's view of a stored dataset: how its records are split and scaled.

A stored dataset (an upload ``ds_...`` or a registered name) is read the way its **owner**
declared: its loader options (at registration), and the settings below, which every sweep on
it uses unless its owner's own spec says otherwise:

* ``test_fraction`` and ``split_seed``: the evaluation split (in mode ``dp`` the key of the
  content-keyed split);
* ``input_bounds`` and ``feature_clip``: how inputs are scaled and bounded;
* ``classes``: the class list in encoding order (computed once at upload or registration;
  the owner may declare another, e.g. a class the records do not hold yet);
* ``n_examples``: the number of records, declared public (by default the count at upload or
  registration). Plans take N, the sample rate q = b / n_train, the step count and the
  noisy accuracy's denominator from it, never from counting the records, so two neighbouring
  datasets under one declaration get the same plan, the same q and the same sigma: the size
  of the data is the owner's declaration, not a count an analyst can read.

**Declared facts.** Three facts about the records size what an analyst plans and sees: the
number of records (N, hence q and every DP denominator), the class list (the model's output
and the label encoding) and the feature shape (the model's input). Counted from the records
they would tell an analyst how many records there are and which classes occur, so an analyst
sees, and plans with, only what the owner *declared* (``declared`` lists them): set by value
(``view.n_examples``, ``view.classes``, ``view.input_shape``) or by publishing the counts as
they are (``declare_counted``). A grant on a dataset with a fact undeclared is refused, and
an analyst's sweep on one is refused (409) before anything is reserved
(:func:`require_declared`). The owner's own views and plans may use the counts. A dataset
with a privacy unit (:mod:`sweeper.datasets.privacy_units`) has a fourth: the number of units
(``view.n_units``), from which its plans take q, T and N; how many rows a unit has is never
counted nor shown.

They are part of the dataset's registered description: set at upload or registration (the
defaults, 0.2, 0, none, 5) and changed later by the owner only
(``PUT /api/v1/datasets/{id}/policy`` with ``view``, ``dpsweep datasets policy``).

**Why an analyst may not choose them.** Each of them is a way to read the private records.
An analyst who picks the split seed can search offline for a seed that puts one target
record alone in a tiny evaluation split and learn from a dry run whether the record is there;
one who picks loader options or a label column parses the same file into other records, with
a fresh ledger; one who picks bounds moves what the records contribute. So an analyst's spec
may leave them out (the owner's apply) or repeat the owner's values; any other value is
refused (422 naming the field) before anything is planned or reserved, and the stored sweep
carries the owner's values (:func:`apply_view`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from dpsweep.errors import ConfigError, IllegalState
from dpsweep.spec import DatasetConfig, SweepSpec
from sweeper.datasets.catalog import dataset_row
from sweeper.store import Dataset

#: The split and scaling settings an owner fixes (``dataset.<name>`` in a spec).
SPEC_FIELDS: tuple[str, ...] = ("test_fraction", "split_seed", "input_bounds", "feature_clip")
#: The facts that size an analyst's plan and view, which only the owner's declaration sets
#: (``n_units`` on a dataset with a privacy unit only: :meth:`DatasetView.facts`).
DECLARED_FACTS: tuple[str, ...] = ("n_examples", "classes", "input_shape", "n_units")
#: Everything of the view an owner may change.
VIEW_FIELDS: tuple[str, ...] = (*SPEC_FIELDS, *DECLARED_FACTS)
#: What reads the file itself: fixed at upload or registration, never chosen by an analyst.
FILE_FIELDS: tuple[str, ...] = ("path", "labels_path", "label_column", "options")


@dataclass(frozen=True)
class DatasetView:
    """The split and scaling settings of a stored dataset (see the module docstring)."""

    test_fraction: float = 0.2
    split_seed: int = 0
    input_bounds: tuple[float, float] | None = None
    feature_clip: float = 5.0
    n_examples: int | None = None
    #: The class list in encoding order (stored as the row's ``config["classes"]``, declared at
    #: upload or registration); None for rows stored before classes were declared.
    classes: tuple[str, ...] | None = None
    #: The shape of one record's features (counted at upload, or declared).
    input_shape: tuple[int, ...] | None = None
    #: Which of :data:`DECLARED_FACTS` the owner declared public.
    declared: tuple[str, ...] = ()
    #: The unit column its owner declared at upload or registration (``config["privacy_unit"]``;
    #: None: each row is its own unit). Fixed: a spec repeats it or leaves it out.
    privacy_unit: str | None = None
    #: The number of privacy units (counted at upload or registration, or declared); None
    #: without a unit. How many rows each has is never here: it is never counted.
    n_units: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["input_bounds"] = None if self.input_bounds is None else list(self.input_bounds)
        out["classes"] = None if self.classes is None else list(self.classes)
        out["input_shape"] = None if self.input_shape is None else list(self.input_shape)
        out["declared"] = list(self.declared)
        if self.privacy_unit is None:
            # A dataset without a unit reads as it did before units existed.
            del out["privacy_unit"], out["n_units"]
        return out

    def facts(self) -> tuple[str, ...]:
        """The facts of :data:`DECLARED_FACTS` this dataset has: ``n_units`` with a unit."""
        return tuple(f for f in DECLARED_FACTS if f != "n_units" or self.privacy_unit)

    def undeclared(self) -> list[str]:
        """The facts of :meth:`facts` the owner has not declared."""
        return [f for f in self.facts() if f not in self.declared]

    def public(self) -> DatasetView:
        """The view as an analyst may see it: the undeclared facts withdrawn (never a count)."""
        hidden = {f: None for f in self.undeclared()}
        return replace(self, **hidden)  # type: ignore[arg-type]


def view_of(row: Dataset) -> DatasetView:
    """The view stored in a dataset row (the defaults for rows stored before views)."""
    cfg = dict(row.config or {})
    raw = dict(cfg.get("view") or {})
    bounds = raw.get("input_bounds")
    unit = cfg.get("privacy_unit")
    return DatasetView(
        test_fraction=float(raw.get("test_fraction", 0.2)),
        split_seed=int(raw.get("split_seed", 0)),
        input_bounds=None if bounds is None else (float(bounds[0]), float(bounds[1])),
        feature_clip=float(raw.get("feature_clip", 5.0)),
        n_examples=int(raw.get("n_examples") or row.n_examples or 0) or None,
        classes=_classes_of(row),
        input_shape=_shape_of(raw.get("input_shape") or dict(row.config or {}).get("input_shape")),
        declared=tuple(f for f in DECLARED_FACTS if f in (raw.get("declared") or ())),
        privacy_unit=None if unit is None else str(unit),
        n_units=(int(raw.get("n_units") or cfg.get("n_units") or 0) or None) if unit else None,
    )


def _shape_of(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)


def require_declared(row: Dataset) -> None:
    """Refuse analyst use of a dataset whose owner has not declared every fact that sizes an
    analyst's plan and view (a grant, or an analyst's sweep under an older grant).

    Raises:
        IllegalState: naming the facts to declare and how (409; nothing is reserved).
    """
    view = view_of(row)
    missing = view.undeclared()
    if missing:
        units = ', "n_units": U' if view.privacy_unit else ""
        body = f'{{"view": {{"n_examples": N, "classes": [...], "input_shape": [...]{units}}}}}'
        by_value = "--n-examples, --classes, --input-shape" + (
            ", --n-units" if view.privacy_unit else ""
        )
        raise IllegalState(
            f"dataset {row.name!r} is not ready for analysts: its owner has not declared "
            f"{', '.join(missing)} public (an analyst's plan is sized by what the owner "
            "declares, never by counting the records). The owner declares them with PUT "
            f'/api/v1/datasets/{row.name}/policy and {body}, or {{"declare_counted": '
            "true} to publish the counts as they are; on the command line `dpsweep datasets "
            f"policy {row.name} --declare-counted` (or {by_value})"
        )


def declare_counted(config: dict[str, Any], n_examples: int | None) -> dict[str, Any]:
    """``config`` with the counted size, class list and feature shape (and, with a privacy
    unit, number of units) declared public (the owner's choice: they publish the counts as
    they are)."""
    view = dict(config.get("view") or {})
    counted: dict[str, Any] = {
        "n_examples": view.get("n_examples") or n_examples,
        "classes": config.get("classes"),
        "input_shape": view.get("input_shape") or config.get("input_shape"),
    }
    unit = config.get("privacy_unit")
    if unit:
        counted["n_units"] = view.get("n_units") or config.get("n_units")
    missing = [f for f, v in counted.items() if v is None]
    if missing:
        raise ConfigError(
            f"the records' {', '.join(missing)} were never counted; declare them by value "
            "(view.n_examples, view.classes, view.input_shape"
            + (", view.n_units)" if unit else ")"),
            field="declare_counted",
        )
    view["n_examples"] = int(counted["n_examples"])
    view["input_shape"] = [int(v) for v in counted["input_shape"]]
    if unit:
        view["n_units"] = int(counted["n_units"])
    view["declared"] = [f for f in DECLARED_FACTS if f in counted]
    return {**config, "view": view}


def _classes_of(row: Dataset) -> tuple[str, ...] | None:
    classes = dict(row.config or {}).get("classes")
    return None if classes is None else tuple(str(c) for c in classes)


def checked_view(current: DatasetView, changes: dict[str, Any]) -> DatasetView:
    """``current`` with ``changes`` applied (a key set to None resets input_bounds), checked as
    a spec's ``dataset`` section is. The privacy unit is not among them: it changes with the
    file's reading (:mod:`sweeper.datasets.privacy_units`).

    Raises:
        ConfigError: an unknown setting or a value out of range (field ``view.<name>``), or a
            number of units for a dataset without a unit.
    """
    unknown = set(changes) - set(VIEW_FIELDS)
    if unknown:
        raise ConfigError(
            f"unknown view setting(s) {sorted(unknown)}; allowed: {', '.join(VIEW_FIELDS)}",
            field=f"view.{sorted(unknown)[0]}",
        )
    if changes.get("n_units") is not None and current.privacy_unit is None:
        raise ConfigError(
            "view.n_units is the number of privacy units, and this dataset has none (each "
            "row is its own unit): leave it out, or declare the unit column first "
            '(PUT .../policy with {"privacy_unit": COLUMN})',
            field="view.n_units",
        )
    merged = {**asdict(current), **changes}
    declared = _declared_after(current.declared, changes)
    for name in ("declared", "privacy_unit"):
        merged.pop(name)
    shape = _checked_shape(merged.pop("input_shape"))
    for name in ("test_fraction", "split_seed", "feature_clip"):
        if merged[name] is None:
            merged[name] = getattr(DatasetView(), name)
    classes = merged.pop("classes")
    if classes is not None and (
        not isinstance(classes, (list, tuple))
        or not 2 <= len(classes) <= 10000
        or not all(isinstance(c, str) and 0 < len(c) <= 200 for c in classes)
        or len(set(classes)) != len(classes)
    ):
        raise ConfigError(
            "view.classes is the class list in encoding order: 2-10000 distinct labels (strings "
            "of 1-200 characters) as the file writes them",
            field="view.classes",
        )
    size = _checked_count(merged.pop("n_examples"), "n_examples", "records", 2)
    units = _checked_count(merged.pop("n_units"), "n_units", "privacy units", 1)
    try:
        # The same checks as a spec's dataset section (ranges, finite bounds, lo < hi).
        d = DatasetConfig.model_validate({"name": "view", **merged})
    except ValueError as exc:
        errors: list[Any] = list(getattr(exc, "errors", lambda: [])())
        where = ".".join(str(p) for p in errors[0]["loc"]) if errors else ""
        raise ConfigError(
            f"invalid dataset view: {errors[0]['msg'] if errors else exc}",
            field=f"view.{where}" if where else "view",
        ) from None
    return DatasetView(
        test_fraction=d.test_fraction,
        split_seed=d.split_seed,
        input_bounds=d.input_bounds,
        feature_clip=d.feature_clip,
        n_examples=size,
        classes=None if classes is None else tuple(classes),
        input_shape=shape,
        declared=declared,
        privacy_unit=current.privacy_unit,
        n_units=units,
    )


def _checked_count(value: Any, name: str, what: str, least: int) -> int | None:
    """A declared count (``view.<name>``): None, or an integer from ``least``.

    Raises:
        ConfigError: anything else (field ``view.<name>``).
    """
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not least <= value < 2**53
    ):
        raise ConfigError(
            f"view.{name} is the number of {what}, declared public: an integer >= {least}; "
            f"got {value!r}",
            field=f"view.{name}",
        )
    return None if value is None else int(value)


def _declared_after(before: tuple[str, ...], changes: dict[str, Any]) -> tuple[str, ...]:
    """The declared facts once ``changes`` apply: a fact given a value is declared, one given
    None is withdrawn (its count stays the owner's alone)."""
    now = set(before)
    for fact in DECLARED_FACTS:
        if fact in changes:
            (now.add if changes[fact] is not None else now.discard)(fact)
    return tuple(f for f in DECLARED_FACTS if f in now)


def _checked_shape(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if (
        not isinstance(value, (list, tuple))
        or not 1 <= len(value) <= 4
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**31 for v in value)
    ):
        raise ConfigError(
            f"view.input_shape is the shape of one record's features: 1-4 positive integers "
            f"(e.g. [64] or [1, 28, 28]); got {value!r}",
            field="view.input_shape",
        )
    return tuple(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        try:
            return float(a) == float(b)  # exact: 0.2 given for 0.2 stored, nothing else
        except (TypeError, ValueError):
            return False
    return bool(a == b)


def apply_view(spec: SweepSpec, row: Dataset, *, analyst: bool) -> SweepSpec:
    """The spec with the dataset's view filled in: what the sweep will run and store.

    Settings the spec leaves out take the owner's values. An analyst's spec may repeat the
    owner's values but not change them, nor anything that reads the file (path, label
    column, loader options); the dataset's owner may (their own sweeps on their own data;
    the ledger charged stays the one bound to the name, whatever they choose).

    The privacy unit is the owner's for everyone, the owner included (one ledger, one unit:
    :func:`check_privacy_unit`); the stored spec carries it.

    Raises:
        ConfigError: an analyst's spec sets one of them to another value (field
            ``dataset.<name>``), saying that the owner sets it; anyone's spec names another
            privacy unit (field ``dataset.privacy_unit``).
    """
    d = spec.dataset
    given = d.model_fields_set
    view = view_of(row)
    check_privacy_unit(d, row)
    updates: dict[str, Any] = {}
    if view.privacy_unit is not None and d.privacy_unit is None:
        updates["privacy_unit"] = view.privacy_unit
    for name in SPEC_FIELDS:
        owner_value = getattr(view, name)
        if name not in given:
            updates[name] = owner_value
        elif analyst and not _same(getattr(d, name), owner_value):
            raise ConfigError(
                f"dataset.{name} of dataset {d.name!r} is set by its owner "
                f"({_shown(owner_value)}); analysts cannot change it: leave it out",
                field=f"dataset.{name}",
            )
    if analyst:
        cfg = dict(row.config or {})
        stored = {
            "path": None,
            "labels_path": None,
            "label_column": cfg.get("label_column"),
            "options": dict(cfg.get("options") or {}),
        }
        for name in FILE_FIELDS:
            value = getattr(d, name)
            if name in given and value not in (None, {}) and not _same_json(value, stored[name]):
                raise ConfigError(
                    f"dataset.{name} of dataset {d.name!r} is fixed when its owner uploads or "
                    "registers it; analysts cannot change how its file is read: leave it out",
                    field=f"dataset.{name}",
                )
    if not updates:
        return spec
    return spec.model_copy(update={"dataset": d.model_copy(update=updates)})


def check_privacy_unit(d: DatasetConfig, row: Dataset) -> None:
    """Refuse a spec's ``dataset.privacy_unit`` that is not the stored dataset's own.

    The unit is the owner's declaration at upload or registration: it keys what the ledger
    counts (a person or a row), so no spec may change it, not even the owner's. A spec may
    leave it out or repeat it.

    Raises:
        ConfigError: field ``dataset.privacy_unit``, saying how the owner sets it.
    """
    own = view_of(row).privacy_unit
    if "privacy_unit" not in d.model_fields_set or d.privacy_unit == own:
        return
    how = (
        f"its owner registers the file again (`dpsweep datasets register FILE --name NAME "
        f"--privacy-unit COLUMN`, or an upload with privacy_unit=COLUMN), or sets it with PUT "
        f'/api/v1/datasets/{row.name}/policy and {{"privacy_unit": COLUMN}} (`dpsweep datasets '
        f"policy {row.name} --privacy-unit COLUMN`) while its ledger has spent nothing at "
        "another level"
    )
    if own is None:
        raise ConfigError(
            f"dataset {d.name!r} was registered without a privacy unit (each row is its own "
            f"unit), so dataset.privacy_unit {d.privacy_unit!r} cannot apply: leave it out. The "
            f"owner sets the unit at upload or registration: {how}",
            field="dataset.privacy_unit",
        )
    raise ConfigError(
        f"dataset.privacy_unit of dataset {d.name!r} is {own!r}, set by its owner at upload or "
        f"registration; a spec cannot change it (got {d.privacy_unit!r}): leave it out or "
        f"repeat it. To budget these records per another unit, {how}",
        field="dataset.privacy_unit",
    )


def _same_json(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return str(list(value))
    return repr(value)


def stored_row(engine: Engine, name: str) -> Dataset | None:
    """The catalog row of a stored file (upload or registered name), or None."""
    with Session(engine) as session:
        row = dataset_row(session, name)
        if row is None or not row.storage_path or not row.format:
            return None
        session.expunge(row)
        return row
