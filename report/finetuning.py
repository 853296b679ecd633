"""Experiment 6: public pre-training at ε 0, then DP fine-tuning.

MNIST-1D's ``cnn1d`` four ways, at per-grid ε 1 / 3 / 8 with 3 seeds: from scratch, pre-trained
on the public ``mnist1d-public`` then fine-tuned with DP-SGD (every parameter), the same with
only the head trained (``trainable: head``), and the pre-trained model alone (no fine-tuning:
measured on ``mnist1d-test``); beside them the non-private ceilings (every private record, no
clipping, no noise), from scratch and from the pre-trained weights.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from report.strategies import Ceiling, ceiling

TITLE = "## 6. Public pre-training at ε 0, then DP fine-tuning"
#: The sweeps, in the table's order: (spec name, label).
VARIANTS = (
    ("finetuning-scratch", "from scratch"),
    ("finetuning-pretrained", "pre-trained, DP fine-tuned (all parameters)"),
    ("finetuning-head", "pre-trained, DP fine-tuned (head only)"),
)


@dataclass(frozen=True)
class Alone:
    """The pre-trained model without fine-tuning: its accuracy on the public test records."""

    accuracy: float
    digest: str
    public: str


def pretrained_alone(spec: dict[str, Any]) -> Alone:
    """The pre-trained weights every fine-tuning sweep starts from (the same cache entry the
    sweeps read), measured on the spec's public evaluation records. Public data only."""
    # deferred: torch; the report's other experiments only run dpsweep's CLI
    import torch

    from dpsweep.spec import SweepSpec
    from sweeper.datasets.resolution import resolve
    from workers.datasets.loading import load_dataset
    from workers.models.descriptors import ModelSpec
    from workers.models.registry import build_model
    from workers.pretraining import pretrain_ref, pretrained

    typed = SweepSpec.model_validate(spec)
    dataset = resolve(None, typed.dataset, typed.eval)
    data = load_dataset(dataset)
    ref = pretrain_ref(typed.model, dataset)
    if ref is None:
        raise RuntimeError(f"spec {spec['name']!r} names no model.pretrain_on")
    model = ModelSpec(typed.model.name, dict(typed.model.options))
    weights = pretrained(model, ref)
    net = build_model(model, input_shape=data.input_shape, num_classes=data.num_classes, seed=0)
    net.load_state_dict(weights.state)
    net.eval()
    with torch.no_grad():
        pred = net(torch.from_numpy(data.x_test)).argmax(1)
    accuracy = float((pred == torch.from_numpy(data.y_test)).float().mean())
    return Alone(accuracy, weights.digest, ref.dataset.name)


def _best(run: Run, eps: float) -> dict[str, Any] | None:
    r = run.results().get(("fixed", eps))
    return None if r is None or r.get("objective_mean") is None else r


def results_table(runs: dict[str, Run], alone: Alone, ceilings: dict[str, Ceiling]) -> str:
    """Best-of-grid accuracy (mean ± std over the best point's seeds) per variant and ε, the
    pre-trained model alone and the non-private ceilings as rows of their own."""
    levels = next(iter(runs.values())).levels()
    rows = [
        "| | " + " | ".join(f"ε = {e:g}" for e in levels) + " |",
        "|---|" + "---|" * len(levels),
    ]
    for name, label in VARIANTS:
        run = runs.get(name)
        if run is None:
            continue
        cells = []
        for e in levels:
            r = _best(run, e)
            cells.append(
                "–"
                if r is None
                else f"**{r['objective_mean']:.3f}** ± {r['objective_std'] or 0:.3f}<br>"
                f"{params_text(r['best_params'])}"
            )
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    same = f"{alone.accuracy:.3f}"
    rows.append(f"| pre-trained alone (no fine-tuning, ε 0) | {' | '.join([same] * len(levels))} |")
    for key, label in (("scratch", "from scratch"), ("pretrained", "from the pre-trained model")):
        c = ceilings[key]
        cell = f"{c.mean:.3f} ± {c.std:.3f} (lr {c.lr:g})"
        rows.append(f"| non-private ceiling, {label} | {' | '.join([cell] * len(levels))} |")
    return "\n".join(rows)


