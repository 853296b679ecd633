"""Submission checks: refuse a spec that cannot run honestly, before anything is planned.

The model is registered with options in range, every arm names a known private strategy and a
learning rate, and every value a trial may get is checked against the strategy's torch-free
descriptor (type, finiteness, range, choices), so a bad hyperparameter or model option is
refused at submission, naming its field, and nothing is reserved. Once the data is loaded,
:func:`check_model_on_data` checks that the model builds on it and that its engine path takes
it (the generic path's layer check). The planner runs both, so every path that plans (``dpsweep
plan``, ``dpsweep run``, the API's plan and submit) refuses the same specs before anything is
reserved. With a privacy unit (:attr:`dpsweep.spec.DatasetConfig.privacy_unit`),
:func:`check_units_on_data` refuses a spec whose unit settings do not fit the loaded data.
"""

from __future__ import annotations

import math
from typing import Any

from dpsweep.errors import ConfigError
from dpsweep.spec import ArmConfig, Axis, SweepSpec
from dpsweep.spec_model import LORA_RANK_AXIS
from dpsweep.spec_training import ROWS_PER_UNIT_AXIS, TrainingConfig
from sweeper.sweeps.checkpoints import arm_ranks, configured_checkpoints_dir
from workers.augment_check import check_augment
from workers.model_check import check_model
from workers.models import check_lora_axis, get_model_descriptor, model_spec
from workers.strategies import get_descriptor


def check_spec(spec: SweepSpec) -> None:
    """Refuse specs that cannot run honestly, before any planning.

    Raises:
        ConfigError: with the field to fix.
    """
    if not spec.privacy.charge_repeats and spec.seeds > 1:
        raise ConfigError(
            "privacy.charge_repeats is false, but every seed of a sweep trains on the real data "
            "and must be charged; set charge_repeats: true (or seeds: 1)",
            field="privacy.charge_repeats",
        )
    _check_model(spec)
    _check_pretrain(spec)
    _check_arms(spec)


def check_model_on_data(
    spec: SweepSpec,
    data: Any,
    *,
    checkpoints_dir: str | None = None,
    allow_paths: bool = False,
) -> str:
    """The spec's model on the loaded data: will every trial be able to train it?

    The second half of the one check before any reservation or charge (the first is
    :func:`check_spec`): :func:`sweeper.sweeps.planning.plan_sweep` runs both, so ``dpsweep
    plan``, ``dpsweep run`` and the API's plan and submit refuse the same specs, and
    ``dpsweep train`` runs the same :func:`workers.model_check.check_model` before its charge.
    The model is built as a trial builds it (on the meta device; not at all for a model whose
    descriptor declares the packed path) and checked by the generic path's layer check, so a
    BatchNorm or Dropout model is refused here, naming the layer and the fix, instead of by
    every trial after the sweep was reserved.

    A model that starts from a checkpoint is built from it (its digest checked against the
    spec's ``checkpoint_digest``), with what ``trainable`` trains (LoRA at the smallest rank
    the grids give).

    Args:
        spec: The sweep spec.
        data: The loaded :class:`workers.datasets.Dataset` (``input_shape``, ``num_classes``,
            ``vocab_size``).
        checkpoints_dir: The registered checkpoints (default: ``DPSWEEP_CHECKPOINTS_DIR``).
        allow_paths: ``model.checkpoint`` may be a path (the local command line only).

    Returns:
        The engine path the trials will take (``packed`` or ``generic``).

    Raises:
        ConfigError: naming the field (``model.name``, ``model.options.<name>``,
            ``model.checkpoint``, ``model.checkpoint_digest``, ``model.trainable``,
            ``training.augment``: augmentation of data that are not images, or with bam).
    """
    _check_pretrain_fits(spec, data)
    check_augment(
        spec.training.augment,
        input_shape=tuple(data.input_shape),
        ascent=any(get_descriptor(arm.strategy).gradient_passes > 1 for arm in spec.arms),
    )
    ranks = sorted({r for arm in spec.arms for r in arm_ranks(spec.model, arm.grid, arm.params)})
    model = model_spec(
        spec.model,
        checkpoints_dir=configured_checkpoints_dir(checkpoints_dir),
        allow_paths=allow_paths,
        lora_r=ranks[0] if ranks else None,
    )
    return check_model(
        model,
        input_shape=tuple(data.input_shape),
        num_classes=int(data.num_classes),
        vocab_size=getattr(data, "vocab_size", None),
        strategies=[arm.strategy for arm in spec.arms],
    )


