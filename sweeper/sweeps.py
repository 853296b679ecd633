"""Sweeps in the store: create (plan, trials, reservation), read, cancel, release.

The database is the single source of truth for a sweep's state; the runner
(:mod:`sweeper.runner`), the CLI and the API all go through these functions. Nothing here
imports torch.

What may be *released* is decided here too: a papernot-steinke grid releases only its
selected trial (the best by the objective), and never its number of runs.

**Papernot-Steinke secrecy.** The guarantee of a papernot-steinke grid (Papernot & Steinke
2022) holds only while its number of runs K stays secret: nothing a user sees may depend on K
except through the one released trial. So, for such grids:

* every trial row has ``number == config == 0`` and a seed drawn independently of its position
  (the run index j would bound K from below);
* the released trial carries no timestamps and no durations (its start relative to the
  sweep's would tell how many runs went before it; its ``train_seconds`` and step time are its
  pack's, and packs grow with the number of runs);
* counts (summaries, cancel responses, progress) leave the grid's trials out;
* a grid releases its selected trial only if its search *completed*: every run reached a
  terminal state without a cancel. A cancel cuts K down to the K' runs that happened to finish
  first, a number chosen by the user's timing, which the analysis does not cover; such a grid
  stays charged in full (its first run paid for the whole search) and releases nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, func, select, update
from sqlalchemy.orm import Session, selectinload

from dpsweep.errors import IllegalState, SweepNotFound
from sweeper import events
from sweeper.charges import ChargeSchedule, charge_schedule, exact_sum
from sweeper.ledger import BudgetExhausted, BudgetLedger, EntryKind, LedgerEntry
from sweeper.planner import SweepPlan, plan_sweep
from sweeper.releases import (
    evaluation_statement,
    grid_releases,
    lifetime_release,
    sweep_release,
)
from sweeper.results import ArmLevelResult, best_per_arm_level, calibration_front, epsilon_front
from sweeper.search import draw_run_count, random_point, random_points
from sweeper.spec import ArmConfig, Axis, SweepSpec, load_spec, randomness_label
from sweeper.store import (
    Sweep,
    SweepState,
    Trial,
    TrialResultRow,
    TrialState,
    iso,
    new_id,
    sweep_ledger_key,
)
from workers.errors import ConfigError
from workers.randomness import REPRODUCIBLE_WARNING

TERMINAL_TRIALS = (
    TrialState.done,
    TrialState.failed,
    TrialState.cancelled,
)
TERMINAL_SWEEPS = (SweepState.done, SweepState.failed, SweepState.cancelled)


def _now() -> datetime:
    return datetime.now(UTC)


def randomness_fields(spec: dict[str, Any]) -> dict[str, Any]:
    """How a sweep's batches and noise were drawn, and the warning a reproducible one carries
    wherever its results are shown."""
    label = randomness_label(spec)
    return {
        "randomness": label,
        "warning": REPRODUCIBLE_WARNING if label == "reproducible" else None,
    }


def spec_hash(spec: SweepSpec) -> str:
    """A canonical hash of the spec (defaults filled in), to find a sweep to resume.

    ``resources`` (where trials run: GPU shares) is left out: the same sweep resumed on other
    hardware is the same sweep, and hashes stay those of specs written before it existed.
    """
    text = json.dumps(spec.model_dump(mode="json", exclude={"resources"}), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def dataset_key(spec: SweepSpec) -> str:
    """The name of the spec's dataset as users see it (``sweeps.dataset``): its name, plus
    the file for file datasets. Not the ledger's key: the ledger is keyed by the identity of
    the records (``sweeps.ledger_key``, see :mod:`sweeper.catalog`)."""
    d = spec.dataset
    return d.name if d.path is None else f"{d.name}:{d.path}"


def _content_of(engine: Engine, spec: SweepSpec) -> str:
    """The identity of the spec's records, for plans made without it (loads the data)."""
    from sweeper.catalog import resolve
    from workers.datasets import dataset_content_sha256

    return dataset_content_sha256(resolve(engine, spec.dataset))


