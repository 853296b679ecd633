"""One path for one-off runs: ``dpsweep train`` and a canary audit of new settings.

A one-off run is a sweep of one arm and one grid point (or, for an audit, K learning rates):
:class:`SingleRun` says what is asked, :func:`one_arm_spec` writes it as the typed spec a sweep
would submit, and :func:`prepare_single_run` takes it through a sweep's own steps, in a
sweep's order, before anything is charged:

1. the names and options, each checked by its registry's torch-free descriptor
   (:func:`check_single_run`);
2. admission (:func:`sweeper.sweeps.admission.admit`: who may read the dataset, and the owner's
   view of a stored one) and resolution (:func:`sweeper.datasets.resolution.resolve`);
3. the data's privacy unit (:func:`sweeper.sweeps.checks.check_units_on_data`) and the model
   on the loaded data (:func:`workers.model_check.check_model`), the planner's checks;
4. q and T (:func:`workers.schedule.plan_steps`; with a privacy unit, in units), delta below
   1/N (:func:`sweeper.privacy.limits.check_delta_below_one_over_n`), and sigma, given or
   calibrated by the one calibrator;
5. the worker's pack (:func:`workers.training.specs.training_pack`), with the
   :class:`workers.plan_check.PlannedRun` the worker enforces: it refuses to train anything
   but what the charge covers.

Every refusal is a :class:`~dpsweep.errors.ConfigError` naming the request's field
(``delta``, ``model_options``, ``params.clip``, ...): the CLI turns it into its flag, the API
into a 422. Charging the run is :mod:`sweeper.runs.one_off_charge`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine

from dpsweep.accounting_inputs import AccountingInputs
from dpsweep.errors import ConfigError, PermissionDenied, PrivacyError
from dpsweep.spec import (
    ArmConfig,
    DatasetConfig,
    ModelConfig,
    PrivacyConfig,
    SweepSpec,
    TrainingConfig,
)
from sweeper.datasets.access import Viewer
from sweeper.datasets.names import in_catalog
from sweeper.privacy.limits import check_delta_below_one_over_n


@dataclass(frozen=True)
class SingleRun:
    """A one-off run as asked for, before any check.

    Args:
        dataset: The dataset section (a loader name with its file, a registered name or an
            upload; the split settings given, the rest the owner's).
        model: The model section.
        training: The training section (steps or epochs, batch size, optimizer, evaluation).
        strategy: The clipping strategy's registry name.
        params: The strategy's hyperparameters.
        accountant: The worker accountant of the run's epsilon (and its calibration).
        delta: The delta the run's epsilon is stated at.
        epsilon: Calibrate sigma to this epsilon (private strategies: this or
            ``noise_multiplier``).
        noise_multiplier: Use this sigma.
        lrs: One trial per learning rate.
        seed: The first trial's public seed (the others count up).
        reproducible: Draw noise and batches from the public seeds (the owner's labelled
            mode; an analyst is refused at admission).
        sample_rate: Ask for q itself (the batch size is then ``round(q N)``); ``None``: the
            training section's batch size.
    """

    dataset: DatasetConfig
    model: ModelConfig
    training: TrainingConfig
    strategy: str
    accountant: str
    delta: float
    lrs: tuple[float, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    epsilon: float | None = None
    noise_multiplier: float | None = None
    seed: int = 0
    reproducible: bool = False
    sample_rate: float | None = None


@dataclass(frozen=True)
class DataView:
    """How a caller sees the loaded data (an audit appends canaries; ``dpsweep train`` reads
    it as it is): ``train`` is what the worker receives, ``planning`` what q is counted on."""

    train: Callable[[Any], Any] = lambda data: data
    planning: Callable[[Any], Any] = lambda data: data


@dataclass(frozen=True)
class PreparedRun:
    """A one-off run checked and planned: nothing charged, nothing trained yet."""

    run: SingleRun
    spec: SweepSpec  # the admitted one-arm spec (the owner's view of a stored dataset)
    params: dict[str, Any]  # the strategy's validated hyperparameters
    dataset: Any  # workers.datasets.records.DatasetSpec
    data: Any  # workers.datasets.records.Dataset, as the worker receives it
    stored: bool  # a registered name or an upload (charged on the ledger bound at its upload)
    sample_rate: float
    steps: int
    noise_multiplier: float | None  # None: a non-private run
    pack: Any  # workers.training.specs.PackSpec
    # What one unit of the run's epsilon protects: ``example`` (a row) or the data's unit (a
    # person: q, T and delta's bound then count units, and the ledger is charged per unit).
    privacy_unit: str = "example"

    @property
    def private(self) -> bool:
        """Whether the run adds noise (it has an epsilon)."""
        return self.noise_multiplier is not None

    def inputs(self, *, trials: int = 1) -> AccountingInputs:
        """The run's accounting inputs (``trials``: K trials composed, as an audit's claim)."""
        return run_inputs(
            self.run,
            sample_rate=self.sample_rate,
            steps=self.steps * trials,
            noise_multiplier=self.noise_multiplier,
        )


def _first_error(exc: ValidationError) -> ConfigError:
    """A pydantic error as a ConfigError naming the request's field: a one-off run's request
    is flat (``training.steps`` is ``steps``, ``privacy.budgets`` is ``epsilon``)."""
    first = exc.errors()[0]
    parts = [str(p) for p in first["loc"] if isinstance(p, str)]
    if parts[:2] == ["privacy", "budgets"]:
        name: str | None = "epsilon"
    elif parts[:2] == ["model", "options"]:
        name = "model_options"
    else:
        name = parts[-1] if parts else None
    return ConfigError(f"{name}: {first['msg']}" if name else first["msg"], field=name)


def check_single_run(run: SingleRun, *, require_private: bool = False) -> dict[str, Any]:
    """Check every registry name and option of ``run``, before any data is read.

    Args:
        run: The run asked for.
        require_private: Refuse a non-private strategy (an audit has no epsilon to audit).

    Returns:
        The strategy's validated hyperparameters.

    Raises:
        ConfigError: an unknown name, an option out of range, or the wrong noise settings,
            naming the request's field.
    """
    # These load the torch side of the registries, and the API imports this module.
    from workers.models import get_model_descriptor, model_names  # deferred: torch side
    from workers.strategies import STRATEGIES, strategy_names  # deferred: torch classes

    for name, value, known in (
        ("model", run.model.name, model_names()),
        ("strategy", run.strategy, strategy_names()),
    ):
        if value not in known:
            raise ConfigError(
                f"unknown {name} {value!r}; choose one of: {', '.join(known)}", field=name
            )
    run_accountant(run)
    private = STRATEGIES[run.strategy].private
    if require_private and not private:
        raise ConfigError(
            f"strategy {run.strategy!r} is not private: there is no epsilon to audit",
            field="strategy",
        )
    if private and (run.epsilon is None) == (run.noise_multiplier is None):
        raise ConfigError(
            f"strategy {run.strategy!r} is private: give exactly one of epsilon or "
            "noise_multiplier",
            field="epsilon",
        )
    if not private and (run.epsilon is not None or run.noise_multiplier is not None):
        raise ConfigError(
            f"strategy {run.strategy!r} adds no noise; drop epsilon and noise_multiplier",
            field="epsilon",
        )
    try:
        params: dict[str, Any] = STRATEGIES[run.strategy].validate(dict(run.params))
    except ConfigError as exc:
        sub = exc.field.rsplit(".", 1)[-1] if exc.field else None
        raise ConfigError(str(exc), field=f"params.{sub}" if sub else "params") from None
    try:
        get_model_descriptor(run.model.name).validate(dict(run.model.options))
    except ConfigError as exc:
        raise ConfigError(str(exc), field="model_options") from None
    return params


def run_accountant(run: SingleRun) -> str:
    """The canonical name of the run's accountant: a single run's record is a worker's, so a
    legacy ``rdp``/``prv`` is Opacus's (:func:`dpsweep.accountants.resolve`, context worker).

    Raises:
        ConfigError: an unknown accountant (field ``accountant``), the canonical names listed.
    """
    from workers.accounting import worker_accountant  # deferred: the accountants' registry

    try:
        return worker_accountant(run.accountant).name
    except ConfigError as exc:
        raise ConfigError(str(exc), field="accountant") from None


def run_inputs(
    run: SingleRun, *, sample_rate: float, steps: int, noise_multiplier: float | None
) -> AccountingInputs:
    """The run's accounting inputs as one value (``noise_multiplier`` None: to calibrate)."""
    return AccountingInputs(
        noise_multiplier=noise_multiplier,
        sample_rate=sample_rate,
        steps=steps,
        delta=run.delta,
        accountant=run_accountant(run),
    )


