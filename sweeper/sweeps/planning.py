"""Plan a sweep: check its spec, load its data to learn N, and plan every grid.

The one check before any reservation or charge, shared by every path that plans (the CLI's
``plan`` and ``run``, the API's plan and submit). It sits in the sweeps layer because it
resolves the dataset (:mod:`sweeper.datasets.resolution`) and runs the submission checks
(:mod:`sweeper.sweeps.checks`); each grid's noise multiplier comes from
:mod:`sweeper.privacy.planner`. Loading the data imports torch (workers' loaders), so this
module is imported only by those paths, never by ``sweeper`` itself.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dpsweep.errors import ConfigError
from dpsweep.plan import EXAMPLE_UNIT, GridPlan, SweepPlan
from sweeper.datasets.resolution import resolve, tuning_names, tuning_spec
from sweeper.privacy.grids import GridRequest
from sweeper.privacy.limits import HIGH_NOISE_MULTIPLIER, high_noise_warning
from sweeper.privacy.noise_split import arm_gradient_noise_multiplier, split_points
from sweeper.privacy.parallel import pmap_distinct
from sweeper.privacy.planner import grid_requests, plan_accountant_name, plan_grid
from sweeper.sweeps.checks import check_model_on_data, check_spec, check_units_on_data
from sweeper.sweeps.model_facts import ModelFacts
from sweeper.sweeps.tuning import centred_arm, grid_json, tuning_points
from workers.accounting.registry import trial_accountant_for_plan
from workers.count_noise import auto_count_noise
from workers.datasets.loading import load_dataset
from workers.strategies import get_descriptor


def plan_sweep(
    spec: Any,
    *,
    dataset: Any = None,
    checkpoints_dir: str | None = None,
    allow_paths: bool = False,
) -> SweepPlan:
    """Plan every grid of a spec (loads the dataset to learn N; trains nothing).

    Loading also checks the data (NaN and inf are refused, naming the file and rows) and gives
    each grid the dataset's ``input_scaling``.

    Args:
        spec: The sweep spec.
        dataset: The :class:`workers.datasets.DatasetSpec` to load, when the spec's dataset
            needs resolving (an upload, :func:`sweeper.datasets.resolution.resolve`);
            default: the spec's.
        checkpoints_dir: The registered checkpoints ``model.checkpoint`` may name (default:
            ``DPSWEEP_CHECKPOINTS_DIR``).
        allow_paths: ``model.checkpoint`` may be a path: the local command line only (a
            server refuses paths; fail closed by default).
    """
    # The one check before any reservation or charge, shared by every path that plans (the
    # CLI's plan and run, the API's plan and submit): the spec's values first (torch-free) ...
    check_spec(spec)
    # The accountant is a registered one the planner can calibrate with (422 naming them).
    plan_accountant_name(spec.privacy.accountant)
    evaluation = getattr(spec, "eval", None)
    # Without a resolved dataset, a loader's (no catalog): it carries the evaluation mode and
    # the public datasets arms tune on (built-ins declared public; a registered name needs the
    # catalog, and is refused here without it).
    dataset = dataset or resolve(None, spec.dataset, evaluation, tune_on=tuning_names(spec.arms))
    data = load_dataset(dataset)
    # ... then the unit the data is accounted in (one level per spec: the data's) ...
    check_units_on_data(spec, data)
    # ... then the model on the loaded data's shape (built on the meta device unless its
    # descriptor declares the packed path), before any grid is planned.
    engine_path = check_model_on_data(
        spec, data, checkpoints_dir=checkpoints_dir, allow_paths=allow_paths
    )
    # What the grids' models start from and what they train (the checkpoint's digest, the
    # trained parameters of the total): public facts of the spec and the data's shape.
    model_facts = ModelFacts(spec, data, checkpoints_dir=checkpoints_dir, allow_paths=allow_paths)
    # N: the private records (in mode public the evaluation records are another dataset), as
    # declared by a stored dataset's owner: the plan is then the same on neighbouring data.
    # With a privacy unit, N, n_train (q = b / n_train) and T count units, never rows.
    n = data.planning_n_private
    arms = {a.label: a for a in spec.arms}
    grids = []
    requests = grid_requests(spec, dataset_size=n, n_train=data.planning_n_train)
    # Grids that differ only in their arm (fixed and quantile with as many trials, at one
    # level) are one accounting problem: planned and verified once, then labelled per arm.
    for req, planned in pmap_distinct(plan_grid, requests, key=_accounting_key):
        g = replace(planned, arm=req.arm, strategy=req.strategy)
        grids.append(
            _finished_grid(
                spec,
                g,
                arms[req.arm],
                data=data,
                evaluation=evaluation,
                engine_path=engine_path,
                model_facts=model_facts,
            )
        )
    if any(getattr(a, "tune_on", None) for a in spec.arms):
        grids = _tuned(spec, grids, dataset, data)
    return SweepPlan(
        grids, dataset_sha256=data.content_sha256, n_examples=n, privacy_unit=_unit_of(data)
    )


def _unit_of(data: Any) -> str:
    """What one unit of the plan's epsilon protects: the data's unit, else ``example``."""
    return str(getattr(data, "privacy_unit", None) or EXAMPLE_UNIT)


def _finished_grid(
    spec: Any,
    g: GridPlan,
    arm: Any,
    *,
    data: Any,
    evaluation: Any,
    engine_path: str,
    model_facts: ModelFacts,
) -> GridPlan:
    """A planned grid with what the plan shows of its arm, data and model: the smallest
    gradient sigma, the chosen count noise, warnings, the data's sizes (in units where the
    data has a privacy unit) and unit, and the model's facts."""
    b = spec.training.batch_size
    # A grid axis may set a split's parameter (count_noise, direction_noise_ratio) per
    # trial: the split must hold for every grid point; the plan shows the smallest sigma_g.
    points = split_points(arm)
    sigma_g = min(
        arm_gradient_noise_multiplier(
            arm, p, noise_multiplier=g.noise_multiplier, expected_batch_size=b
        )
        for p in points
    )
    count_noise = _chosen_count_noise(arm, points, g, expected_batch_size=b)
    warnings: list[str] = []
    if spec.privacy.max_noise_multiplier is None and g.noise_multiplier > HIGH_NOISE_MULTIPLIER:
        warnings.append(
            high_noise_warning(noise_multiplier=g.noise_multiplier, expected_batch_size=b)
        )
    return replace(
        g,
        gradient_noise_multiplier=sigma_g,
        input_scaling=dict(data.input_scaling),
        count_noise=count_noise,
        warnings=tuple(warnings),
        n_train=data.planning_n_train,
        n_eval=data.planning_n_eval,
        privacy_unit=_unit_of(data),
        eval_mode=str(getattr(evaluation, "mode", None) or "carve-out"),
        eval_dataset=getattr(evaluation, "dataset", None),
        engine_path=engine_path,
        **model_facts.of(arm),
    )