def grid_key(arm: str, epsilon_budget: float) -> str:
    return f"{arm}@{epsilon_budget:g}"


# ---------------------------------------------------------------------------------------------
# Creating a sweep


def _arm_trials(spec: SweepSpec, arm: ArmConfig, grid: dict[str, Any]) -> list[dict[str, Any]]:
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
        runs = draw_run_count(spec.privacy.distribution, mean=float(grid["trials"]))
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


def _check_arms(spec: SweepSpec) -> None:
    """Every arm names a known private strategy, a learning rate, and valid hyperparameters.

    Torch-free: only the strategies' descriptors are read. Every value a trial may get is
    checked (type, finiteness, range, choices), with the same
    :meth:`~workers.strategies.StrategyDescriptor.validate` the worker runs: every grid point
    merged over the arm's params, and for a ``logspace``/``linspace`` axis also both ends of
    its interval (random and tpe search draw anywhere between them).
    """
    from workers.strategies import get_descriptor

    for arm in spec.arms:
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
        names = (set(arm.grid) | set(arm.params)) - {"lr"}
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
    params = {k: v for k, v in arm.params.items() if k != "lr"}
    axes = {k: v for k, v in arm.grid.items() if k != "lr"}

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
        values = {**params, **{k: v for k, v in point.items() if k != "lr"}}
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


@dataclass(frozen=True)
class PreparedSweep:
    """The CPU-heavy part of creating a sweep: its plan and each grid's charge schedule.

    Deterministic in the spec (and the dataset's size), so it may be computed elsewhere (the
    API computes it in a process pool) and cached.
    """

    plan: SweepPlan
    schedules: list[ChargeSchedule]


def prepare_sweep(spec: SweepSpec, *, dataset: Any = None) -> PreparedSweep:
    """Plan a spec and compute its charge schedules (see :class:`PreparedSweep`).

    Raises:
        ConfigError: the spec is invalid.
        InfeasiblePlan: no usable noise multiplier fits a grid's budget.
    """
    check_spec(spec)
    plan = plan_sweep(spec, dataset=dataset)
    from sweeper.parallel import pmap

    return PreparedSweep(plan, list(pmap(charge_schedule, plan.grids)))


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
    _check_arms(spec)