def one_arm_spec(run: SingleRun, *, name: str, batch_size: int | None = None) -> SweepSpec:
    """``run`` as the typed spec of a one-arm sweep (what admission and resolution read).

    Raises:
        ConfigError: a section the spec's own models refuse, naming the request's field.
    """
    training = run.training
    if batch_size is not None:
        dumped = {**run.training.model_dump(exclude_unset=True), "batch_size": batch_size}
        training = _section(lambda: TrainingConfig.model_validate(dumped))
    return _section(
        lambda: SweepSpec(
            name=name,
            dataset=run.dataset,
            model=run.model,
            training=training,
            privacy=PrivacyConfig(
                budgets=[run.epsilon or 1.0], delta=run.delta, reproducible=run.reproducible
            ),
            arms=[ArmConfig(strategy=run.strategy)],
        )
    )


def _section(make: Callable[[], Any]) -> Any:
    try:
        return make()
    except ValidationError as exc:
        raise _first_error(exc) from None


def prepare_single_run(
    engine: Engine | None,
    run: SingleRun,
    viewer: Viewer,
    *,
    params: dict[str, Any],
    view: DataView | None = None,
    device: str = "cpu",
    threads: int = 1,
    name: str = "dpsweep-run",
    keep_weights: bool = False,
    checkpoints_dir: str | None = None,
    allow_paths: bool = False,
) -> PreparedRun:
    """Admit, load, check and plan ``run`` (see the module docstring), charging nothing.

    Args:
        engine: The store (``None``: local use of a loader name without a database).
        run: The run, its names already checked (:func:`check_single_run`).
        viewer: Who asks (``Viewer(None)``: local use, the owner of everything).
        params: The strategy's validated hyperparameters (:func:`check_single_run`).
        view: How the caller sees the loaded data (default: as it is).
        device: Where the worker trains.
        threads: The worker's torch threads.
        name: The one-arm spec's name (what the run is, in messages).
        keep_weights: Hand back each trial's best checkpoint (``dpsweep train -o``).
        checkpoints_dir: The registered checkpoints ``model.checkpoint`` may name (default:
            ``DPSWEEP_CHECKPOINTS_DIR``).
        allow_paths: ``model.checkpoint`` may be a path (the local command line only; fail
            closed by default). The checkpoint is resolved and its digest pinned in the run's
            spec (``model.checkpoint_digest``) before anything is charged.

    Raises:
        ConfigError: a refused setting (naming the request's field), an unknown dataset, a
            model that cannot train on the data, delta >= 1/N, or no sigma for the epsilon.
        PermissionDenied: an analyst asks for reproducible mode.
    """
    from sweeper.sweeps.checkpoints import configured_checkpoints_dir, pin_model  # deferred
    from sweeper.sweeps.checks import check_units_on_data  # deferred: sweeps sits above runs
    from workers.datasets.loading import load_dataset  # deferred: numpy
    from workers.model_check import check_model  # deferred: torch
    from workers.models import model_spec  # deferred: torch side of the registry

    view = view or DataView()
    where = configured_checkpoints_dir(checkpoints_dir)
    # The checkpoint resolved, and its digest pinned, before anything is read or charged.
    run = replace(run, model=pin_model(run.model, checkpoints_dir=where, allow_paths=allow_paths))
    spec = one_arm_spec(run, name=name)
    dataset_spec, spec = _admitted_dataset(engine, spec, viewer)
    data = view.train(load_dataset(dataset_spec))
    check_units_on_data(spec, data)  # the data's unit, as a sweep's planning checks it
    # The model on this data, as the run would build it, before anything is charged: a
    # refused model costs nothing (the same check as a sweep's planning).
    check_model(
        model_spec(run.model, checkpoints_dir=where, allow_paths=allow_paths),
        input_shape=tuple(data.input_shape),
        num_classes=int(data.num_classes),
        vocab_size=data.vocab_size,
        strategies=[run.strategy],
    )
    planning = view.planning(data)
    spec = _at_sample_rate(run, spec, planning, name=name)
    q, steps, sigma = _planned_privacy(run, spec, data, planning)
    pack = _pack(run, spec, params, dataset_spec, data, q, steps, sigma, device, threads)
    pack.model = model_spec(spec.model, checkpoints_dir=where, allow_paths=allow_paths)
    pack.keep_weights = keep_weights
    return PreparedRun(
        run=run,
        spec=spec,
        params=params,
        dataset=dataset_spec,
        data=data,
        stored=in_catalog(run.dataset.name),
        sample_rate=q,
        steps=steps,
        noise_multiplier=sigma,
        pack=pack,
        privacy_unit=str(data.privacy_unit or "example"),
    )


