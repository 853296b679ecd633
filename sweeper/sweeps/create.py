"""Creating a sweep: check and plan its spec, store it with its trials, reserve its cost.

The runner (:mod:`sweeper.driver.loop`), the CLI and the API all create sweeps here. Nothing here
imports torch at import time: the spec is checked against the strategies' torch-free descriptors
and its model on the loaded data (:mod:`sweeper.sweeps.checks`; torch only for a model not
declared packed, built on the meta device) and planned by :mod:`sweeper.privacy.planner` before
anything is stored, and the whole cost is reserved on the dataset's ledger before the sweep is,
so a scheduler that picks a pending sweep up finds its reservation in place.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Engine, insert
from sqlalchemy.orm import Session

from dpsweep.plan import GridPlan, SweepPlan
from dpsweep.spec import ArmConfig, SweepSpec, load_spec
from sweeper.datasets.access import Viewer
from sweeper.datasets.fixed_view import stored_row
from sweeper.datasets.identity import bind_name, ledger_key_of
from sweeper.datasets.names import in_catalog
from sweeper.datasets.resolution import resolve, tuning_names
from sweeper.privacy.charges import ChargeSchedule, charge_schedule
from sweeper.privacy.ledger.budget_ledger import BudgetLedger
from sweeper.privacy.parallel import pmap_distinct
from sweeper.store import Sweep, SweepState, Trial, TrialState, new_id
from sweeper.sweeps import events
from sweeper.sweeps.admission import admit
from sweeper.sweeps.checkpoints import check_planned_checkpoint, pin_checkpoint
from sweeper.sweeps.checks import check_spec
from sweeper.sweeps.planning import plan_sweep
from sweeper.sweeps.quota import check_quota, configured_quota_bytes, estimate_if_limited
from sweeper.sweeps.reservation import check_before_reserving as check_before_reserving
from sweeper.sweeps.reservation import check_ledger_unit, reserve_sweep
from sweeper.sweeps.search import draw_run_count, random_point, random_points
from sweeper.sweeps.tuning import tuned_arm
from workers.datasets.loading import dataset_content_sha256


def charge_schedules(grids: Sequence[GridPlan]) -> list[ChargeSchedule]:
    """Each grid's charge schedule; grids whose accounting is the same (fixed and quantile with
    as many trials at one level) share one computation.

    The key is the whole plan except its labels and the arm's own display figures (its name,
    strategy, gradient multiplier after a noise split and count noise), none of which
    :func:`charge_schedule` reads: plans that differ in anything else are scheduled apart.
    """

    def key(grid: GridPlan) -> str:
        blank = replace(grid, arm="", strategy="", gradient_noise_multiplier=0.0, count_noise=None)
        return repr(blank)

    return [schedule for _, schedule in pmap_distinct(charge_schedule, grids, key=key)]


# The training section's keys left out of a spec's hash at these values (added after specs
# were first hashed: see spec_hash).
_TRAINING_DEFAULTS = (
    ("physical_batch_size", None),
    ("augment", None),
    ("tune_batch_scale", 1),
    ("unit_bounding", "mean"),
    ("rows_per_unit", 8),
)


def spec_hash(spec: SweepSpec) -> str:
    """A canonical hash of the spec (defaults filled in), to find a sweep to resume.

    ``resources`` (where trials run: GPU shares) and ``artifacts`` (which models are kept) are
    left out: the same sweep resumed on other hardware, or keeping other models, is the same
    sweep, and hashes stay those of specs written before they existed (so does an arm's
    ``tune_on`` left out).
    """
    data = spec.model_dump(mode="json", exclude={"resources", "artifacts"})
    # An arm's tune_on counts only when set (it centres the grid): the hash of a spec without
    # it stays what it was before the key existed, so such sweeps still resume.
    for arm in data.get("arms", ()):
        if arm.get("tune_on") is None:
            arm.pop("tune_on", None)
    # Likewise the training section's chunking, augmentation, tuning scale and unit settings
    # at their defaults (and a dataset without a declared unit).
    training = data.get("training", {})
    for key, default in _TRAINING_DEFAULTS:
        if key in training and training[key] == default:
            del training[key]
    if data.get("dataset", {}).get("privacy_unit", 0) is None:
        del data["dataset"]["privacy_unit"]
    text = json.dumps(data, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def dataset_key(spec: SweepSpec) -> str:
    """The name of the spec's dataset as users see it (``sweeps.dataset``): its name, plus
    the file for file datasets. Not the ledger's key: the ledger is keyed by the identity of
    the records (``sweeps.ledger_key``, see :mod:`sweeper.datasets`)."""
    d = spec.dataset
    return d.name if d.path is None else f"{d.name}:{d.path}"


def planning_dataset(engine: Engine | None, spec: SweepSpec) -> Any:
    """The worker spec a spec is planned with (:func:`sweeper.sweeps.planning.plan_sweep`'s
    ``dataset``): its training dataset resolved with its ``eval`` section and the public
    datasets its arms tune on (``tune_on``)."""
    return resolve(engine, spec.dataset, spec.eval, tune_on=tuning_names(spec.arms))


def _content_of(engine: Engine, spec: SweepSpec) -> str:
    """The identity of the spec's records, for plans made without it (loads the data)."""
    return dataset_content_sha256(resolve(engine, spec.dataset))


