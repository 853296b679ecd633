"""Experiment 7 (issue 54): protect people, not rows. User-level DP against example-level DP.

The 4,000 MNIST-1D records of ``mnist1d-people``, grouped into 381 synthetic people of 1 to 50
rows, three ways at per-grid ε 1 / 3 / 8 (δ = 1e-5), 3 learning rates × 3 seeds, ``cnn1d``:

* example level: the same records written to an npz without naming the person array, so each
  row is its own unit (plain DP-SGD); its ε is per row. What it gives a person with k rows is
  group privacy, computed tightly from each grid's planned σ, q, T and trial count
  (:func:`workers.accounting.group.group_epsilon`) for the heaviest person (50 rows) and the
  median one;
* user level, ``unit_bounding: mean`` and ``capped`` (``rows_per_unit`` 8): every ε is per
  person, whatever their rows.

Every sweep evaluates on the public ``mnist1d-test``, so nothing else is released.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from report.common import (
    COLOURS,
    Run,
    figure,
    load,
    params_text,
    plan_table,
    reading,
    run_spec,
    save,
    spec_block,
)

TITLE = "## 7. Protect people, not rows: user-level DP"
EXAMPLE = "units-example"
#: The sweeps, in the table's order: (spec name, label).
VARIANTS = (
    (EXAMPLE, "example-level DP-SGD (each row its own unit)"),
    ("units-mean", "user-level, unit_bounding mean"),
    ("units-capped", "user-level, unit_bounding capped"),
)
#: The npz the example-level sweep reads: mnist1d-people's records, written per run.
RECORDS = "mnist1d-people-records.npz"


@dataclass(frozen=True)
class People:
    """How ``mnist1d-people`` groups its records (public by construction: a fixed seed)."""

    counts: np.ndarray  # rows of each person

    @property
    def heaviest(self) -> int:
        return int(self.counts.max())

    @property
    def median(self) -> int:
        # A half-way median rounds up: the person it describes has at least that many rows.
        return math.ceil(float(np.median(self.counts)))

    def rows_used(self, rows_per_unit: int) -> float:
        """The mean rows a sampled person contributes when at most ``rows_per_unit`` are used."""
        return float(np.minimum(self.counts, rows_per_unit).mean())


def export_records(work: Path) -> tuple[Path, People]:
    """Write mnist1d-people's records (``x``, ``y`` and the ``person`` array) to an npz in
    ``work``: the example-level sweep reads ``x`` and ``y`` and, naming no unit, not ``person``.
    """
    # deferred: numpy-heavy loaders; the report's other experiments only run dpsweep's CLI
    from workers.datasets.builtin import mnist1d_parts
    from workers.datasets.people import mnist1d_people_units

    x, y, _, _ = mnist1d_parts()
    person = np.asarray(mnist1d_people_units())
    work.mkdir(parents=True, exist_ok=True)
    path = work / RECORDS
    np.savez(path, x=x, y=y, person=person)
    return path, People(np.bincount(person))


@dataclass(frozen=True)
class PersonEpsilon:
    """One example-level grid's ε: per row (its plan's) and per person of a given size."""

    per_row: float
    row_check: float  # group_epsilon at one row: the plan's figure again, as a check
    by_rows: dict[int, float]


def person_epsilons(run: Run, rows: tuple[int, ...]) -> dict[float, PersonEpsilon]:
    """Per ε level of an example-level sweep: the ε a person of each of ``rows`` rows gets.

    The plan's mechanism composed as the plan composed it: a compose grid charges all its K
    trials' T steps of one σ at one q, so ``group_epsilon(..., steps=T, compositions=K)``.

    Raises:
        RuntimeError: a grid this computation does not cover (another accounting, noisy
            evaluations, another σ for the gradient, a unit other than the row, hidden trial
            count): no figure rather than a wrong one.
    """
    # deferred: dp_accounting; only this experiment needs it in the report's process
    from workers.accounting.group import group_epsilon

    out: dict[float, PersonEpsilon] = {}
    for g in run.summary["plan"]:
        sigma = float(g["noise_multiplier"])
        covered = (
            g.get("accounting") == "compose"
            and not g.get("eval_releases")
            and g.get("privacy_unit") == "example"
            and float(g.get("gradient_noise_multiplier") or sigma) == sigma
            and isinstance(g.get("trials"), int)
        )
        if not covered:
            raise RuntimeError(f"grid {g['arm']} at ε {g['epsilon_budget']}: not a case covered")
        mechanism: dict[str, Any] = {
            "noise_multiplier": sigma,
            "sample_rate": float(g["sample_rate"]),
            "steps": int(g["steps_per_trial"]),
            "delta": float(g["delta"]),
            "compositions": int(g["trials"]),
        }
        out[float(g["epsilon_budget"])] = PersonEpsilon(
            per_row=float(g["epsilon_total"]),
            row_check=group_epsilon(**mechanism, rows=1),
            by_rows={k: group_epsilon(**mechanism, rows=k) for k in rows},
        )
    return out


def protecting_sigma(grid: dict[str, Any], rows: int, target: float) -> tuple[float, float]:
    """The σ at which an example-level grid (its q, T and K) would give a person of ``rows``
    rows ε per person ``target``, and the ε per row it would then have (both within 1 %).

    Bisection on σ over :func:`~workers.accounting.group.group_epsilon` (decreasing in σ); the
    σ returned is the upper end, so its ε per person is at most ``target``.
    """
    # deferred: dp_accounting; only this experiment needs it in the report's process
    from workers.accounting import pld_epsilon
    from workers.accounting.group import group_epsilon

    mechanism: dict[str, Any] = {
        "sample_rate": float(grid["sample_rate"]),
        "steps": int(grid["steps_per_trial"]),
        "delta": float(grid["delta"]),
        "compositions": int(grid["trials"]),
    }
    lo, hi = 0.3, 3000.0
    if group_epsilon(noise_multiplier=hi, rows=rows, **mechanism) > target:
        return math.inf, 0.0
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        if group_epsilon(noise_multiplier=mid, rows=rows, **mechanism) > target:
            lo = mid
        else:
            hi = mid
    per_row = pld_epsilon(
        noise_multiplier=hi,
        sample_rate=mechanism["sample_rate"],
        steps=mechanism["steps"] * mechanism["compositions"],
        target_delta=mechanism["delta"],
    )
    return hi, per_row


def protection_table(run: Run, people: People) -> tuple[str, dict[str, Any]]:
    """Per level: the σ (and ε per row) the example-level grid would need to give the median
    and the heaviest person that ε per person, against the σ it was planned with."""
    levels = run.levels()
    rows = [
        "| person | " + " | ".join(f"ε {e:g} per person" for e in levels) + " |",
        "|---|" + "---|" * len(levels),
    ]
    planned = [f"σ {float(_plan(run, e)['noise_multiplier']):.3g}" for e in levels]
    rows.append("| planned (ε per row = the level) | " + " | ".join(planned) + " |")
    facts: dict[str, Any] = {}
    for label, k in (("median", people.median), ("heaviest", people.heaviest)):
        cells = []
        for e in levels:
            sigma, per_row = protecting_sigma(_plan(run, e), k, e)
            facts[f"protect_{k}_rows_{e:g}"] = [sigma, per_row]
            cells.append(f"σ {sigma:.3g} (ε per row {per_row:.2g})")
        rows.append(f"| {label} ({k} rows) | " + " | ".join(cells) + " |")
    return "\n".join(rows), facts


def _best(run: Run, eps: float) -> dict[str, Any] | None:
    r = run.results().get(("fixed", eps))
    return None if r is None or r.get("objective_mean") is None else r


def _plan(run: Run, eps: float) -> dict[str, Any]:
    return next(g for g in run.summary["plan"] if float(g["epsilon_budget"]) == eps)


def _eps(value: float) -> str:
    """An ε for the table: 3 significant digits, whole numbers from 100 (``3,485``)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _accuracy(r: dict[str, Any] | None) -> str:
    if r is None:
        return "–"
    return f"**{r['objective_mean']:.3f}** ± {r['objective_std'] or 0:.3f}"


