"""Everything an audit settles before anything trains: who may run it, the pack, sigma, q, T,
the claimed epsilon, and whether (and on which ledger) it is charged.

An audit of new settings takes the one path of one-off runs (:mod:`sweeper.runs.single_run`,
as ``dpsweep train`` does: the spec's typed sections, admission and resolution of the
dataset, the model check, q and T, the one calibrator and the worker's pack), with the audit's
view of the data (its canaries). An audit of a finished trial rebuilds that trial's pack from
its stored plan (:func:`~sweeper.driver.packs.pack_spec`, as the sweep trained it).

**Who.** An audit reads its dataset's records more closely than any release does (its canary
scores), so only the dataset's owner (or an admin, or local use) may audit a private dataset;
an analyst holding a grant is refused (PermissionDenied, 403). A built-in set (``digits``,
``synthetic``, ...) or a registered name declared public is anyone's to audit, and spends no
budget; only then may the white-box adversary know the other records (``public_data``).

**What it costs.** On a private dataset the claimed epsilon (the K trials' T steps each,
composed) is charged like a ``dpsweep train`` run, computed here from sigma, q, T and K: the
reservation is made before training starts (:func:`sweeper.audits.service.charge_audit`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from dpsweep.accountants import DEFAULT_RUN_ACCOUNTANT
from dpsweep.accounting_inputs import AccountingInputs
from dpsweep.audit import DEFAULT_DATASET, AuditRequest
from dpsweep.errors import ConfigError, NotFound, PermissionDenied, PrivacyError, TrialNotFound
from dpsweep.plan import SweepPlan
from dpsweep.spec import DatasetConfig, ModelConfig, SweepSpec, TrainingConfig
from sweeper.datasets.access import Viewer, check_access
from sweeper.datasets.grants import has_active_grant
from sweeper.datasets.identity import ledger_key_of
from sweeper.datasets.names import BUILTIN, in_catalog, unknown_dataset
from sweeper.datasets.resolution import is_public, resolve
from sweeper.driver.packs import pack_spec
from sweeper.runs.single_run import DataView, SingleRun, check_single_run, prepare_single_run
from sweeper.store import Dataset, Sweep, Trial, TrialState
from sweeper.sweeps.stored import grid_key, typed_spec
from sweeper.sweeps.sweep_pages import sweep_head
from workers.accounting import epsilon_for, worker_accountant
from workers.accounting.registry import trial_accountant_for_plan
from workers.datasets.loading import load_dataset
from workers.plan_check import PlannedRun
from workers.schedule import plan_steps

#: ``dpsweep train``'s defaults, for an audit that leaves them out.
DEFAULT_MODEL = "mlp"
DEFAULT_STRATEGY = "fixed"
DEFAULT_DELTA = 1e-5
DEFAULT_STEPS = 100
DEFAULT_BATCH_SIZE = 64
DEFAULT_LR = 0.5
DEFAULT_ACCOUNTANT = DEFAULT_RUN_ACCOUNTANT


@dataclass(frozen=True)
class PreparedAudit:
    """An audit ready to charge and run (nothing trained, nothing charged yet)."""

    request: AuditRequest
    dataset: str
    sweep_id: str | None
    trial_id: str | None
    pack: Any  # workers.training.specs.PackSpec
    data: Any  # workers.datasets.records.Dataset, as run_audit receives it
    public: bool
    # The ledger the charge goes to (None: public data, or a name bound when charged).
    ledger_key: str | None
    content_sha256: str
    sample_rate: float
    steps: int
    noise_multiplier: float
    delta: float
    accountant: str
    epsilon_claimed: float
    # What the claim (and the charge) protects: ``example`` (a row) or the data's unit (the
    # audit is then per unit; the ledger refuses a charge at another unit than its own).
    privacy_unit: str = "example"

    @property
    def trials(self) -> int:
        return len(self.pack.trials)


def _typed(make: Any, prefix: str = "") -> Any:
    """Build a pydantic section; its first error as a ConfigError naming the request field."""
    try:
        return make()
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        field = f"{prefix}{loc}" if prefix else loc
        raise ConfigError(f"{field}: {first['msg']}", field=field or None) from None


def check_owner(engine: Engine, name: str, viewer: Viewer, *, field: str = "dataset") -> None:
    """Refuse an audit of ``name`` by anyone but its owner (an admin, or local use).

    Raises:
        PermissionDenied: an analyst with an active grant on the dataset.
        ConfigError: a dataset the viewer does not see at all (as for a sweep: unknown).
    """
    if not in_catalog(name):
        try:
            check_access(engine, {"name": name}, viewer)
        except ConfigError as exc:
            raise ConfigError(str(exc), field=field) from None
        return
    with Session(engine) as session:
        row = session.execute(select(Dataset.id, Dataset.owner).where(Dataset.name == name)).first()
    if row is None:
        raise ConfigError(unknown_dataset(name), field=field)
    if viewer.sees(row.owner):
        return
    if viewer.owner is not None and has_active_grant(engine, name, viewer.owner):
        raise PermissionDenied(
            f"audits of dataset {name!r} are for its owner only: an audit scores canaries "
            "beside the records, which no analyst's grant covers"
        )
    raise ConfigError(unknown_dataset(name), field=field)


def is_public_dataset(engine: Engine, name: str) -> bool:
    """Whether ``name`` reads public records: a shared set bundled with dpsweep or a plug-in
    (``digits``, ``synthetic``, ...), or a registered name its owner declared public."""
    return name in BUILTIN or is_public(engine, name)


def _audit_data(data: Any, request: AuditRequest) -> Any:
    """The data as the audit receives it. Black-box: with a declared size (the count, where
    none is declared; with a privacy unit, the declared number of units), so that q stays the
    planned one whichever canaries are appended
    (:func:`workers.canary_audit.inputs.with_input_canaries` adds their expected number)."""
    if request.setting != "black-box":
        return data
    if data.has_units:
        if data.declared_units is not None:
            return data
        return dataclasses.replace(data, declared_units=int(data.planning_n_private))
    if data.declared_size is not None:
        return data
    return dataclasses.replace(data, declared_size=int(data.planning_n_private))


def _planning_view(data: Any, request: AuditRequest) -> Any:
    """The data as the worker will count it for q (black-box: with the canaries' expected
    number added to the declared size, or units, as the worker does)."""
    if request.setting != "black-box":
        return data
    if data.has_units:
        return dataclasses.replace(data, declared_units=data.declared_units + request.canaries // 2)
    return dataclasses.replace(data, declared_size=data.declared_size + request.canaries // 2)


def prepare_audit(
    engine: Engine,
    request: AuditRequest,
    viewer: Viewer,
    *,
    device: str = "cpu",
    threads: int = 1,
) -> PreparedAudit:
    """Check ``request`` and settle the audit's run, before anything is charged or trained.

    Raises:
        ConfigError: a bad setting (naming the request's field).
        PermissionDenied: an analyst asks to audit a dataset they were granted.
        TrialNotFound: ``trial`` is not one the viewer sees.
    """
    request.check()
    if request.trial is not None:
        return _prepare_trial(engine, request, viewer, device=device, threads=threads)
    return _prepare_run(engine, request, viewer, device=device, threads=threads)


def _prepare_run(
    engine: Engine, request: AuditRequest, viewer: Viewer, *, device: str, threads: int
) -> PreparedAudit:
    """An audit of new settings: the one path of one-off runs
    (:mod:`sweeper.runs.single_run`, as ``dpsweep train``), with the audit's view of the
    data (its canaries), for the dataset's owner only."""
    name = request.dataset or DEFAULT_DATASET
    check_owner(engine, name, viewer)
    run = _single_run(request, name)
    params = check_single_run(run, require_private=True)
    view = DataView(
        train=lambda data: _audit_data(data, request),
        planning=lambda data: _planning_view(data, request),
    )
    prepared = prepare_single_run(
        engine, run, viewer, params=params, view=view, device=device, threads=threads,
        name="dpsweep-audit",
    )  # fmt: skip
    return _finish(
        engine,
        request,
        name=name,
        sweep_id=None,
        trial_id=None,
        pack=prepared.pack,
        data=prepared.data,
        # check_single_run(require_private=True): a noise multiplier, which the value checks.
        inputs=prepared.inputs(),
    )


def _single_run(request: AuditRequest, name: str) -> SingleRun:
    """The request as the single-run service's, ``dpsweep train``'s defaults where it leaves
    a setting out; a section the spec's models refuse names the request's field."""
    model_name = request.model or DEFAULT_MODEL
    model = _typed(lambda: ModelConfig(name=model_name, options=dict(request.model_options)))
    units: dict[str, Any] = {
        k: v
        for k, v in (
            ("unit_bounding", request.unit_bounding),
            ("rows_per_unit", request.rows_per_unit),
        )
        if v is not None
    }
    training = _typed(
        lambda: TrainingConfig(
            steps=request.steps or DEFAULT_STEPS,
            batch_size=request.batch_size or DEFAULT_BATCH_SIZE,
            **units,
        )
    )
    return SingleRun(
        dataset=_typed(lambda: DatasetConfig(name=name), prefix="dataset."),
        model=model,
        training=training,
        strategy=request.strategy or DEFAULT_STRATEGY,
        params=dict(request.params),
        accountant=request.accountant or DEFAULT_ACCOUNTANT,
        delta=DEFAULT_DELTA if request.delta is None else request.delta,
        # request.check(): exactly one of the two.
        epsilon=request.epsilon if request.noise_multiplier is None else None,
        noise_multiplier=request.noise_multiplier,
        lrs=tuple(float(lr) for lr in request.lrs or [DEFAULT_LR]),
        seed=request.seed,
        sample_rate=request.sample_rate,
    )


def _prepare_trial(
    engine: Engine, request: AuditRequest, viewer: Viewer, *, device: str, threads: int
) -> PreparedAudit:
    """An audit of a finished trial: its pack rebuilt from its stored plan (as the sweep
    trained it), for the dataset's owner only."""
    trial_id = str(request.trial)
    trial, sweep = _visible_trial(engine, trial_id, viewer)
    spec, sigma = _auditable(trial, sweep, trial_id)
    key = grid_key(trial.arm, trial.epsilon_budget)
    grid = next((g for g in SweepPlan.from_stored(sweep.plan) if g.grid == key), None)
    if grid is None:
        raise ConfigError(f"trial {trial_id!r} has no stored plan", field="trial")
    accountant = trial_accountant_for_plan(grid.accountant)
    steps = grid.steps_per_trial
    training = spec.training.model_copy(update={"steps": steps})
    spec = spec.model_copy(update={"training": training})
    dataset_spec = resolve(engine, spec.dataset)
    data = _audit_data(load_dataset(dataset_spec), request)
    view = _planning_view(data, request)
    q, steps = _field_errors(
        lambda: plan_steps(
            n_train=view.planning_n_train,
            batch_size=training.batch_size,
            epochs=None,
            steps=steps,
        ),
        field="trial",
    )
    delta = float(trial.target_delta or spec.privacy.delta)
    pack = pack_spec(
        spec,
        [trial],
        dataset=dataset_spec,
        accountant=accountant,
        planned=_planned(trial.strategy, q, steps, sigma, data),
        device=device,
        threads=threads,
    )
    return _finish(
        engine,
        request,
        name=sweep.dataset,
        sweep_id=sweep.id,
        trial_id=trial.id,
        pack=pack,
        data=data,
        inputs=AccountingInputs(
            noise_multiplier=sigma,
            sample_rate=q,
            steps=steps,
            delta=delta,
            accountant=worker_accountant(accountant).name,
        ),
    )


def _visible_trial(engine: Engine, trial_id: str, viewer: Viewer) -> tuple[Trial, Sweep]:
    """The trial and its sweep (detached), if the viewer sees the sweep and owns its dataset.

    Raises:
        TrialNotFound: no such trial, or one in a sweep the viewer does not see.
        PermissionDenied, ConfigError: :func:`check_owner`'s refusals (naming ``trial``).
    """
    with Session(engine) as session:
        trial = session.get(Trial, trial_id)
        sweep = session.get(Sweep, trial.sweep_id) if trial is not None else None
        if trial is not None:
            session.expunge(trial)
        if sweep is not None:
            session.expunge(sweep)
    if trial is None or sweep is None:
        raise TrialNotFound(f"no trial {trial_id!r}")
    try:
        sweep_head(engine, sweep.id, viewer)
    except NotFound:
        raise TrialNotFound(f"no trial {trial_id!r}") from None
    check_owner(engine, sweep.dataset, viewer, field="trial")
    return trial, sweep


def _auditable(trial: Trial, sweep: Sweep, trial_id: str) -> tuple[SweepSpec, float]:
    """The sweep's typed spec and the trial's noise multiplier, once the trial is one the
    canary audit can audit: finished, private, and training every parameter of a model built
    from random weights."""
    if trial.state != TrialState.done:
        raise ConfigError(
            f"trial {trial_id!r} is {trial.state.value}: only a finished trial's configuration "
            "is audited",
            field="trial",
        )
    if trial.noise_multiplier is None:
        raise ConfigError(
            f"trial {trial_id!r} is not private: there is no epsilon to audit", field="trial"
        )
    spec = typed_spec(sweep)
    if spec.model.checkpoint is not None or spec.model.trainable != "all":
        # The canary audit trains every parameter of a model built from random weights; one
        # that starts from a checkpoint or freezes parameters is not audited (yet): refused
        # here, before anything is charged.
        raise ConfigError(
            f"trial {trial_id!r} fine-tunes a checkpoint or trains only part of its model "
            f"(trainable: {spec.model.trainable}); the canary audit does not audit such "
            "trials yet",
            field="trial",
        )
    return spec, float(trial.noise_multiplier)


def _planned(strategy: str, q: float, steps: int, sigma: float, data: Any) -> Any:
    """The run the charge covers: the worker refuses to train anything else."""
    return PlannedRun(
        strategy=strategy,
        sample_rate=q,
        steps=steps,
        noise_multiplier=sigma,
        dataset_sha256=data.content_sha256,
    )


def _field_errors(call: Any, *, field: str | None = None) -> Any:
    """``call()``, its ConfigError re-raised with the request's field (``training.steps`` is
    ``steps`` here)."""
    try:
        return call()
    except ConfigError as exc:
        name = field or (exc.field.rsplit(".", 1)[-1] if exc.field else None)
        raise ConfigError(str(exc), field=name) from None
    except (PrivacyError, ArithmeticError, ValueError):
        # The accountant cannot reach or compute an epsilon for these values (no number of
        # the exception is shown: the fields are the request's own).
        raise ConfigError(
            f"{field or 'request'}: no finite epsilon can be calibrated or computed for these "
            "settings; choose a noise multiplier or epsilon of a usual size",
            field=field,
        ) from None


def _finish(
    engine: Engine,
    request: AuditRequest,
    *,
    name: str,
    sweep_id: str | None,
    trial_id: str | None,
    pack: Any,
    data: Any,
    inputs: AccountingInputs,
) -> PreparedAudit:
    """Check the pack for the audit's canaries and settle its claim: the K trials' T steps
    each (``inputs`` is one trial's), composed."""
    # deferred: workers.canary_audit.run imports torch, and the API imports this module
    from workers.canary_audit.run import check_audit_pack

    check_audit_pack(pack, setting=request.setting, canaries=request.canaries)
    field = "trial" if trial_id is not None else "noise_multiplier"
    # What the K trials' T steps each release, composed: the audit's claim and its charge.
    composed = dataclasses.replace(inputs, steps=inputs.steps * len(pack.trials))
    claimed = _field_errors(lambda: epsilon_for(composed), field=field)
    if not math.isfinite(claimed):
        raise ConfigError(
            "the claimed epsilon of these settings is not finite: there is nothing to audit",
            field=field,
        )
    public = is_public_dataset(engine, name)
    return PreparedAudit(
        request=request,
        dataset=name,
        sweep_id=sweep_id,
        trial_id=trial_id,
        pack=pack,
        data=data,
        public=public,
        ledger_key=None if public or not in_catalog(name) else ledger_key_of(engine, name),
        content_sha256=str(data.content_sha256),
        sample_rate=inputs.sample_rate,
        steps=inputs.steps,
        noise_multiplier=inputs.sigma,
        delta=inputs.delta,
        accountant=inputs.accountant,
        epsilon_claimed=float(claimed),
        privacy_unit=str(data.privacy_unit or "example"),
    )