def _admitted_dataset(
    engine: Engine | None, spec: SweepSpec, viewer: Viewer
) -> tuple[Any, SweepSpec]:
    """The worker's dataset spec and the admitted spec: the owner's view of a stored dataset
    (loader options, declared size, split), as for a sweep; loader names pass through."""
    from sweeper.datasets.resolution import resolve  # deferred: workers' dataset registry
    from sweeper.sweeps.admission import admit  # deferred: sweeps sits above runs

    if engine is None:
        return resolve(None, spec.dataset), spec
    admission = admit(engine, spec, viewer)
    if admission.terms is not None:
        # A grant's allowance and terms bind sweeps, which an analyst submits; a one-off run
        # outside a sweep is the owner's (fail closed: no second path to spend a grant).
        raise PermissionDenied(
            f"dataset {spec.dataset.name!r} is not yours: a run outside a sweep is for a "
            "dataset's owner; submit a sweep under your grant instead"
        )
    return resolve(engine, admission.spec.dataset), admission.spec


def _at_sample_rate(run: SingleRun, spec: SweepSpec, planning: Any, *, name: str) -> SweepSpec:
    """The spec with the batch size a given sample rate asks of the planning view's records
    (the spec itself when the run gives none)."""
    if run.sample_rate is not None:
        batch_size = max(1, round(run.sample_rate * planning.planning_n_train))
        resized = one_arm_spec(run, name=name, batch_size=batch_size)
        spec = spec.model_copy(update={"training": resized.training})
    return spec