def create_sweep(
    engine: Engine,
    spec: SweepSpec | dict[str, Any] | str,
    *,
    owner: str | None = None,
    plan: SweepPlan | None = None,
    prepared: PreparedSweep | None = None,
) -> str:
    """Plan a spec, store the sweep and its trials, and reserve its whole cost.

    Refuses (before anything is stored) specs that cannot run honestly: infeasible plans,
    and ``charge_repeats: false`` with several seeds (every seed touches the data here).

    Returns:
        The new sweep's id.

    Raises:
        ConfigError: the spec is invalid.
        InfeasiblePlan: no usable noise multiplier fits a grid's budget.
        BudgetExhausted: the dataset's lifetime cap cannot cover the sweep (nothing is stored).
    """
    if not isinstance(spec, SweepSpec):
        spec = load_spec(spec)
    check_spec(spec)
    if prepared is None:
        if plan is None:
            from sweeper.catalog import resolve

            # Loader names pass through; uploads, registered names and a public evaluation
            # dataset are looked up in the catalog.
            plan = plan_sweep(spec, dataset=resolve(engine, spec.dataset, spec.eval))
        from sweeper.parallel import pmap

        prepared = PreparedSweep(plan, list(pmap(charge_schedule, plan.grids)))
    plan = prepared.plan
    # The ledger is keyed by the records, not by the name: the same records under any name,
    # path or format share one lifetime budget.
    content = plan.dataset_sha256 or _content_of(engine, spec)
    arms = {a.label: a for a in spec.arms}
    grids: list[dict[str, Any]] = []
    total_e, total_d = Decimal(0), Decimal(0)
    for g, sched in zip(plan.grids, prepared.schedules, strict=True):
        d = g.to_dict()
        d["planned_trials"] = 0  # set below
        d["charges"] = sched.to_json()
        d["grid"] = grid_key(g.arm, g.epsilon_budget)
        # Trials check that they train on these records (what the reservation covers).
        d["dataset_sha256"] = content
        grids.append(d)
        total_e = exact_sum((total_e, sched.reserved_epsilon))
        total_d = exact_sum((total_d, sched.reserved_delta))
    sweep = Sweep(
        name=spec.name,
        dataset=dataset_key(spec),
        spec=spec.model_dump(mode="json"),
        state=SweepState.pending,
        owner=owner,
        spec_hash=spec_hash(spec),
    )
    trials: list[Trial] = []
    for d in grids:
        arm = arms[d["arm"]]
        rows = _arm_trials(spec, arm, d)
        d["planned_trials"] = len(rows)
        for position, row in enumerate(rows):
            trials.append(
                Trial(
                    arm=arm.label,
                    strategy=arm.strategy,
                    epsilon_budget=float(d["epsilon_budget"]),
                    params=row["params"],
                    seed=int(row["seed"]),
                    # Grid order, except for papernot-steinke rows (always 0, see _arm_trials).
                    number=int(row.get("number", position)),
                    config=int(row["config"]),
                    noise_multiplier=float(d["noise_multiplier"]),
                    target_delta=float(d["delta_per_trial"]),
                    state=TrialState.pending,
                )
            )
    sweep.plan = grids
    sweep.trials = trials
    sweep.id = new_id()
    sweep_id, name = sweep.id, sweep.dataset
    from sweeper.catalog import bind_name

    # Bind the name to its records before reserving: a cap or spend still kept under the name
    # (from before ledgers were keyed by content) must apply to this reservation.
    key = bind_name(
        engine,
        name,
        content,
        new_row={"config": spec.dataset.model_dump(mode="json"), "n_examples": plan.n_examples},
    ).ledger_key
    sweep.ledger_key = key
    ledger = BudgetLedger(engine)
    # Reserve first, store second: a scheduler may pick a stored pending sweep up at once, and
    # must find its whole reservation in place. A refused reservation stores nothing.
    try:
        ledger.reserve(
            key,
            sweep_id=sweep_id,
            epsilon=total_e,
            delta=total_d,
            note=f"sweep {spec.name!r} on {name!r}: {len(grids)} grid(s)",
        )
    except BudgetExhausted as exc:
        # Name the dataset as the user did (the message never holds the identity).
        raise BudgetExhausted(
            f"dataset {name!r}: {str(exc).removeprefix('the dataset: ')} (the lifetime cap "
            "is that of its records, shared by every name of the same records)",
            dataset=name,
            quantity=exc.quantity,
            requested=exc.requested,
            remaining=exc.remaining,
        ) from None
    try:
        with Session(engine) as session, session.begin():
            session.add(sweep)
            session.flush()
            events.emit(session, sweep_id, events.SWEEP, {"state": "pending"})
    except BaseException:
        ledger.release(key, sweep_id=sweep_id, note="sweep could not be stored")
        raise
    return sweep_id


# ---------------------------------------------------------------------------------------------
# Reading


def get_sweep(session: Session, sweep_id: str) -> Sweep:
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        raise SweepNotFound(f"no sweep {sweep_id!r}; `dpsweep sweeps` lists them")
    return sweep


def schedules(sweep: Sweep) -> dict[str, ChargeSchedule]:
    """Each grid's charge schedule, as stored when the sweep was created."""
    return {g["grid"]: ChargeSchedule.from_json(g["charges"]) for g in sweep.plan or []}


def hidden_grids(sweep: Sweep) -> set[str]:
    """Grids that release only their selected trial (papernot-steinke)."""
    return {g["grid"] for g in sweep.plan or [] if g.get("release") == "selected-only"}


