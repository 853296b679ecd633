"""A sweep's plan, typed: what the planner decides per grid, as it is stored and read back.

A *grid* is one arm (a strategy's grid of hyperparameters) at one epsilon level. Its plan is
:class:`GridPlan`: the noise multiplier, the epsilon figures and how they were verified, and,
once the sweep is stored, the trials planned, the charge schedule and the records it was
planned for. The planner builds it (``sweeper.privacy``), submission stores it
(``Sweep.plan``: a JSON list, one object per grid, :meth:`SweepPlan.to_stored`), and every
reader (the driver, the worker's pre-charge check, the API, the CLI, summaries, cards and
exports) reads it back once with :meth:`SweepPlan.from_stored`, then carries typed objects.

Stored plans round-trip: ``SweepPlan.from_stored(p).to_stored() == p`` for every plan this
version writes, and plans written before a field existed load with that field's default.
This module is part of the light contract package: it imports pydantic and nothing heavy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import field
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from dpsweep.accountants import PLAN, resolve
from dpsweep.accounting_inputs import AccountingInputs
from dpsweep.errors import PlanCorrupt

__all__ = ["EXAMPLE_UNIT", "GridKey", "GridPlan", "SweepPlan"]

#: The privacy unit of a dataset without a declared unit: each row protects itself (the
#: ledger's name for it too, ``sweeper.privacy.ledger.units``).
EXAMPLE_UNIT = "example"


@dataclasses.dataclass(frozen=True, order=True)
class GridKey:
    """The key of one grid: its arm's label and its epsilon level.

    Its string form, ``"<arm>@<epsilon:g>"``, is what the database stores (``Sweep.plan``'s
    ``grid``, ledger entries, releases). Two levels equal to six significant digits would give
    one string, which is why a spec's budgets must differ at that precision
    (``dpsweep.spec``).
    """

    arm: str
    epsilon_budget: float

    def __str__(self) -> str:
        return f"{self.arm}@{self.epsilon_budget:g}"

    @classmethod
    def parse(cls, text: str) -> GridKey:
        """The key whose string form is ``text``.

        Raises:
            ValueError: ``text`` is not ``"<arm>@<number>"``.
        """
        arm, sep, level = text.rpartition("@")
        if not sep or not arm:
            raise ValueError(f"a grid key is '<arm>@<epsilon>', not {text!r}")
        return cls(arm, float(level))


# Stored plans written by older versions may lack fields added since (they take defaults) and
# may carry fields dropped since (ignored): the figures every check needs are required.
_CONFIG = ConfigDict(extra="ignore")


@dataclass(frozen=True, config=_CONFIG)
class GridPlan:
    """One grid's plan: its noise multiplier, its epsilon figures and how they were verified.

    The first block is what the planner decides (``sweeper.privacy.planner``); the last four
    fields are set when the sweep is stored (``sweeper.sweeps.create``) and are None in a dry
    run's plan.
    """

    arm: str
    strategy: str
    epsilon_budget: float
    delta: float
    trials: int
    steps_per_trial: int
    sample_rate: float
    noise_multiplier: float
    epsilon_per_trial: float
    delta_per_trial: float
    epsilon_total: float
    epsilon_verified: float
    accounting: str
    accountant: str
    verified_by: str
    release: str  # "all" or "selected-only"
    # The gradient's own multiplier once strategies with a second query have split sigma
    # (quantile, online); equal to noise_multiplier for the others.
    gradient_noise_multiplier: float = 0.0
    # Of ``trials``, runs reserved for re-running interrupted trials (privacy.retries).
    retries: int = 0
    # How the dataset's inputs are scaled and bounded (workers.datasets.Dataset.input_scaling):
    # method, clip range and source, shown with the plan so users see what the model gets.
    input_scaling: dict[str, Any] | None = field(default=None, hash=False)
    # Quantile grids: the count noise sigma_b chosen when the spec leaves it out
    # (workers.count_noise); None where the spec sets it or the strategy has no count.
    count_noise: float | None = None
    # Judgements the user should see (high noise, with an expected-utility hint); no refusal.
    warnings: tuple[str, ...] = ()
    # Records the epsilon covers (training) and the evaluation carve-out (public sizes); with
    # a privacy unit, units (q = b / n_train and delta's bound count units, never rows).
    n_train: int | None = None
    n_eval: int | None = None
    # What one unit of the grid's epsilon protects: ``example`` (each row its own unit) or
    # the dataset's unit (``patient_id``, ``person``): every epsilon is then per unit, all of
    # its rows together. Plans stored before units existed were example-level.
    privacy_unit: str = EXAMPLE_UNIT
    # The second accountant of verify_plan (name and version) and its error bars around
    # epsilon_verified (its estimate): for the PRV accountant, rigorous bounds on the true
    # epsilon; for the independent RDP, the order-grid agreement tolerance.
    verifier: str = ""
    epsilon_verified_lower: float | None = None
    epsilon_verified_upper: float | None = None
    # papernot-steinke: RepeatAndSelect's shape of the distribution of the number of trials
    # (whose mean is ``trials``), so the plan can be re-verified from its own fields.
    # math.inf (Poisson) is stored "inf": JSON has no infinity.
    distribution_shape: float | None = None
    # How the evaluation records are protected (the spec's eval.mode: carve-out, public, dp)
    # and, for public, the registered name of the evaluation dataset.
    eval_mode: str = "carve-out"
    eval_dataset: str | None = None
    # DP evaluation: E noisy counts per trial, each a Gaussian of multiplier sigma_e
    # (eval_noise_multiplier); epsilon_total and epsilon_per_trial include them. epsilon_eval:
    # what the grid's evaluation releases alone cost at the grid's delta (for display).
    eval_releases: int = 0
    eval_noise_multiplier: float | None = None
    epsilon_eval: float | None = None
    # Which engine path trains the grid's model, as its descriptor declares it (packed,
    # generic, or auto: decided when built); each trial records the path it took.
    engine_path: str | None = None
    # Public pre-tuning (the arm's ``tune_on``, sweeper.sweeps.tuning): the public dataset the
    # grid's points were first trained on at this grid's sigma (no epsilon spent), the best
    # point there (its hyperparameters, lr included), its score on the public records (the
    # spec's objective), and the centred grid the trials are created from (axes as JSON:
    # lists, or {logspace|linspace: [a, b], k: n}; same size as the spec's). None: not tuned.
    tuned_on: str | None = None
    tuned_params: dict[str, Any] | None = field(default=None, hash=False)
    tuned_score: float | None = None
    tuned_grid: dict[str, Any] | None = field(default=None, hash=False)
    # Tuning small, then scaling (training.tune_batch_scale r): the logical batch and noise
    # multiplier the public tuning trained at (B / r, sigma / r: sigma / B as the grid's), and
    # r; the grid's own batch and sigma are the private run's. None: not tuned, or r = 1.
    tuned_at: dict[str, Any] | None = field(default=None, hash=False)
    # Where the model's weights start (sweeper.sweeps.model_facts): the checkpoint's name (a
    # local path's ``path`` instead), kind, digest (sha256:<hex>, the spec's pinned
    # checkpoint_digest) and its registration's declaration (trained_on, private_records_seen).
    # None: random initial weights.
    checkpoint: dict[str, Any] | None = field(default=None, hash=False)
    # Public pre-training (model.pretrain_on, workers.pretraining): the public dataset the model
    # is first trained on without noise (epsilon 0); the trials start from those weights, whose
    # digest each model card gives. None: no pre-training.
    pretrained_on: str | None = None
    # What DP-SGD trains, in words (all, head, lora (r 8), or the name patterns), and how many
    # parameters: the fewest and the most a trial of the grid trains (they differ where a
    # lora_r axis gives several ranks) of the model's total (at the most). None: not counted.
    trainable: str | None = None
    trained_parameters: int | None = None
    trained_parameters_max: int | None = None
    total_parameters: int | None = None
    # -- set when the sweep is stored --
    # Trials stored for the grid (papernot-steinke: the rows a search may draw from).
    planned_trials: int | None = None
    # The grid's charge schedule (sweeper.privacy.charges.ChargeSchedule.to_json): decimal
    # strings, so the ledger's sums stay exact.
    charges: dict[str, Any] | None = field(default=None, hash=False)
    # The stored form of :attr:`key`, checked against arm and level when read back.
    grid: str | None = None
    # The records the reservation covers; every trial checks that it trains on them.
    dataset_sha256: str | None = None

    def run_inputs(self) -> AccountingInputs:
        """One run of the grid (its T steps and E evaluation releases) as accounting inputs.

        The accountant is the plan's, a stored legacy name read as a plan's
        (:func:`dpsweep.accountants.resolve` in :data:`~dpsweep.accountants.PLAN`: ``rdp``
        is dp_accounting's RDP here).

        Raises:
            PrivacyError: evaluation releases without a usable noise multiplier (fail closed).
        """
        return AccountingInputs(
            noise_multiplier=self.noise_multiplier,
            sample_rate=self.sample_rate,
            steps=self.steps_per_trial,
            delta=self.delta,
            eval_noise_multiplier=self.eval_noise_multiplier,
            evaluations=int(self.eval_releases or 0),
            accountant=resolve(self.accountant, PLAN),
        )

    def __post_init__(self) -> None:
        if self.grid is not None and self.grid != str(self.key):
            raise ValueError(
                f"grid {self.grid!r} does not match its arm and level ({str(self.key)!r})"
            )

    @property
    def key(self) -> GridKey:
        """The grid's key (its arm and epsilon level)."""
        return GridKey(self.arm, self.epsilon_budget)

    def stored(
        self,
        *,
        planned_trials: int,
        charges: dict[str, Any],
        dataset_sha256: str | None,
    ) -> GridPlan:
        """This plan as a stored sweep keeps it: with its trials, schedule and records."""
        return dataclasses.replace(
            self,
            planned_trials=planned_trials,
            charges=charges,
            grid=str(self.key),
            dataset_sha256=dataset_sha256,
        )

    def to_stored(self) -> dict[str, Any]:
        """The JSON object ``Sweep.plan`` holds for this grid (every field, in order)."""
        d = dataclasses.asdict(self)
        d["warnings"] = list(self.warnings)
        if d["distribution_shape"] is not None and math.isinf(d["distribution_shape"]):
            d["distribution_shape"] = "inf"  # float("inf") reads it back
        return d

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> GridPlan:
        """The grid plan a stored JSON object describes.

        Raises:
            PlanCorrupt: the object lacks a required figure or holds one of the wrong type
                (nothing may run on it).
        """
        try:
            return _GRID.validate_python(data)
        except (ValidationError, ValueError, TypeError) as e:
            raise PlanCorrupt(f"a stored grid plan is malformed: {e}") from e


_GRID: TypeAdapter[GridPlan] = TypeAdapter(GridPlan)


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """Every grid's plan, and the identity of the data they were planned for.

    ``dataset_sha256`` is the content hash of the loaded records (hex): the sweep reserves
    from the ledger of that content, and every trial checks that it trains on the same
    records. ``None`` only for plans made without loading the data. ``n_examples`` is the
    number of examples N (train + evaluation) as the planner took it (declared, so public);
    with a privacy unit, the number of units (delta's bound). Neither is stored beside the
    grids (each stored grid carries ``dataset_sha256``). ``privacy_unit``: what one unit of
    every epsilon protects (:attr:`GridPlan.privacy_unit`; every grid has the same).
    """

    grids: Sequence[GridPlan]
    dataset_sha256: str | None = None
    n_examples: int | None = None
    privacy_unit: str = EXAMPLE_UNIT

    @property
    def has_units(self) -> bool:
        """Whether every epsilon is per unit (a person), not per row."""
        return self.privacy_unit != EXAMPLE_UNIT

    @property
    def n_units(self) -> int | None:
        """N in units where the plan has a unit (None: example-level, or not known)."""
        return self.n_examples if self.has_units else None

    def __iter__(self) -> Iterator[GridPlan]:
        return iter(self.grids)

    def __len__(self) -> int:
        return len(self.grids)

    @property
    def epsilon_total(self) -> float:
        """The sweep's whole cost: the sum over its grids (what a dataset budget is charged)."""
        return sum(g.epsilon_total for g in self.grids)

    @property
    def delta_total(self) -> float:
        return sum(g.delta for g in self.grids)

    def grid(self, key: GridKey | str) -> GridPlan:
        """The plan of the grid ``key`` (a :class:`GridKey` or its stored string).

        Raises:
            KeyError: no such grid in this plan.
        """
        # Compared in the stored form: a level parsed back from it is rounded to 6 digits.
        want = str(key)
        for g in self.grids:
            if str(g.key) == want:
                return g
        raise KeyError(want)

    def to_stored(self) -> list[dict[str, Any]]:
        """The JSON list ``Sweep.plan`` holds: one object per grid."""
        return [g.to_stored() for g in self.grids]

    @classmethod
    def from_stored(cls, data: Sequence[dict[str, Any]] | None) -> SweepPlan:
        """The plan a stored ``Sweep.plan`` holds (None or empty: a plan with no grids).

        Raises:
            PlanCorrupt: a grid's object is malformed.
        """
        grids = tuple(GridPlan.from_stored(d) for d in data or ())
        sha = next((g.dataset_sha256 for g in grids if g.dataset_sha256), None)
        unit = grids[0].privacy_unit if grids else EXAMPLE_UNIT
        return cls(grids, dataset_sha256=sha, privacy_unit=unit)