def _ledger_key(engine: Engine, spec: SweepSpec, name: str, content: str, plan: SweepPlan) -> str:
    """The ledger a sweep reserves on, its privacy unit checked against the plan's.

    A stored file (an upload or a registered name) was bound to its records when its owner
    uploaded or registered it, and no sweep re-points it: whatever a spec sets, the sweep is
    charged on that ledger (an analyst cannot reach a fresh ledger by reading the file another
    way, and the owner's budget view keeps every spend). Loader names and paths (local use
    and admins) are bound here to the records the plan read.

    Raises:
        IllegalState: the ledger is bound to another privacy unit than the plan's (nothing
            reserved).
    """
    if in_catalog(spec.dataset.name) and stored_row(engine, spec.dataset.name) is not None:
        key = ledger_key_of(engine, spec.dataset.name)
    else:
        # Bind the name to its records before reserving: a cap or spend still kept under the
        # name (from before ledgers were keyed by content) must apply to this reservation. A
        # unit count is not a number of records: a name bound at a unit keeps none.
        n_examples = None if plan.has_units else plan.n_examples
        config = spec.dataset.model_dump(mode="json")
        new_row = {"config": config, "n_examples": n_examples}
        key = bind_name(engine, name, content, new_row=new_row).ledger_key
    # One ledger, one privacy unit: a plan at another unit than the ledger's is refused before
    # anything is reserved (the reservation checks it again under the ledger's lock).
    check_ledger_unit(engine, key, plan.privacy_unit, dataset=name)
    return key


def _arm_trials(spec: SweepSpec, arm: ArmConfig, grid: GridPlan) -> list[dict[str, Any]]:
    """The trial rows of one grid: params, seed, configuration number (and, for
    papernot-steinke, the position ``number``).

    A papernot-steinke grid's rows must not encode their position j in the grid (0..K-1):
    a released ``number`` or ``config`` of 40, or a seed equal to ``j % seeds``, would bound
    the secret K. So every row gets ``number == config == 0`` and a seed drawn uniformly with
    the same CSPRNG, independently of j (each run is an independent draw of the search anyway).
    """
    seeds = spec.seeds
    method = spec.search.method
    if spec.privacy.accounting == "papernot-steinke":
        assert spec.privacy.distribution is not None
        runs = draw_run_count(spec.privacy.distribution, mean=float(grid.trials))
        rng = random.SystemRandom()
        points = arm.points() if method == "grid" else None
        rows = []
        for _ in range(runs):
            params = rng.choice(points) if points is not None else random_point(arm, rng)
            rows.append(
                {"params": dict(params), "seed": rng.randrange(seeds), "config": 0, "number": 0}
            )
        return rows
    if method == "grid":
        points = arm.points()
    elif method == "random":
        points = random_points(arm, int(spec.search.n or 0), seed=spec.search.seed)
    else:  # tpe: a configuration's params are proposed when its first seed starts
        points = [{} for _ in range(int(spec.search.n or 0))]
    return [
        {"params": dict(p), "seed": s, "config": c}
        for c, p in enumerate(points)
        for s in range(seeds)
    ]


@dataclass(frozen=True)
class PreparedSweep:
    """The CPU-heavy part of creating a sweep: its plan and each grid's charge schedule.

    Deterministic in the spec (and the dataset's size), so it may be computed elsewhere (the
    API computes it in a process pool) and cached.
    """

    plan: SweepPlan
    schedules: list[ChargeSchedule]
    # One kept model's bytes, when a quota of kept models is configured (it builds the model:
    # done here, off the API's request threads; sweeper.sweeps.quota).
    model_bytes: int | None = None