def _check_model(spec: SweepSpec) -> None:
    """The model is registered and its options are in range (its torch-free descriptor).

    The worker builds the model with the same :meth:`~workers.models.ModelDescriptor.validate`;
    checking here refuses a bad option at submission (HTTP 422 naming ``model.options.<name>``)
    instead of after every trial was charged.
    """
    get_model_descriptor(spec.model.name).validate(spec.model.options)


def _check_pretrain(spec: SweepSpec) -> None:
    """``model.pretrain_on`` names a shared set declared public, not the training dataset:
    pre-training reads its records without noise (ε 0), so they must be public
    (:mod:`workers.pretraining`). Refused before anything is planned or reserved."""
    name = spec.model.pretrain_on
    if name is None:
        return
    # deferred: the dataset descriptors pull numpy (this module's checks are otherwise light)
    from sweeper.datasets.resolution import public_builtin

    field = "model.pretrain_on"
    if name == spec.dataset.name:
        raise ConfigError(
            f"{field} {name!r} is the training dataset, whose records are private: pre-train "
            "on a dataset declared public (e.g. mnist1d-public)",
            field=field,
        )
    if not public_builtin(name):
        raise ConfigError(
            f"{field} {name!r} is not a shared dataset declared public: pre-training reads its "
            "records without noise, so only public records may be used (e.g. mnist1d-public; "
            "`dpsweep datasets list` marks them)",
            field=field,
        )


def _check_pretrain_fits(spec: SweepSpec, data: Any) -> None:
    """The public pre-training records fit the model the private data shapes (same input
    shape, classes and vocabulary), checked on the loaded data before anything is reserved."""
    name = spec.model.pretrain_on
    if name is None:
        return
    # deferred: loads the public records (numpy, the loaders)
    from workers.datasets.loading import load_dataset
    from workers.datasets.records import DatasetSpec  # deferred: numpy
    from workers.pretraining import check_fits  # deferred: torch (the pre-training)

    check_fits(load_dataset(DatasetSpec(name)), data)


def _check_arms(spec: SweepSpec) -> None:
    """Every arm names a known private strategy, a learning rate, and valid hyperparameters
    (:func:`check_arm`), and tunes on public data only where its points are known before the
    run (:func:`_check_tuning`)."""
    for arm in spec.arms:
        check_arm(arm)
        _check_lora(spec, arm)
        _check_rows_per_unit(arm)
        _check_tuning(spec, arm)


def _check_lora(spec: SweepSpec, arm: ArmConfig) -> None:
    """An arm's ``lora_r`` (a grid axis or a fixed param) sweeps LoRA's rank: the model must
    train LoRA, and every rank a trial may get must be a whole number in range."""
    base = f"arms.{arm.label}"
    if LORA_RANK_AXIS in arm.grid:
        values = _axis_values(arm.grid[LORA_RANK_AXIS])
        check_lora_axis(spec.model, values, field=f"{base}.grid.{LORA_RANK_AXIS}")
    elif LORA_RANK_AXIS in arm.params:
        values = [arm.params[LORA_RANK_AXIS]]
        check_lora_axis(spec.model, values, field=f"{base}.params.{LORA_RANK_AXIS}")


#: An arm's grid axes and params that are not its strategy's hyperparameters.
_NOT_THE_STRATEGYS = ("lr", LORA_RANK_AXIS, ROWS_PER_UNIT_AXIS)
#: The most rows of one unit a step may use (``TrainingConfig.rows_per_unit``'s bound).
_MAX_ROWS_PER_UNIT = 1024


def _rows_per_unit_field(arm: ArmConfig) -> str | None:
    """Where an arm sets rows_per_unit (``arms.<label>.grid.rows_per_unit`` or its params),
    None where it does not."""
    base = f"arms.{arm.label}"
    if ROWS_PER_UNIT_AXIS in arm.grid:
        return f"{base}.grid.{ROWS_PER_UNIT_AXIS}"
    if ROWS_PER_UNIT_AXIS in arm.params:
        return f"{base}.params.{ROWS_PER_UNIT_AXIS}"
    return None


def _check_rows_per_unit(arm: ArmConfig) -> None:
    """An arm's ``rows_per_unit`` (a grid axis or a fixed param) is a whole number of rows in
    1..1024 for every trial, as ``training.rows_per_unit`` is; whether the dataset has a unit
    at all is :func:`check_units_on_data`'s, once it is loaded."""
    field = _rows_per_unit_field(arm)
    if field is None:
        return
    if ROWS_PER_UNIT_AXIS in arm.grid:
        values = _axis_values(arm.grid[ROWS_PER_UNIT_AXIS])
    else:
        values = [arm.params[ROWS_PER_UNIT_AXIS]]
    for v in values:
        whole = (
            not isinstance(v, bool)
            and isinstance(v, int | float)
            and math.isfinite(v)
            and v == int(v)
        )
        if not whole or not 1 <= int(v) <= _MAX_ROWS_PER_UNIT:
            raise ConfigError(
                f"arm {arm.label!r}: {ROWS_PER_UNIT_AXIS} is the most rows of one unit a step "
                f"uses: whole numbers in 1..{_MAX_ROWS_PER_UNIT}; got {v!r}",
                field=field,
            )


