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

from dpsweep.plan import SweepPlan
from sweeper.datasets.resolution import resolve
from sweeper.privacy.limits import HIGH_NOISE_MULTIPLIER, high_noise_warning
from sweeper.privacy.noise_split import arm_gradient_noise_multiplier, split_points
from sweeper.privacy.parallel import pmap
from sweeper.privacy.planner import grid_requests, plan_accountant_name, plan_grid
from sweeper.sweeps.checks import check_model_on_data, check_spec
from workers.count_noise import auto_count_noise
from workers.datasets.loading import load_dataset
from workers.strategies import get_descriptor


def plan_sweep(spec: Any, *, dataset: Any = None) -> SweepPlan:
    """Plan every grid of a spec (loads the dataset to learn N; trains nothing).

    Loading also checks the data (NaN and inf are refused, naming the file and rows) and gives
    each grid the dataset's ``input_scaling``.

    Args:
        spec: The sweep spec.
        dataset: The :class:`workers.datasets.DatasetSpec` to load, when the spec's dataset
            needs resolving (an upload, :func:`sweeper.datasets.resolution.resolve`);
            default: the spec's.
    """
    # The one check before any reservation or charge, shared by every path that plans (the
    # CLI's plan and run, the API's plan and submit): the spec's values first (torch-free) ...
    check_spec(spec)
    # The accountant is a registered one the planner can calibrate with (422 naming them).
    plan_accountant_name(spec.privacy.accountant)
    evaluation = getattr(spec, "eval", None)
    # Without a resolved dataset, a loader's (no catalog): it carries the evaluation mode.
    data = load_dataset(dataset or resolve(None, spec.dataset, evaluation))
    # ... then the model on the loaded data's shape (built on the meta device unless its
    # descriptor declares the packed path), before any grid is planned.
    engine_path = check_model_on_data(spec, data)
    # N: the private records (in mode public the evaluation records are another dataset), as
    # declared by a stored dataset's owner: the plan is then the same on neighbouring data.
    n = data.planning_n_private
    arms = {a.label: a for a in spec.arms}
    b = spec.training.batch_size
    grids = []
    requests = grid_requests(spec, dataset_size=n, n_train=data.planning_n_train)
    for req, g in zip(requests, pmap(plan_grid, requests), strict=True):
        arm = arms[req.arm]
        # A grid axis may set a split's parameter (count_noise, direction_noise_ratio) per
        # trial: the split must hold for every grid point; the plan shows the smallest sigma_g.
        points = split_points(arm)
        sigma_g = min(
            arm_gradient_noise_multiplier(
                arm, p, noise_multiplier=g.noise_multiplier, expected_batch_size=b
            )
            for p in points
        )
        # The size of a second release a trial leaves out (quantile's count_noise) is chosen
        # by workers.count_noise's rule; the plan shows it. The descriptor says which.
        strategy = get_descriptor(arm.strategy)
        second = strategy.second_release if strategy.derives_second_release else None
        count_noise = None
        if second is not None and any(p.get(second) is None for p in points):
            count_noise = auto_count_noise(
                noise_multiplier=g.noise_multiplier, expected_batch_size=b
            )
        warnings: list[str] = []
        if spec.privacy.max_noise_multiplier is None and g.noise_multiplier > HIGH_NOISE_MULTIPLIER:
            warnings.append(
                high_noise_warning(noise_multiplier=g.noise_multiplier, expected_batch_size=b)
            )
        grids.append(
            replace(
                g,
                gradient_noise_multiplier=sigma_g,
                input_scaling=dict(data.input_scaling),
                count_noise=count_noise,
                warnings=tuple(warnings),
                n_train=data.planning_n_train,
                n_eval=data.planning_n_eval,
                eval_mode=str(getattr(evaluation, "mode", None) or "carve-out"),
                eval_dataset=getattr(evaluation, "dataset", None),
                engine_path=engine_path,
            )
        )
    return SweepPlan(grids, dataset_sha256=data.content_sha256, n_examples=n)