def prepare_sweep(
    spec: SweepSpec,
    *,
    dataset: Any = None,
    checkpoints_dir: str | None = None,
    allow_paths: bool = False,
) -> PreparedSweep:
    """Plan a spec and compute its charge schedules (see :class:`PreparedSweep`).

    ``checkpoints_dir`` and ``allow_paths``: where ``model.checkpoint`` is resolved, and
    whether it may be a path (the local command line only), as
    :func:`~sweeper.sweeps.planning.plan_sweep`.

    Raises:
        ConfigError: the spec is invalid, or its model cannot be trained on the data (the
            planner's one check: :func:`sweeper.sweeps.checks.check_spec` and
            :func:`~sweeper.sweeps.checks.check_model_on_data`).
        InfeasiblePlan: no usable noise multiplier fits a grid's budget.
    """
    plan = plan_sweep(
        spec, dataset=dataset, checkpoints_dir=checkpoints_dir, allow_paths=allow_paths
    )

    return PreparedSweep(
        plan,
        charge_schedules(plan.grids),
        model_bytes=estimate_if_limited(
            spec, dataset=dataset, checkpoints_dir=checkpoints_dir, allow_paths=allow_paths
        ),
    )


def create_sweep(
    engine: Engine,
    spec: SweepSpec | dict[str, Any] | str,
    *,
    owner: str | None = None,
    plan: SweepPlan | None = None,
    prepared: PreparedSweep | None = None,
    artifact_quota_mb: float | None = None,
    checkpoints_dir: str | None = None,
    allow_paths: bool = False,
) -> str:
    """Plan a spec, store the sweep and its trials, and reserve its whole cost.

    Refuses (before anything is stored) specs that cannot run honestly: infeasible plans,
    and ``charge_repeats: false`` with several seeds (every seed touches the data here).

    ``artifact_quota_mb``: the tenant's quota of kept models (default: the settings',
    ``DPSWEEP_ARTIFACT_QUOTA_MB``). ``checkpoints_dir``: the registered checkpoints
    ``model.checkpoint`` may name (default: ``DPSWEEP_CHECKPOINTS_DIR``); ``allow_paths``: it
    may also be a path (the local command line only). The checkpoint's digest is pinned in the
    stored spec (``model.checkpoint_digest``) before anything is reserved
    (:func:`sweeper.sweeps.checkpoints.pin_checkpoint`).

    Returns:
        The new sweep's id.

    Raises:
        ConfigError: the spec is invalid.
        InfeasiblePlan: no usable noise multiplier fits a grid's budget.
        QuotaExceeded: the models it keeps could exceed the tenant's quota (nothing is stored).
        BudgetExhausted: the dataset's lifetime cap cannot cover the sweep (nothing is stored).
    """
    spec, terms, prepared = _admitted_and_prepared(
        engine,
        spec,
        owner,
        plan=plan,
        prepared=prepared,
        checkpoints_dir=checkpoints_dir,
        allow_paths=allow_paths,
    )
    plan = prepared.plan

    # Before anything is stored or reserved: the models it keeps must fit the tenant's quota.
    check_quota(
        engine,
        owner,
        spec,
        configured_quota_bytes(artifact_quota_mb),
        model_bytes=prepared.model_bytes,
        checkpoints_dir=checkpoints_dir,
        allow_paths=allow_paths,
    )
    # An analyst's sweep (a grant on someone else's dataset) is bound by the grant: the
    # evaluation modes its owner allows (checked at admission), and its ε allowance (checked
    # with the reservation). The ledger is keyed by the records, not by the name: the same
    # records under any name, path or format share one lifetime budget.
    content = plan.dataset_sha256 or _content_of(engine, spec)
    stored, trials = _grids_and_trials(spec, prepared, content)
    sweep = Sweep(
        id=new_id(),
        name=spec.name,
        dataset=dataset_key(spec),
        spec=spec.model_dump(mode="json"),
        state=SweepState.pending,
        owner=owner,
        spec_hash=spec_hash(spec),
        plan=SweepPlan(stored).to_stored(),
    )
    for trial in trials:
        trial["sweep_id"] = sweep.id
    sweep.ledger_key = _ledger_key(engine, spec, sweep.dataset, content, plan)
    # Reserve first, store second: a scheduler may pick a stored pending sweep up at once, and
    # must find its whole reservation in place. A refused reservation stores nothing.
    sweep_id = str(sweep.id)  # read before the store's commit expires the object
    reserve_sweep(engine, spec, sweep, prepared, terms=terms, grids=len(stored))
    _store(engine, sweep, trials)
    return sweep_id