def trial_record(t: Trial, *, selected_only: bool = False) -> dict[str, Any]:
    """A trial as users see it.

    Args:
        t: The trial (with its result loaded).
        selected_only: ``t`` is the released trial of a papernot-steinke grid. Its position,
            its start and end times and its duration are left out (``number`` 0, the rest
            None): when workers are few, when a run started says how many runs went before
            it; and a run trains packed with others of its grid (pack sizes follow the number
            of runs left), so its ``train_seconds``, the whole pack's wall time, grows with
            how many ran beside it, and a cold worker's first pack is slower still. Each
            would bound the secret number of runs.
    """
    r = t.result
    return {
        "id": t.id,
        "arm": t.arm,
        "strategy": t.strategy,
        "epsilon_budget": t.epsilon_budget,
        "params": t.params,
        "seed": t.seed,
        # Stored as 0 for papernot-steinke trials; masked here too, for sweeps stored before.
        "number": 0 if selected_only else t.number,
        "state": t.state.value,
        "attempts": t.attempts,
        "noise_multiplier": t.noise_multiplier,
        "error": t.error,
        "metrics": r.metrics if r is not None else {},
        # What this run alone would cost, were it the only release (labelled as such
        # everywhere): not what was spent. Its grid's budget (epsilon_budget) is.
        "single_run_epsilon": r.epsilon if r is not None else None,
        "delta": r.delta if r is not None else None,
        "steps": r.steps if r is not None else None,
        "best_step": r.best_step if r is not None else None,
        "started_at": None if selected_only else iso(t.started_at),
        "finished_at": None if selected_only else iso(t.finished_at),
        "train_seconds": None if selected_only else t.train_seconds,
    }


def search_completed(trials: list[Trial]) -> bool:
    """Whether a papernot-steinke grid's random search completed, so that it may release.

    Every run must have reached a terminal state *without a cancel*: ``done`` or ``failed``
    (a failed run is part of the search's random outcome, like a bad one). A ``cancelled``
    trial means the search was cut short at K' < K runs, a number the user's timing chose;
    the Papernot-Steinke analysis covers the best of the random K runs, not of K', so such a
    grid releases nothing (it stays charged in full). A grid with no runs (K = 0) has nothing
    to release either way.
    """
    return all(t.state in (TrialState.done, TrialState.failed) for t in trials)


def selected_trial(trials: list[Trial], *, metric: str, mode: str) -> Trial | None:
    """The trial a papernot-steinke grid releases, or None (see :func:`search_completed`).

    The best finished run by the objective. Ties are broken by the trial id (a random uuid4),
    not by the run's position: a position-based tie-break would make the choice depend on the
    order of the runs.
    """
    if not search_completed(trials):
        return None
    done = [
        t
        for t in trials
        if t.state == TrialState.done
        and t.result is not None
        and isinstance(t.result.metrics.get(metric), int | float)
    ]
    if not done:
        return None
    sign = 1.0 if mode == "max" else -1.0
    return max(done, key=lambda t: (sign * float(t.result.metrics[metric]), t.id))  # type: ignore[union-attr]


def released_records(sweep: Sweep, *, metric: str, mode: str) -> list[dict[str, Any]]:
    """Trial records that may be shown: all of them, except that a papernot-steinke grid
    shows only its selected trial (:func:`selected_trial`), only once its search completed
    without a cancel (:func:`search_completed`), and without its position or timestamps
    (:func:`trial_record`)."""
    hidden = hidden_grids(sweep)
    out: list[dict[str, Any]] = []
    by_grid: dict[str, list[Trial]] = {}
    for t in sweep.trials:
        by_grid.setdefault(grid_key(t.arm, t.epsilon_budget), []).append(t)
    for key, trials in sorted(by_grid.items()):
        if key not in hidden:
            out.extend(trial_record(t) for t in sorted(trials, key=lambda t: t.number))
            continue
        best = selected_trial(trials, metric=metric, mode=mode)
        if best is not None:
            out.append(trial_record(best, selected_only=True))
    return out


def load_sweep(engine: Engine, sweep_id: str) -> Sweep:
    """A sweep with its trials and results loaded (detached)."""
    from sqlalchemy.orm import defer

    with Session(engine, expire_on_commit=False) as session:
        sweep = session.scalars(
            select(Sweep)
            .where(Sweep.id == sweep_id)
            .options(
                selectinload(Sweep.trials)
                .selectinload(Trial.result)
                # Summaries and fronts never read these, and they are most of a result's bytes.
                .options(
                    defer(TrialResultRow.trajectories, raiseload=True),
                    defer(TrialResultRow.reliability, raiseload=True),
                    defer(TrialResultRow.final_metrics, raiseload=True),
                )
            )
        ).first()
        if sweep is None:
            raise SweepNotFound(f"no sweep {sweep_id!r}; `dpsweep sweeps` lists them")
        session.expunge_all()
        return sweep