def accuracy_figure(
    runs: dict[str, Run], alone: Alone, ceilings: dict[str, Ceiling], path: Path
) -> str:
    """Best-of-grid accuracy vs ε per variant (mean ± std over seeds), the pre-trained model
    alone and the non-private ceilings as horizontal lines."""
    fig = figure(1, width=6.0, height=4.2)
    ax = fig.add_subplot(1, 1, 1)
    for j, (name, label) in enumerate(VARIANTS):
        run = runs.get(name)
        if run is None:
            continue
        pts = [(e, r) for e in run.levels() if (r := _best(run, e)) is not None]
        ax.errorbar(
            [e for e, _ in pts],
            [r["objective_mean"] for _, r in pts],
            yerr=[r["objective_std"] or 0.0 for _, r in pts],
            fmt="-o",
            color=COLOURS[j],
            ms=4,
            capsize=3,
            lw=1.2,
            label=label,
        )
    ax.axhline(alone.accuracy, color="black", ls="--", lw=1.2, label="pre-trained alone (ε 0)")
    ax.axhline(ceilings["scratch"].mean, color="grey", ls=":", lw=1.5, label="non-private, scratch")
    ax.axhline(
        ceilings["pretrained"].mean, color="grey", ls="-.", lw=1.2, label="non-private, pre-trained"
    )
    levels = next(iter(runs.values())).levels()
    ax.set(
        title="MNIST-1D, cnn1d",
        xlabel="per-grid ε (δ = 1e-5)",
        ylabel="best-of-grid accuracy (mnist1d-test)",
        xticks=levels,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return save(fig, path)


def _ceilings(specs: dict[str, dict[str, Any]], steps: int) -> dict[str, Ceiling]:
    """The non-private ceiling from scratch and from the pre-trained weights: each spec's model,
    batch size and step count, strategy ``nonprivate``, every lr of its grid, as many seeds."""
    return {
        "scratch": ceiling(specs["finetuning-scratch"], steps=steps),
        "pretrained": ceiling(specs["finetuning-pretrained"], steps=steps),
    }


def facts_of(runs: dict[str, Run], alone: Alone, ceilings: dict[str, Ceiling]) -> dict[str, Any]:
    """The figures the report's log (and the issue's targets) read."""
    facts: dict[str, Any] = {
        "pretrained_alone": alone.accuracy,
        "pretrained_digest": alone.digest,
        "ceiling_scratch": ceilings["scratch"].mean,
        "ceiling_pretrained": ceilings["pretrained"].mean,
    }
    for name, run in runs.items():
        for e in run.levels():
            r = _best(run, e)
            facts[f"{name}_{e:g}"] = None if r is None else r["objective_mean"]
    return facts


def run(scale: str, work: Path, figures: Path) -> tuple[str, dict[str, Any]]:
    specs = {name: load(name, scale) for name, _ in VARIANTS}
    if scale == "tiny":
        for spec in specs.values():
            spec["model"].get("pretrain", {})["epochs"] = 5
    runs = {name: run_spec(copy.deepcopy(spec), work / name) for name, spec in specs.items()}
    pre = runs["finetuning-pretrained"]
    steps = int(pre.summary["plan"][0]["steps_per_trial"])
    alone = pretrained_alone(specs["finetuning-pretrained"])
    ceilings = _ceilings(specs, steps)
    facts = facts_of(runs, alone, ceilings)
    facts["seconds"] = sum(r.seconds for r in runs.values())
    link = accuracy_figure(runs, alone, ceilings, figures / "finetuning.png")
    recipe = specs["finetuning-pretrained"]["model"]["pretrain"]
    walls = [f"{n.split('-')[1]} {r.seconds:.0f} s ({len(r.trials)} runs)" for n, r in runs.items()]
    text = [
        TITLE,
        "",
        f"Scale: {scale}. MNIST-1D's `cnn1d`, {steps} DP-SGD steps per run (fixed clipping), "
        "3 learning rates × 3 seeds per grid at per-grid ε 1, 3 and 8 (δ = 1e-5), every seed "
        "charged. The pre-trained sweeps start every trial from one model trained without noise "
        f"on the 1,000 public signals of `{alone.public}` (recipe: {params_text(recipe)}; its "
        f"weights `{alone.digest}`), which costs no ε: those records are public, and nothing "
        "the pre-training reads comes from the 4,000 private records. Accuracy is measured on "
        "the 1,000 public test records of `mnist1d-test`, which neither stage trains on.",
        "",
        results_table(runs, alone, ceilings),
        "",
        link,
        "",
        "The pre-trained model alone is the pre-training's weights measured as they are (no "
        "private record read, ε 0). The non-private ceilings train on all 4,000 private "
        f"records without clipping or noise for the same {steps} steps (strategy `nonprivate`, "
        "outside any sweep), best lr of each grid by mean over 3 seeds: from random weights, "
        "and from the pre-trained ones.",
        "",
        "**Specs** (the head-only sweep is the pre-trained one with `trainable: head`):",
        "",
        spec_block(specs["finetuning-pretrained"]),
        "",
        "From scratch: the same without `pretrain_on` and with lr ∈ {0.1, 0.3, 1} "
        "(examples/report/finetuning-scratch.yaml).",
        "",
        "**Plans** (pre-trained, all parameters; the other two have the same σ, q and steps: "
        "σ depends on the grid's size, not on what is trained):",
        "",
        plan_table(pre),
        "",
        "Wall time: " + ", ".join(walls) + ".",
        "",
        *reading("finetuning", scale),
    ]
    return "\n".join(text), facts
