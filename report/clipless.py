"""Experiment 4 (paper 002): clipless DP-SGD on a Lipschitz MLP and a Lipschitz CNN vs the
same-size MLP with fixed clipping, across ε: accuracy and step time."""

from __future__ import annotations

import statistics
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

TITLE = "## 4. Clipless DP-SGD: Lipschitz networks vs clipped MLP (paper 002)"
# Spec -> its label in the tables and the figure.
SPECS = {
    "clipless-lipschitz": "lip_mlp + lipschitz",
    "clipless-lipschitz-tuned": "lip_mlp (X=4, τ=8) + lipschitz",
    "clipless-lipcnn": "lip_cnn (X=4, τ=8) + lipschitz",
    "clipless-mlp": "mlp + fixed",
}


def step_times(run: Run) -> list[float]:
    """Each released run's median step time (ms)."""
    return [
        float(d["step_time_ms_median"])
        for d in run.details.values()
        if d.get("step_time_ms_median") is not None
    ]


def results_table(runs: dict[str, Run]) -> str:
    rows = [
        "| ε | " + " | ".join(f"{n}: accuracy | {n}: best params" for n in runs) + " |",
        "|---|" + "---|---|" * len(runs),
    ]
    first = next(iter(runs.values()))
    for eps in first.levels():
        cells = []
        for r in runs.values():
            res = next((v for (a, e), v in r.results().items() if e == eps), None)
            if res is None or res.get("objective_mean") is None:
                cells += ["–", "–"]
            else:
                cells += [
                    f"**{res['objective_mean']:.3f}** ± {res['objective_std'] or 0:.3f}",
                    params_text(res["best_params"]),
                ]
        rows.append(f"| {eps:g} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def time_table(runs: dict[str, Run]) -> str:
    rows = [
        "| model + strategy | runs | median step time (ms) | p10–p90 (ms) | parameters |",
        "|---|---|---|---|---|",
    ]
    for name, r in runs.items():
        ts = sorted(step_times(r))
        q = statistics.quantiles(ts, n=10) if len(ts) > 1 else [ts[0]] * 9
        rows.append(
            f"| {name} | {len(ts)} | {statistics.median(ts):.2f} | "
            f"{q[0]:.2f}–{q[-1]:.2f} | {r.spec['model']['options']} |"
        )
    return "\n".join(rows)


def clipless_figure(runs: dict[str, Run], path: Path) -> str:
    fig = figure(2, width=4.6, height=3.6)
    ax = fig.add_subplot(1, 2, 1)
    for j, (name, r) in enumerate(runs.items()):
        pts = sorted(
            (e, v) for (a, e), v in r.results().items() if v.get("objective_mean") is not None
        )
        ax.errorbar(
            [e for e, _ in pts],
            [v["objective_mean"] for _, v in pts],
            yerr=[v["objective_std"] or 0.0 for _, v in pts],
            fmt="-o",
            ms=4,
            capsize=3,
            color=COLOURS[j],
            label=name,
        )
    ax.set(
        xlabel="per-grid ε (δ = 1e-5)",
        ylabel="best-of-grid accuracy",
        xticks=next(iter(runs.values())).levels(),
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax = fig.add_subplot(1, 2, 2)
    ax.boxplot([step_times(r) for r in runs.values()], showfliers=False)
    ax.set_xticks(
        range(1, len(runs) + 1),
        [n.replace(" + ", "\n+ ").replace(" (", "\n(") for n in runs],
        fontsize=7,
    )
    ax.set_ylabel("median step time per run (ms)")
    ax.grid(alpha=0.3, axis="y")
    return save(fig, path)


def run(scale: str, work: Path, figures: Path) -> tuple[str, dict[str, Any]]:
    runs: dict[str, Run] = {}
    for name, label in SPECS.items():
        spec = load(name, scale)
        # One trial per pack, one pack at a time: each run's step time is its own.
        runs[label] = run_spec(
            spec, work / name, details=True, workers=1, env={"DPSWEEP_MAX_PACK_SIZE": "1"}
        )
    image = clipless_figure(runs, figures / "clipless.png")
    text = [
        TITLE,
        "",
        f"Scale: {scale}. Digits, the same widths (64-128-128-10) for both MLPs, every run "
        "charged, per-grid ε ∈ {1, 3, 8}, 3 seeds per configuration. The clipless arms have one "
        "hyperparameter (lr); the clipped arm also searches C, so its grids hold three times "
        "the runs and get more noise at the same ε. The Lipschitz MLP runs twice: with its "
        "default input bound X = √64 = 8 and temperature 1, and with X = 4 and temperature 8, "
        "picked by small probes on this data that these grids do not charge (the spec says "
        "so). Since digits are images, 002's image architecture runs too: a 1-Lipschitz CNN "
        "(lip_cnn: one stage of a 3×3 convolution with 64 channels and a 2×2 stride-2 one, "
        "channel GroupSort, a linear head) with the tuned X = 4 and τ = 8. Every run ran "
        "alone (one trial per pack, one pack at a time) so that its step time is its own; step "
        "times are on this 2-core CPU.",
        "",
    ]
    for r in runs.values():
        text += [spec_block(r.spec), ""]
    text += [
        "**Plans:**",
        "",
        *[line for r in runs.values() for line in (plan_table(r), "")],
        "**Best-of-grid accuracy** (mean ± std over the best configuration's seeds):",
        "",
        results_table(runs),
        "",
        "**Step time:**",
        "",
        time_table(runs),
        "",
        image,
        "",
        "Wall time: "
        + ", ".join(f"{n} {r.seconds:.0f} s ({len(r.trials)} runs)" for n, r in runs.items())
        + ".",
        "",
        *reading("clipless", scale),
    ]
    facts = {f"seconds_{n}": r.seconds for n, r in runs.items()}
    facts.update({f"step_ms_{n}": statistics.median(step_times(r)) for n, r in runs.items()})
    return "\n".join(text), facts
