"""Packs: what a worker trains, and which pending trials train together.

:func:`pack_spec` builds the :class:`workers.training.specs.PackSpec` of one trial or a pack of
trials of one planned grid: what a worker trains (the sweep driver and ``dpsweep train`` alike).
:class:`Packer` groups the queued trials into packs of compatible trials
(:func:`workers.packing.pack_key`), caps a pack by memory (:func:`workers.packing.max_pack_size`),
and checks a pack against its plan on the data as it is now, before anything is charged
(:mod:`workers.plan_check`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from dpsweep.errors import ConfigError
from dpsweep.spec import SweepSpec
from dpsweep.spec_model import LORA_RANK_AXIS
from dpsweep.spec_training import ROWS_PER_UNIT_AXIS
from sweeper.datasets.resolution import resolve
from sweeper.driver import failures, ray_backend
from sweeper.driver.held_sweep import HeldSweep, PendingTrial, PlannedGrid, arm_named
from sweeper.driver.ray_backend import gpu_request
from workers.accounting.registry import trial_accountant_for_plan
from workers.datasets.loading import load_dataset
from workers.plan_check import PlanMismatch, check_pack
from workers.settings import WorkerSettings
from workers.training.specs import TrialSpec, training_pack

log = logging.getLogger(__name__)


class TrialToTrain(Protocol):
    """What :func:`pack_spec` reads of a trial (a :class:`PendingTrial`, a stored trial row,
    or anything with these attributes)."""

    @property
    def arm(self) -> str: ...
    @property
    def strategy(self) -> str: ...
    @property
    def params(self) -> dict[str, Any]: ...
    @property
    def seed(self) -> int: ...
    @property
    def noise_multiplier(self) -> float | None: ...
    @property
    def target_delta(self) -> float | None: ...


def _trial_specs(spec: SweepSpec, trials: Sequence[TrialToTrain]) -> tuple[list[Any], Any, Any]:
    """Each trial's :class:`TrialSpec` (its arm's params overridden by its own, ``lr``,
    ``lora_r`` and ``rows_per_unit`` taken out), the pack's one LoRA rank and its one
    rows_per_unit (None without one: the spec's sections').

    Raises:
        StopIteration: a trial's arm is not in the spec.
        ValueError: the trials have different LoRA ranks or rows_per_unit values.
    """
    specs = []
    ranks: set[Any] = set()
    rows: set[Any] = set()
    for t in trials:
        arm = arm_named(spec, t.arm)
        params = {**arm.params, **t.params}
        lr = params.pop("lr", None)
        # LoRA's rank shapes the model, not the strategy: it leaves the params here, and
        # trials of other ranks never share a pack (their pack specs' models differ).
        ranks.add(params.pop(LORA_RANK_AXIS, None))
        # Likewise rows_per_unit: one R per pack (the unit step's row slots), never a
        # strategy's param; trials of other values form other packs (their pack keys differ).
        rows.add(params.pop(ROWS_PER_UNIT_AXIS, None))
        specs.append(
            TrialSpec(
                lr=float(lr) if lr is not None else float("nan"),
                seed=t.seed,
                noise_multiplier=t.noise_multiplier,
                target_delta=float(t.target_delta or spec.privacy.delta),
                params=params,
            )
        )
    if len(ranks) > 1:
        raise ValueError(f"a pack mixes trials of LoRA ranks {sorted(map(str, ranks))}")
    if len(rows) > 1:
        raise ValueError(f"a pack mixes trials of rows_per_unit {sorted(map(str, rows))}")
    return specs, ranks.pop(), rows.pop()


def pack_spec(
    spec: SweepSpec,
    trials: Sequence[TrialToTrain],
    *,
    dataset: Any | Callable[[], Any],
    grid: PlannedGrid | None = None,
    accountant: str | None = None,
    planned: Any = None,
    device: str = "cpu",
    threads: int = 1,
) -> Any:
    """The :class:`workers.training.specs.PackSpec` that trains ``trials`` (one, or a pack of
    several of one grid and strategy).

    Args:
        spec: The spec (model, training settings, privacy, arms); each trial's params are its
            arm's fixed params overridden by its own, ``lr`` taken out.
        trials: What to train (:class:`TrialToTrain`); the pack's strategy is the first one's.
        dataset: The worker-side dataset (:func:`sweeper.datasets.resolution.resolve` of the
            spec's dataset and eval sections), or a function returning it, called once the
            trials' own settings are read (so that their errors come first, as they always did).
        grid: The trials' grid as planned and stored. Given, the worker refuses to run anything
            but what it covers (its :class:`workers.plan_check.PlannedRun`), reports epsilon
            with the accountant its stored one maps to, and uses its DP-evaluation noise.
        accountant: The worker's accountant (:mod:`workers.accounting.registry`); default: the
            grid's stored one, mapped. Required without ``grid``.
        planned: The :class:`workers.plan_check.PlannedRun` to enforce; default: the grid's
            (None without a grid: the run is not checked against a plan).
        device: Where to train (``cpu``, ``cuda``, ...).
        threads: Torch threads of the worker.

    Raises:
        StopIteration: a trial's arm is not in the spec.
        ValueError: the trials have different LoRA ranks (``lora_r``) or rows per unit
            (``rows_per_unit``).
        ConfigError: the grid's stored accountant is unknown.
        ValueError: neither ``grid`` nor ``accountant`` is given.
    """
    if grid is None and accountant is None:
        raise ValueError("pack_spec needs a planned grid or an accountant")
    specs, rank, rows_per_unit = _trial_specs(spec, trials)
    return training_pack(
        model=spec.model,
        lora_r=int(rank) if rank is not None else None,
        rows_per_unit=int(rows_per_unit) if rows_per_unit is not None else None,
        training=spec.training,
        strategy=trials[0].strategy,
        trials=specs,
        dataset=dataset,
        # Trials report single-run epsilon with the accountant the grid's stored one maps
        # to (workers.accounting.registry.PLAN_TO_WORKER); an unknown stored name is refused.
        accountant=_worker_accountant(grid, accountant),
        # Secret per-trial randomness unless the spec opted into reproducible mode (a spec
        # stored before that option existed runs its remaining trials with secrets too).
        reproducible=spec.privacy.reproducible,
        # The worker refuses to run anything but what the grid's reservation covers.
        planned=planned if planned is not None or grid is None else grid.planned_run(),
        # DP evaluation: each noisy count's multiplier, as planned and charged per grid.
        eval_noise_multiplier=None if grid is None else grid.eval_noise_multiplier,
        device=device,
        threads=threads,
        # Workers hand each trial's best checkpoint back unless the spec keeps no models.
        keep_weights=spec.artifacts.keep != "none",
    )


def _worker_accountant(grid: PlannedGrid | None, accountant: str | None) -> str:
    if accountant is not None:
        return accountant
    assert grid is not None  # pack_spec checked
    return trial_accountant_for_plan(grid.accountant)


class Packer:
    """Form packs from the held sweep's queue, and build and check what they train.

    Args:
        held: The sweep the driver holds.
    """

    def __init__(self, held: HeldSweep) -> None:
        self.held = held
        self._keys: dict[str, str] = {}
        self._pack_caps: dict[str, int] = {}
        self._dataset: Any = None
        self._data_cache: tuple[Any, Any] | None = None

    def spec_for(self, trials: list[PendingTrial]) -> Any:
        """The pack spec of ``trials`` (all of one grid)."""
        held = self.held
        grid = held.grid_plan(trials[0].grid)
        return pack_spec(
            held.spec,
            trials,
            dataset=self.dataset_spec,
            grid=grid,
            device="cuda" if held.gpus else "cpu",
        )

    def dataset_spec(self) -> Any:
        """The worker-side dataset of the sweep, resolved once."""
        # Uploads (ds_...) resolve to their stored file; the workers never see the database.
        if self._dataset is None:
            spec = self.held.spec
            self._dataset = resolve(self.held.engine, spec.dataset, spec.eval)
        return self._dataset

    def plan_mismatch(self, trials: list[PendingTrial]) -> str | None:
        """Why ``trials`` would not run as planned (see :mod:`workers.plan_check`), or None.

        The reason is public: the failure's category and fixed reason
        (:mod:`sweeper.driver.failures`). The check's own message names values computed from
        the data on disk (the sample rate its record count implies, or that count itself), so
        it goes to the driver's log only.
        """
        spec = self.spec_for(trials)
        assert spec.planned is not None
        data = self.current_data(spec.dataset)
        try:
            check_pack(spec, data)
        except (PlanMismatch, ConfigError) as exc:
            return failures.log_failure(
                log,
                exc,
                "sweep %s: trial(s) %s would not run as planned",
                self.held.sweep_id,
                ", ".join(t.id for t in trials),
            ).text
        return None

    def current_data(self, dataset: Any) -> Any:
        """The dataset as it is now on disk, reloaded whenever one of its files changed."""
        stamp = []
        public_eval = getattr(dataset, "eval_dataset", None)
        paths = [dataset.path, dataset.labels_path]
        if public_eval is not None:
            paths += [public_eval.path, public_eval.labels_path]
        for path in paths:
            if path:
                try:
                    st = os.stat(path)
                    stamp.append((path, st.st_size, st.st_mtime_ns, st.st_ino))
                except OSError:
                    stamp.append((path, -1, -1, -1))
        key = (repr(dataset), tuple(stamp))
        cached = self._data_cache
        if cached is None or cached[0] != key:
            self._data_cache = cached = (key, load_dataset(dataset))
        return cached[1]

    def pack_key(self, t: PendingTrial) -> str:
        """Which pack ``t`` may join (trials with one key train as one computation)."""
        # deferred: the API imports this module; workers.pack_keys itself is torch-free
        from workers.pack_keys import pack_key

        cache_key = f"{t.id}:{sorted(t.params.items())}"
        if cache_key not in self._keys:
            try:
                self._keys[cache_key] = pack_key(self.spec_for([t]))
            except Exception:  # invalid params: the trial runs alone, and fails alone
                self._keys[cache_key] = f"solo:{t.id}"
        return self._keys[cache_key]

    def pack_cap(self, key: str, t: PendingTrial) -> int:
        """The most trials a pack of ``key`` may hold (memory, ``max_pack_size``)."""
        if key not in self._pack_caps:
            from workers.packing import max_pack_size  # deferred: torch (it builds the model)

            cap = 1
            if not key.startswith("solo:"):
                try:
                    spec = self.spec_for([t])
                    data = self.current_data(spec.dataset)
                    cap = max_pack_size(
                        spec,
                        input_shape=data.input_shape,
                        num_classes=data.num_classes,
                        settings=WorkerSettings(),
                    )
                except Exception:
                    cap = 1
            self._pack_caps[key] = self._bounded(cap)
        return self._pack_caps[key]

    def size_packs_remotely(self) -> None:
        """Size every pack key of the queue at once, in a Ray worker
        (:func:`~sweeper.driver.ray_backend.remote_pack_caps`), so that the driver imports no
        torch; :meth:`pack_cap` then reads the results. On any failure the keys stay unsized
        and :meth:`pack_cap` sizes them here, as without this call.
        """
        firsts: dict[str, PendingTrial] = {}
        for t in self.held.pending:
            key = self.pack_key(t)
            if not key.startswith("solo:") and key not in self._pack_caps:
                firsts.setdefault(key, t)
        if not firsts:
            return
        try:
            specs = [self.spec_for([t]) for t in firsts.values()]
            data = self.current_data(specs[0].dataset)
            caps = ray_backend.remote_pack_caps(
                specs, input_shape=data.input_shape, num_classes=data.num_classes
            )
        except Exception:
            log.warning(
                "sweep %s: a worker could not size the packs; the driver sizes them",
                self.held.sweep_id,
                exc_info=True,
            )
            return
        for key, cap in zip(firsts, caps, strict=True):
            self._pack_caps[key] = self._bounded(cap)

    def _bounded(self, cap: int) -> int:
        if self.held.settings.max_pack_size:
            cap = min(cap, self.held.settings.max_pack_size)
        return max(1, cap)

    def next_group(self) -> tuple[str, list[PendingTrial]]:
        """The pack key and queued trials of the group to submit from next."""
        groups: dict[str, list[PendingTrial]] = {}
        for t in self.held.pending:
            groups.setdefault(self.pack_key(t), []).append(t)
        # papernot-steinke: group sizes count secret runs; which grid's search starts first
        # (visible as its charge) must not depend on them, so take groups in key order.
        key = min(groups) if self.held.hidden else max(groups, key=lambda k: (len(groups[k]), k))
        return key, groups[key]

    def gpu_request(self, trials: int) -> float:
        """The GPU share a pack of ``trials`` asks Ray for (0 on a cluster without GPUs)."""
        held = self.held
        if not held.gpus:
            return 0.0
        per_trial = held.spec.resources.gpus_per_trial
        return gpu_request(
            trials,
            gpus_per_trial=per_trial if per_trial is not None else held.settings.gpus_per_trial,
            gpu_fraction=held.settings.gpu_fraction,
        )