def _admitted_and_prepared(
    engine: Engine,
    spec: SweepSpec | dict[str, Any] | str,
    owner: str | None,
    *,
    plan: SweepPlan | None,
    prepared: PreparedSweep | None,
    checkpoints_dir: str | None,
    allow_paths: bool,
) -> tuple[SweepSpec, Any, PreparedSweep]:
    """The spec as admitted (checked, its checkpoint pinned), the grant's terms, and its plan
    and charge schedules (the given ones, or planned here): nothing is stored or reserved."""
    if not isinstance(spec, SweepSpec):
        spec = load_spec(spec)

    # The same admission as a dry run's (the API has run it already; it is idempotent): an
    # analyst's terms and the owner's view of a stored dataset, before anything is planned.
    admission = admit(engine, spec, Viewer(owner))
    spec, terms = admission.spec, admission.terms
    check_spec(spec)
    # The checkpoint resolved and its digest pinned in the spec that is stored: the sweep
    # names exactly the weights it starts from (a given digest that differs is refused here).
    spec = pin_checkpoint(spec, checkpoints_dir=checkpoints_dir, allow_paths=allow_paths)
    if prepared is None:
        if plan is None:
            # Loader names pass through; uploads, registered names, a public evaluation
            # dataset and the public datasets arms tune on are looked up in the catalog.
            plan = plan_sweep(
                spec,
                dataset=planning_dataset(engine, spec),
                checkpoints_dir=checkpoints_dir,
                allow_paths=allow_paths,
            )
        prepared = PreparedSweep(plan, charge_schedules(plan.grids))
    check_planned_checkpoint(spec, prepared.plan)
    return spec, terms, prepared


def _grids_and_trials(
    spec: SweepSpec, prepared: PreparedSweep, content: str
) -> tuple[list[GridPlan], list[dict[str, Any]]]:
    """Each grid's plan as stored, and every trial's row (plain rows, inserted in one
    executemany: a 10,000-trial grid's ORM objects and their unit of work took longer than its
    plan, issue 41)."""
    arms = {a.label: a for a in spec.arms}
    trials: list[dict[str, Any]] = []
    stored: list[GridPlan] = []
    for g, sched in zip(prepared.plan.grids, prepared.schedules, strict=True):
        # A grid tuned on public records creates its trials from its centred grid (its size,
        # and so its plan, is the spec's).
        arm = tuned_arm(arms[g.arm], g.tuned_grid)
        rows = _arm_trials(spec, arm, g)
        # Trials check that they train on these records (what the reservation covers).
        stored.append(
            g.stored(planned_trials=len(rows), charges=sched.to_json(), dataset_sha256=content)
        )
        trials.extend(
            {
                "id": new_id(),
                "arm": arm.label,
                "strategy": arm.strategy,
                "epsilon_budget": g.epsilon_budget,
                "params": row["params"],
                "seed": int(row["seed"]),
                # Grid order, except for papernot-steinke rows (always 0, see _arm_trials).
                "number": int(row.get("number", position)),
                "config": int(row["config"]),
                "noise_multiplier": g.noise_multiplier,
                "target_delta": g.delta_per_trial,
                "state": TrialState.pending,
            }
            for position, row in enumerate(rows)
        )
    return stored, trials


def _store(engine: Engine, sweep: Sweep, trials: list[dict[str, Any]]) -> None:
    """Store the sweep and its trials in one transaction, its reservation already made (it goes
    back if the store fails)."""
    key, sweep_id = str(sweep.ledger_key), sweep.id
    try:
        with Session(engine) as session, session.begin():
            session.add(sweep)
            session.flush()
            # In the sweep's transaction: a scheduler sees the sweep with all its trials or not
            # at all. Core's insert fills the rows' other defaults (created_at, attempts).
            if trials:
                session.execute(insert(Trial), trials)
            events.emit(session, sweep_id, events.SWEEP, {"state": "pending"})
    except BaseException:
        BudgetLedger(engine).release(key, sweep_id=sweep_id, note="sweep could not be stored")
        raise