def list_sweeps(engine: Engine, *, limit: int = 100) -> list[dict[str, Any]]:
    with Session(engine) as session:
        rows = session.scalars(select(Sweep).order_by(Sweep.created_at.desc()).limit(limit))
        return [
            {
                "id": s.id,
                "name": s.name,
                "dataset": s.dataset,
                "state": s.state.value,
                "created_at": iso(s.created_at),
                "finished_at": iso(s.finished_at),
                "randomness": randomness_label(s.spec or {}),
            }
            for s in rows
        ]


@dataclass(frozen=True)
class SweepResults:
    results: list[ArmLevelResult]
    records: list[dict[str, Any]]
    metric: str
    mode: str


def sweep_results(sweep: Sweep) -> SweepResults:
    obj = sweep.spec.get("objective", {})
    metric, mode = obj.get("metric", "accuracy"), obj.get("mode", "max")
    records = released_records(sweep, metric=metric, mode=mode)
    return SweepResults(
        best_per_arm_level(records, metric=metric, mode=mode), records, metric, mode
    )


def summarize(engine: Engine, sweep_id: str, *, sweep: Sweep | None = None) -> dict[str, Any]:
    """What `dpsweep show --json` and the API return for a sweep (``sweep``: already loaded
    with :func:`load_sweep`)."""
    sweep = sweep or load_sweep(engine, sweep_id)
    res = sweep_results(sweep)
    hidden = hidden_grids(sweep)
    counts = {s.value: 0 for s in TrialState}
    for t in sweep.trials:
        if grid_key(t.arm, t.epsilon_budget) not in hidden:
            counts[t.state.value] += 1
    key = sweep_ledger_key(sweep)
    balance = BudgetLedger(engine).sweep_balance(key, sweep_id=sweep.id)
    with Session(engine) as session:
        n_charges = session.scalar(
            select(func.count(LedgerEntry.id)).where(
                LedgerEntry.dataset == key,
                LedgerEntry.sweep_id == sweep.id,
                LedgerEntry.kind == EntryKind.CHARGE,
            )
        )
    efront = epsilon_front(res.results, mode=res.mode)
    cfront = calibration_front(res.records, metric=res.metric, mode=res.mode)
    plan = list(sweep.plan or [])
    # One epsilon per release, each saying what it covers (sweeper/releases.py). Grid and
    # sweep figures are public (planned from public quantities); the lifetime figure is the
    # ledger's, and the hash-derived ledger key itself is never shown.
    privacy = {
        "grids": grid_releases(plan),
        "sweep": sweep_release(plan),
        "dataset_lifetime": lifetime_release(BudgetLedger(engine).summary(key)),
        "evaluation": evaluation_statement(plan),
    }
    return {
        "id": sweep.id,
        "name": sweep.name,
        "dataset": sweep.dataset,
        "state": sweep.state.value,
        "owner": sweep.owner,
        "error": sweep.error,
        "created_at": iso(sweep.created_at),
        "started_at": iso(sweep.started_at),
        "finished_at": iso(sweep.finished_at),
        **randomness_fields(sweep.spec),
        "objective": {"metric": res.metric, "mode": res.mode},
        "arms": [
            {
                "name": a.get("name") or a["strategy"],
                "strategy": a["strategy"],
                "grid": a.get("grid", {}),
                "params": a.get("params", {}),
            }
            for a in sweep.spec["arms"]
        ],
        "plan": [
            {
                k: g[k]
                for k in (
                    "arm",
                    "strategy",
                    "epsilon_budget",
                    "delta",
                    "noise_multiplier",
                    "gradient_noise_multiplier",
                    "steps_per_trial",
                    "sample_rate",
                    "epsilon_total",
                    "epsilon_per_trial",
                    "epsilon_verified",
                    "verified_by",
                    "accountant",
                    "accounting",
                    "release",
                    "retries",
                    "input_scaling",
                    "count_noise",
                    "warnings",
                    "n_train",
                    "n_eval",
                    "eval_mode",
                    "eval_dataset",
                    "eval_releases",
                    "eval_noise_multiplier",
                    "epsilon_eval",
                )
                if k in g
            }
            | ({} if g["grid"] in hidden else {"trials": g["planned_trials"]})
            for g in sweep.plan or []
        ],
        "trials": counts,
        "privacy": privacy,
        "budget": {
            "epsilon_reserved": float(balance.epsilon_reserved),
            "epsilon_charged": float(balance.epsilon_charged),
            "epsilon_released": float(balance.epsilon_released),
            "epsilon_outstanding": float(balance.epsilon_outstanding),
            "delta_reserved": float(balance.delta_reserved),
            "delta_charged": float(balance.delta_charged),
            "charges": int(n_charges or 0) if not hidden else None,
        },
        "results": [r.to_dict() for r in res.results],
        "pareto": {
            "epsilon": [
                {"x": p.x, "y": p.y, "arm": p.label, "dominated": p.dominated} for p in efront
            ],
            "calibration": [
                {
                    "x": p.x,
                    "y": p.y,
                    "arm": p.label,
                    "trial": p.payload["id"],
                    "dominated": p.dominated,
                }
                for p in cfront
            ],
        },
    }