def _planned_privacy(
    run: SingleRun, spec: SweepSpec, data: Any, planning: Any
) -> tuple[float, int, float | None]:
    """q and T, delta checked below 1/N, and sigma (given or calibrated)."""
    q, steps = _planned_steps(spec.training, planning)
    # A stored dataset's size is its owner's declaration (the records' own count is private);
    # a loader's is counted.
    check_delta_below_one_over_n(run.delta, int(data.planning_n_private), field="delta")
    sigma = _noise_multiplier(run, q, steps)
    return q, steps, sigma


def _planned_steps(training: TrainingConfig, planning: Any) -> tuple[float, int]:
    from workers.schedule import plan_steps  # deferred: not for the API's import

    try:
        return plan_steps(
            n_train=planning.planning_n_train,
            batch_size=training.batch_size,
            epochs=None if training.steps is not None else training.epochs,
            steps=training.steps,
        )
    except ConfigError as exc:
        raise ConfigError(str(exc), field=_request_field(exc.field)) from None


def _noise_multiplier(run: SingleRun, q: float, steps: int) -> float | None:
    """The run's sigma: given, or calibrated to its epsilon by the one calibrator."""
    from workers.accounting import calibrate_for  # deferred: scipy

    if run.epsilon is None:
        return run.noise_multiplier
    try:
        inputs = run_inputs(run, sample_rate=q, steps=steps, noise_multiplier=None)
        return float(calibrate_for(inputs, target_epsilon=run.epsilon))
    except ConfigError as exc:
        raise ConfigError(str(exc), field="epsilon") from None
    except (PrivacyError, ArithmeticError, ValueError):
        # The accountant cannot reach this epsilon (no number of the exception is shown).
        raise ConfigError(
            "epsilon: no finite noise multiplier reaches this epsilon with these settings; "
            "choose an epsilon of a usual size",
            field="epsilon",
        ) from None


def _pack(
    run: SingleRun,
    spec: SweepSpec,
    params: dict[str, Any],
    dataset_spec: Any,
    data: Any,
    q: float,
    steps: int,
    sigma: float | None,
    device: str,
    threads: int,
) -> Any:
    from workers.plan_check import PlannedRun  # deferred: not for the API's import
    from workers.training.specs import TrialSpec, training_pack  # deferred: numpy

    trials = [
        TrialSpec(
            lr=float(lr),
            seed=run.seed + i,
            noise_multiplier=sigma,
            target_delta=run.delta,
            params=dict(params),
        )
        for i, lr in enumerate(run.lrs)
    ]
    # The run refuses to start unless it is exactly what was charged.
    planned = (
        PlannedRun(
            strategy=run.strategy,
            sample_rate=q,
            steps=steps,
            noise_multiplier=sigma,
            dataset_sha256=data.content_sha256,
        )
        if sigma is not None
        else None
    )
    return training_pack(
        model=spec.model,
        training=spec.training,
        strategy=run.strategy,
        trials=trials,
        dataset=dataset_spec,
        accountant=run_accountant(run),
        reproducible=run.reproducible,
        planned=planned,
        device=device,
        threads=threads,
        steps=steps,
    )


def _request_field(field_name: str | None) -> str | None:
    """``training.steps`` is ``steps`` in a one-off run's request."""
    return field_name.rsplit(".", 1)[-1] if field_name else None