def check_units_on_data(spec: SweepSpec, data: Any) -> None:
    """The spec's privacy unit and unit settings against the loaded data, before anything is
    planned or reserved: one spec is accounted at one level, the data's.

    * ``dataset.privacy_unit``, where the spec names one, is the data's own unit (a stored
      dataset's owner or a built-in decides it: a spec that names another would be charged
      at a level it did not ask for);
    * on data without a unit, the unit settings (``training.unit_bounding`` or
      ``training.rows_per_unit`` other than their defaults, an arm's ``rows_per_unit``) are
      refused: they would suggest a person is protected where only a row is;
    * on data with a unit, ``training.augment`` is refused (the engine bounds a unit's rows,
      not augmented copies of them).

    Only values other than the defaults count: a spec dumped and read back (the API plans a
    copy) carries every default, which says nothing about the data.

    Raises:
        ConfigError: naming the field (``dataset.privacy_unit``, ``training.unit_bounding``,
            ``training.rows_per_unit``, ``arms.<label>.grid.rows_per_unit``,
            ``training.augment``).
    """
    unit = getattr(data, "privacy_unit", None)
    asked = spec.dataset.privacy_unit
    if asked is not None and asked != unit:
        has = f"its unit is {unit!r}" if unit is not None else "it has no privacy unit"
        raise ConfigError(
            f"dataset.privacy_unit {asked!r} is not the dataset's: {has} (set by its owner, or "
            "by the built-in loader); one spec is accounted at one level, the data's: leave "
            "dataset.privacy_unit out, or give the dataset's own",
            field="dataset.privacy_unit",
        )
    if unit is None:
        _refuse_unit_settings(spec)
    elif spec.training.augment is not None:
        raise ConfigError(
            f"the dataset's privacy unit is {unit!r}: augmentation is not supported with a "
            "privacy unit (a unit's rows are bounded together, augmented copies are not); "
            "leave training.augment out",
            field="training.augment",
        )


def _refuse_unit_settings(spec: SweepSpec) -> None:
    """Refuse unit settings on data without a unit (:func:`check_units_on_data`)."""
    defaults = TrainingConfig.model_fields
    where = [
        f"training.{name}"
        for name in ("unit_bounding", ROWS_PER_UNIT_AXIS)
        if getattr(spec.training, name) != defaults[name].default
    ]
    where += [f for f in (_rows_per_unit_field(arm) for arm in spec.arms) if f is not None]
    if where:
        raise ConfigError(
            f"the dataset has no privacy unit; {where[0]} applies to datasets with one only "
            "(each row is its own unit here, so every epsilon is per row): leave it out, or "
            "use a dataset whose owner declared a unit (dataset.privacy_unit, e.g. patient_id)",
            field=where[0],
        )


def _check_tuning(spec: SweepSpec, arm: ArmConfig) -> None:
    """An arm's ``tune_on`` (public pre-tuning, :mod:`sweeper.sweeps.tuning`): the grid it
    centres must be known when the sweep is planned. The dataset itself is checked where it is
    resolved (:func:`sweeper.datasets.resolution.resolve`)."""
    name = getattr(arm, "tune_on", None)
    if name is None:
        return
    field = f"arms.{arm.label}.tune_on"
    if spec.search.method == "tpe":
        raise ConfigError(
            f"arm {arm.label!r} tunes on {name!r}, but search method tpe proposes its points "
            "during the run, so there is no grid to centre when the sweep is planned; use "
            "search method grid or random with tune_on",
            field=field,
        )
    if not arm.grid:
        raise ConfigError(
            f"arm {arm.label!r} tunes on {name!r} but has no grid to centre; give it a grid "
            "(e.g. lr: {logspace: [-2, 0], k: 3}) or leave tune_on out",
            field=field,
        )
    if _rows_per_unit_field(arm) is not None:
        # The public records have no units: a rows_per_unit point could not be tried there.
        raise ConfigError(
            f"arm {arm.label!r} tunes on {name!r}, whose records have no privacy unit, but "
            f"sets {ROWS_PER_UNIT_AXIS}; set training.{ROWS_PER_UNIT_AXIS} instead, or leave "
            "tune_on out",
            field=field,
        )