def _chosen_count_noise(
    arm: Any, points: list[dict[str, Any]], g: GridPlan, *, expected_batch_size: float
) -> float | None:
    """The count noise the plan chooses for a trial's second release, or ``None``."""
    # The size of a second release a trial leaves out (quantile's count_noise) is chosen
    # by workers.count_noise's rule; the plan shows it. The descriptor says which.
    strategy = get_descriptor(arm.strategy)
    second = strategy.second_release if strategy.derives_second_release else None
    if second is not None and any(p.get(second) is None for p in points):
        return auto_count_noise(
            noise_multiplier=g.noise_multiplier, expected_batch_size=expected_batch_size
        )
    return None


def _tuned(spec: Any, grids: list[GridPlan], dataset: Any, data: Any) -> list[GridPlan]:
    """Public pre-tuning (:mod:`sweeper.sweeps.tuning`): each grid of an arm with ``tune_on``
    trains its points on the public records at its own planned sigma, delta and steps, and is
    centred on the best. The grids' sizes, and so K and every sigma, are unchanged.

    Raises:
        ConfigError: a tuning dataset that is not public, whose records do not fit the model
            (``arms.<label>.tune_on``), or a centred value the strategy refuses.
    """
    # deferred: imports torch (the tuning trains on the public records)
    from workers.public_tuning import tune_on_public

    resolved = dict(getattr(dataset, "tune_datasets", ()) or ())
    loaded: dict[str, tuple[Any, Any]] = {}
    arms = {a.label: a for a in spec.arms}
    out = []
    for g in grids:
        arm = arms[g.arm]
        name = getattr(arm, "tune_on", None)
        if not name:
            out.append(g)
            continue
        field = f"arms.{arm.label}.tune_on"
        if name not in loaded:
            # Resolved with the training dataset (the callers that have the catalog); else a
            # built-in declared public (a registered name then says it needs the catalog).
            public = resolved.get(name) or tuning_spec(
                None, name, dataset, training_name=str(spec.dataset.name), field=field
            )
            loaded[name] = (public, _public_data(public, data, name=name, field=field))
        public, public_data = loaded[name]
        try:
            result = tune_on_public(
                public_data,
                public,
                model=spec.model,
                training=spec.training,
                strategy=arm.strategy,
                points=tuning_points(arm),
                noise_multiplier=g.noise_multiplier,
                delta=g.delta_per_trial,
                steps=g.steps_per_trial,
                metric=spec.objective.metric,
                mode=spec.objective.mode,
                accountant=trial_accountant_for_plan(g.accountant),
            )
        except ConfigError as exc:
            raise ConfigError(
                f"arm {arm.label!r}: public tuning on {name!r} failed: {exc}", field=field
            ) from None
        centred = centred_arm(arm, {k: v for k, v in result.best.items() if k in arm.grid})
        out.append(
            replace(
                g,
                tuned_on=name,
                tuned_params=dict(result.best),
                tuned_score=result.score,
                tuned_grid=grid_json(centred.grid),
                tuned_at=None
                if spec.training.tune_batch_scale == 1
                else {
                    "scale": spec.training.tune_batch_scale,
                    "batch_size": result.batch_size,
                    "noise_multiplier": result.noise_multiplier,
                },
            )
        )
    return out


def _public_data(public: Any, data: Any, *, name: str, field: str) -> Any:
    """The public tuning records, loaded, once checked to fit the model the private records
    shape (the same input shape, classes and vocabulary)."""
    try:
        loaded = load_dataset(public)
    except ConfigError as exc:
        raise ConfigError(f"{field} {name!r}: {exc}", field=field) from None
    same = (
        tuple(loaded.input_shape) == tuple(data.input_shape)
        and int(loaded.num_classes) == int(data.num_classes)
        and loaded.vocab_size == data.vocab_size
    )
    if not same:
        raise ConfigError(
            f"{field} {name!r}: its records do not fit the model the training data shapes "
            f"(input shape {tuple(loaded.input_shape)} and {loaded.num_classes} classes, "
            f"against {tuple(data.input_shape)} and {data.num_classes}); tune on public "
            "records of the same shape and classes",
            field=field,
        )
    return loaded


def _accounting_key(req: GridRequest) -> GridRequest:
    """A grid request without its labels: what :func:`plan_grid` computes from (the arm's
    name and strategy only label the plan and name the arm in a refusal)."""
    return replace(req, arm="", strategy="")