# ---------------------------------------------------------------------------------------------
# Cancelling and finishing


PS_CANCEL_NOTE = (
    "grids whose search had started stay charged in full and release nothing unless their "
    "search had already completed"
)


def cancel_sweep(engine: Engine, sweep_id: str) -> dict[str, Any]:
    """Cancel a sweep: unstarted trials release their reservation; running trials stop (the
    driver kills them when it sees the state) and stay charged.

    papernot-steinke grids are not counted (their number of runs is secret). A grid whose
    search had started was charged in full at its first run and stays so; it releases its
    selected trial only if every one of its runs had already finished (see
    :func:`search_completed`); a grid that had not started releases its reservation.

    Returns:
        ``{"cancelled_pending": n, "stopped_running": m, "released_epsilon": ...,
        "papernot_steinke": note or None}``: n and m count trials of the other grids only;
        ``papernot_steinke`` states the rule above when the sweep has such grids.

    Raises:
        SweepNotFound: no such sweep.
        IllegalState: the sweep already finished.
    """
    return _end_sweep(engine, sweep_id, SweepState.cancelled, error=None)


def fail_sweep(engine: Engine, sweep_id: str, *, error: str) -> dict[str, Any]:
    """End a sweep that cannot be driven (its driver keeps crashing) as ``failed``: like a
    cancel, unstarted trials release their reservation and started ones stay charged."""
    return _end_sweep(engine, sweep_id, SweepState.failed, error=error)