def check_arm(arm: ArmConfig) -> None:
    """One arm names a known private strategy, a learning rate, and valid hyperparameters.

    Torch-free: only the strategies' descriptors are read. Every value a trial may get is
    checked (type, finiteness, range, choices), with the same
    :meth:`~workers.strategies.StrategyDescriptor.validate` the worker runs: every grid point
    merged over the arm's params, and for a ``logspace``/``linspace`` axis also both ends of
    its interval (random and tpe search draw anywhere between them). A grid centred by public
    pre-tuning is checked again with it (:func:`sweeper.sweeps.tuning.centred_arm`).

    Raises:
        ConfigError: naming ``arms.<label>.<field>``.
    """
    field = f"arms.{arm.label}"
    try:
        strategy = get_descriptor(arm.strategy)
    except ConfigError as exc:
        raise ConfigError(str(exc), field=f"{field}.strategy") from None
    if "lr" not in arm.grid and "lr" not in arm.params:
        raise ConfigError(
            f"arm {arm.label!r} has no learning rate: add lr to its grid "
            "(e.g. lr: {logspace: [-2, 0], k: 3}) or to its params",
            field=f"{field}.grid.lr",
        )
    # lr is the optimizer's, lora_r the model's (_check_lora), rows_per_unit the unit
    # bounding's (_check_rows_per_unit): none is the strategy's.
    names = (set(arm.grid) | set(arm.params)) - set(_NOT_THE_STRATEGYS)
    unknown = names - set(strategy.hyperparameters)
    if unknown:
        raise ConfigError(
            f"arm {arm.label!r}: unknown hyperparameter(s) {sorted(unknown)} for strategy "
            f"{arm.strategy!r}; allowed: {sorted(strategy.hyperparameters) or 'none'}",
            field=f"{field}.params.{sorted(unknown)[0]}",
        )
    if not strategy.private:
        raise ConfigError(
            f"arm {arm.label!r}: strategy {arm.strategy!r} is not private; a sweep spends "
            "privacy budget and runs private strategies only",
            field=f"{field}.strategy",
        )
    _check_arm_values(arm, strategy)


def _axis_values(axis: Any) -> list[Any]:
    """What a grid axis may give a trial: its points, and an interval's two ends."""
    if isinstance(axis, Axis):
        lo, hi = axis.logspace if axis.logspace is not None else axis.linspace  # type: ignore[misc]
        ends = [10.0**lo, 10.0**hi] if axis.logspace is not None else [lo, hi]
        return [*axis.values(), *ends]
    return list(axis)


def _check_lr(arm: ArmConfig, value: Any, where: str) -> None:
    """A learning rate is a finite number > 0 (a numeric string, as YAML reads 1e-3, too)."""
    try:
        lr = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError, OverflowError):
        lr = math.nan
    if not math.isfinite(lr) or lr <= 0:
        raise ConfigError(
            f"arm {arm.label!r}: lr must be a finite number > 0; got {value!r}", field=where
        )


def _check_arm_values(arm: ArmConfig, strategy: Any) -> None:
    """Validate every value an arm's trials may get (see :func:`_check_arms`)."""
    base = f"arms.{arm.label}"
    if "lr" in arm.grid:  # a grid axis overrides a param of the same name
        for v in _axis_values(arm.grid["lr"]):
            _check_lr(arm, v, f"{base}.grid.lr")
    elif "lr" in arm.params:
        _check_lr(arm, arm.params["lr"], f"{base}.params.lr")
    own = _NOT_THE_STRATEGYS  # (see check_arm)
    params = {k: v for k, v in arm.params.items() if k not in own}
    axes = {k: v for k, v in arm.grid.items() if k not in own}

    def check(values: dict[str, Any]) -> None:
        try:
            strategy.validate(values)
        except ConfigError as exc:
            name = (exc.field or "").removeprefix("params.")
            where = f"{base}.grid.{name}" if name in axes else f"{base}.params.{name}"
            raise ConfigError(f"arm {arm.label!r}: {exc}", field=where) from None

    # The defaults and the fixed params (a grid axis overrides a param of the same name).
    check({k: v for k, v in params.items() if k not in axes})
    seen: set[str] = set()
    for point in arm.points():
        values = {**params, **{k: v for k, v in point.items() if k not in own}}
        key = repr(sorted(values.items(), key=lambda kv: kv[0]))
        if key not in seen:
            seen.add(key)
            check(values)
    # Random and tpe search draw anywhere in an interval axis: both its ends must be valid
    # too (the ranges are intervals, so every value between them then is).
    for name, axis in axes.items():
        if isinstance(axis, Axis):
            for v in _axis_values(axis):
                check({**params, name: v})