def results_table(runs: dict[str, Run], group: dict[float, PersonEpsilon], people: People) -> str:
    """One row per method and level: what its ε covers, the ε per person it guarantees (the
    median and the heaviest person), and its best-of-grid accuracy (mean ± std over seeds)."""
    med, top = people.median, people.heaviest
    rows = [
        f"| method | per-grid ε (planned) | ε covers | ε per person, median ({med} rows) | "
        f"ε per person, heaviest ({top} rows) | accuracy | best params |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in VARIANTS:
        run = runs[name]
        for e in run.levels():
            r = _best(run, e)
            grid = float(_plan(run, e)["epsilon_total"])
            if name == EXAMPLE:
                covers = "one row"
                per_person = [_eps(group[e].by_rows[k]) for k in (med, top)]
            else:
                covers = f"one {_plan(run, e)['privacy_unit']}, all their rows"
                per_person = [f"{grid:.3g}"] * 2
            rows.append(
                f"| {label} | {e:g} ({grid:.3g}) | {covers} | "
                + " | ".join(per_person)
                + f" | {_accuracy(r)} | {params_text(None if r is None else r['best_params'])} |"
            )
    return "\n".join(rows)


def accuracy_figure(
    runs: dict[str, Run], group: dict[float, PersonEpsilon], people: People, path: Path
) -> str:
    """Best-of-grid accuracy against the ε per person each grid guarantees (log x)."""
    fig = figure(1, width=6.4, height=4.2)
    ax = fig.add_subplot(1, 1, 1)
    for j, (name, label) in enumerate(VARIANTS):
        run = runs[name]
        pts = [(e, r) for e in run.levels() if (r := _best(run, e)) is not None]
        acc = [r["objective_mean"] for _, r in pts]
        err = [r["objective_std"] or 0.0 for _, r in pts]
        style: dict[str, Any] = {"color": COLOURS[j], "ms": 5, "capsize": 3, "lw": 1.2}
        if name != EXAMPLE:
            xs = [float(_plan(run, e)["epsilon_total"]) for e, _ in pts]
            ax.errorbar(xs, acc, yerr=err, fmt="-o", label=f"{label} (ε per person)", **style)
            continue
        for k, fmt, mfc, what in (
            (people.heaviest, "-s", COLOURS[j], "heaviest"),
            (people.median, "--s", "white", "median"),
        ):
            xs = [group[e].by_rows[k] for e, _ in pts]
            ax.errorbar(
                xs,
                acc,
                yerr=err,
                fmt=fmt,
                mfc=mfc,
                label=f"example level: {what} person ({k} rows)",
                **style,
            )
    ax.set_xscale("log")
    ax.set(
        title="mnist1d-people, cnn1d: accuracy per guaranteed ε per person",
        xlabel="ε per person (per grid, δ = 1e-5; log scale)",
        ylabel="best-of-grid accuracy (mnist1d-test)",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")
    return save(fig, path)


def facts_of(
    runs: dict[str, Run], group: dict[float, PersonEpsilon], people: People
) -> dict[str, Any]:
    """The figures the report's log (and the issue) read."""
    facts: dict[str, Any] = {"people": len(people.counts), "median_rows": people.median}
    for name, run in runs.items():
        facts[f"{name}_seconds"] = round(run.seconds, 1)
        for e in run.levels():
            r = _best(run, e)
            facts[f"{name}_{e:g}"] = None if r is None else r["objective_mean"]
            facts[f"{name}_{e:g}_sigma"] = _plan(run, e)["noise_multiplier"]
    for e, p in group.items():
        facts[f"example_{e:g}_row_check"] = [p.per_row, p.row_check]
        for k, v in p.by_rows.items():
            facts[f"example_{e:g}_person_{k}_rows"] = v
    return facts


def _rows_per_step(runs: dict[str, Run], specs: dict[str, dict[str, Any]], people: People) -> str:
    """How the methods' expected rows per step were matched, from their plans."""
    ex = _plan(runs[EXAMPLE], runs[EXAMPLE].levels()[0])
    rows_ex = float(ex["sample_rate"]) * int(ex["n_train"])
    user = _plan(runs["units-mean"], runs["units-mean"].levels()[0])
    cap = int(specs["units-mean"]["training"]["rows_per_unit"])
    units = float(user["sample_rate"]) * int(user["n_train"])
    used = people.rows_used(cap)
    return (
        f"Expected rows per step are matched: the example level samples each row at q = "
        f"{float(ex['sample_rate']):.4g}, {rows_ex:.0f} rows per step; the user level samples "
        f"each person at q = {float(user['sample_rate']):.4g}, {units:.0f} people per step, "
        f"each contributing at most rows_per_unit = {cap} of their rows, {used:.2f} on average "
        f"(the mean of min(rows, {cap}) over the {len(people.counts)} people), "
        f"{units * used:.0f} rows per step. {_steps_text(runs)}"
    )


def _steps_text(runs: dict[str, Run]) -> str:
    """The steps per run of each sweep (the same at full scale: ``training.steps``)."""
    steps = {n: int(_plan(r, r.levels()[0])["steps_per_trial"]) for n, r in runs.items()}
    if len(set(steps.values())) == 1:
        return f"Every run takes {next(iter(steps.values()))} steps."
    return "Steps per run: " + ", ".join(f"{n.split('-')[1]} {t}" for n, t in steps.items()) + "."


def _lrs(spec: dict[str, Any]) -> str:
    """``{0.1, 0.3, 1}``: the spec's learning rates."""
    return "{" + ", ".join(f"{v:g}" for v in spec["arms"][0]["grid"]["lr"]) + "}"


def _grid_text(spec: dict[str, Any]) -> str:
    """``3 learning rates × 3 seeds`` from the spec as run."""
    lrs = spec["arms"][0]["grid"]["lr"]
    return f"{len(lrs)} learning rates × {spec.get('seeds', 1)} seeds"


def run(scale: str, work: Path, figures: Path) -> tuple[str, dict[str, Any]]:
    specs = {name: load(name, scale) for name, _ in VARIANTS}
    records, people = export_records(work)
    specs[EXAMPLE]["dataset"]["path"] = str(records)
    runs = {name: run_spec(copy.deepcopy(spec), work / name) for name, spec in specs.items()}
    group = person_epsilons(runs[EXAMPLE], (people.median, people.heaviest))
    facts = facts_of(runs, group, people)
    protection, protect_facts = protection_table(runs[EXAMPLE], people)
    facts.update(protect_facts)
    facts["seconds"] = sum(r.seconds for r in runs.values())
    link = accuracy_figure(runs, group, people, figures / "units.png")
    grid = _grid_text(specs[EXAMPLE])
    levels = ", ".join(f"{e:g}" for e in runs[EXAMPLE].levels())
    walls = [f"{n.split('-')[1]} {r.seconds:.0f} s ({len(r.trials)} runs)" for n, r in runs.items()]
    shown = copy.deepcopy(specs[EXAMPLE])
    shown["dataset"]["path"] = RECORDS
    text = [
        TITLE,
        "",
        f"Scale: {scale}. `mnist1d-people`: MNIST-1D's 4,000 private records grouped into "
        f"{len(people.counts)} synthetic people of 1 to {people.heaviest} rows (median "
        f"{people.median}, mean {people.counts.mean():.1f}; each person's rows mostly of one "
        f"or two classes). `cnn1d`, DP-SGD with fixed clipping (C = 1), {grid} per grid at "
        f"per-grid ε {levels} (δ = 1e-5), every seed charged; accuracy on the 1,000 public "
        "records of `mnist1d-test`, which no sweep trains on, so the steps are all that is "
        "released. Three methods: **example level**, plain "
        "DP-SGD on the same records written to an npz without their person array (each row its "
        "own unit: its ε is per row); **user level** with the privacy unit `person`, "
        "`unit_bounding: mean` (each of a sampled person's rows clipped to C, then averaged) "
        "and `capped` (the mean gradient of the person's rows clipped once). "
        + _rows_per_step(runs, specs, people),
        "",
        "**ε per person.** A user-level grid's ε protects every person with all their rows "
        "(one contribution of norm ≤ C per sampled person). The example-level grid's ε is per "
        "row; what it gives a person with k rows is group privacy, computed here tightly, not "
        "as k·ε: the PLD of the worst case (all k rows' clipped gradients aligned; removing the "
        "person shifts a step by j·C with probability Binomial(j; k, q)), composed over the "
        "grid's K trials × T steps as its plan composes them, at the same δ "
        "(`workers/accounting/group.py`, Ganesh 2024). At one row it gives the plan's ε back: "
        + ", ".join(
            f"{p.row_check:.4g} against {p.per_row:.4g} at level {e:g}" for e, p in group.items()
        )
        + f". Every ε below is per grid ({grid}), δ = 1e-5.",
        "",
        results_table(runs, group, people),
        "",
        link,
        "",
        "**What example-level DP-SGD would need to protect a person.** The σ at which the "
        "example-level grid (its q, steps and trials unchanged) would give the median and the "
        "heaviest person each level as ε per person (group privacy as above, σ within 1 %), and "
        "the ε per row it would then state:",
        "",
        protection,
        "",
        "**Specs** (user level, mean; `capped` differs only in `unit_bounding`):",
        "",
        spec_block(specs["units-mean"]),
        "",
        f"Example level: `cnn1d`, the same training, on `{RECORDS}` (written by the report "
        "from the built-in's records), its learning rates "
        f"{_lrs(specs[EXAMPLE])} against the user level's {_lrs(specs['units-mean'])} (as many "
        "points, so σ depends on the unit alone; why they differ: the specs' comments and the "
        "reading):",
        "",
        spec_block(shown),
        "",
        "**Plans** (example level, then user level, mean; capped has the same σ, q and steps):",
        "",
        plan_table(runs[EXAMPLE]),
        "",
        plan_table(runs["units-mean"]),
        "",
        "Wall time: " + ", ".join(walls) + ".",
        "",
        *reading("units", scale),
    ]
    return "\n".join(text), facts