def _end_sweep(
    engine: Engine, sweep_id: str, final: SweepState, *, error: str | None
) -> dict[str, Any]:
    verb = "cancelled" if final == SweepState.cancelled else "stopped (sweep failed)"
    with Session(engine) as session, session.begin():
        sweep = session.scalars(select(Sweep).where(Sweep.id == sweep_id).with_for_update()).first()
        if sweep is None:
            raise SweepNotFound(f"no sweep {sweep_id!r}; `dpsweep sweeps` lists them")
        if sweep.state in TERMINAL_SWEEPS:
            raise IllegalState(
                f"sweep {sweep_id} is already {sweep.state.value}; only pending or running "
                "sweeps can be cancelled"
            )
        events.lock_sweep(session, sweep_id)
        now = _now()
        hidden = hidden_grids(sweep)
        stopping = session.execute(
            select(Trial.id, Trial.arm, Trial.epsilon_budget, Trial.state).where(
                Trial.sweep_id == sweep_id,
                Trial.state.in_([TrialState.pending, TrialState.interrupted, TrialState.running]),
            )
        ).all()
        # Counted from the rows read under the sweep's lock (the updates below change the
        # same rows), leaving papernot-steinke grids out: how many of their trials were
        # pending or running is a function of their secret number of runs.
        counts = {
            s.value: 0 for s in (TrialState.pending, TrialState.interrupted, TrialState.running)
        }
        for _tid, arm, level, state in stopping:
            if grid_key(arm, level) not in hidden:
                counts[state.value] += 1
        for state, note in (
            (TrialState.pending, f"{verb} before it started (not charged)"),
            (TrialState.interrupted, f"{verb} after an interruption (stays charged)"),
            (TrialState.running, f"{verb} while running (stays charged)"),
        ):
            session.execute(
                update(Trial)
                .where(Trial.sweep_id == sweep_id, Trial.state == state)
                .values(state=TrialState.cancelled, error=note, finished_at=now)
            )
        sweep.state = final
        sweep.error = error
        sweep.finished_at = now
        sweep.driver = None
        ledger_key = sweep_ledger_key(sweep)
        for tid, arm, level, _state in stopping:
            if grid_key(arm, level) not in hidden:
                events.emit(
                    session,
                    sweep_id,
                    events.TRIAL,
                    events.trial_event(tid, arm=arm, epsilon_budget=level, state="cancelled"),
                    trial_id=tid,
                )
        events.emit(
            session,
            sweep_id,
            events.SWEEP,
            {"state": final.value} | ({"error": error} if error else {}),
        )
    rec = BudgetLedger(engine).release(ledger_key, sweep_id=sweep_id, note=f"sweep {final.value}")
    return {
        "cancelled_pending": counts["pending"],
        "stopped_running": counts["running"] + counts["interrupted"],
        "released_epsilon": float(rec.epsilon) if rec is not None else 0.0,
        "papernot_steinke": PS_CANCEL_NOTE if hidden else None,
    }


def find_resumable(engine: Engine, spec: SweepSpec) -> str | None:
    """The newest unfinished sweep of exactly this spec, if any."""
    with Session(engine) as session:
        return session.scalars(
            select(Sweep.id)
            .where(
                Sweep.spec_hash == spec_hash(spec),
                Sweep.state.in_([SweepState.pending, SweepState.running]),
            )
            .order_by(Sweep.created_at.desc())
        ).first()


def export_sweep(engine: Engine, sweep_id: str, *, fmt: str) -> str:
    """The sweep's released trials as CSV (one row per trial), or JSON (summary + trials).

    Raises:
        ConfigError: an unknown format.
    """
    if fmt not in ("csv", "json"):
        raise ConfigError(f"unknown export format {fmt!r}; choose csv or json", field="format")
    sweep = load_sweep(engine, sweep_id)
    res = sweep_results(sweep)
    if fmt == "json":
        label = randomness_label(sweep.spec)
        trials = [r | {"randomness": label} for r in res.records]
        return json.dumps({"sweep": summarize(engine, sweep_id), "trials": trials}, indent=2)
    import csv
    import io

    metric_names = sorted({k for r in res.records for k in (r["metrics"] or {})})
    param_names = sorted({k for r in res.records for k in (r["params"] or {})})
    base = [
        "id",
        "arm",
        "strategy",
        "epsilon_budget",
        "seed",
        "state",
        "attempts",
        "noise_multiplier",
        "single_run_epsilon",
        "delta",
        "steps",
        "best_step",
        "train_seconds",
        "error",
        "randomness",
        # How the metrics' evaluation records were protected: carve-out (exact, unprotected),
        # public (exact, a public dataset) or dp (noisy accuracy, charged).
        "evaluation",
    ]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(base + [f"param.{p}" for p in param_names] + metric_names)
    label = randomness_label(sweep.spec)
    evaluation = evaluation_statement(list(sweep.plan or []))["mode"]
    for r in res.records:
        r = r | {"randomness": label, "evaluation": evaluation}
        writer.writerow(
            [r.get(k) for k in base]
            + [r["params"].get(p) for p in param_names]
            + [(r["metrics"] or {}).get(m) for m in metric_names]
        )
    return buf.getvalue()
