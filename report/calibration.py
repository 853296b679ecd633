"""Experiment 2 (paper 000, Table 2 and Figure 6): calibration vs the clipping norm."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from report.common import (
    Run,
    figure,
    load,
    mean_std,
    plan_table,
    reading,
    run_spec,
    save,
    spec_block,
)

TITLE = "## 2. Calibration vs the clipping norm (paper 000, Table 2 and Figure 6)"


def by_config(run: Run) -> dict[str, list[dict[str, Any]]]:
    """Finished trials per configuration, ``arm (lr·C = x)``, seeds pooled, ordered by lr·C."""
    out: dict[str, list[dict[str, Any]]] = {}
    for t in run.done():
        p = t["params"]
        out.setdefault(f"{t['arm']} (lr·C = {p['lr'] * p['clip']:g})", []).append(t)
    return dict(sorted(out.items(), key=lambda kv: (kv[0].split(" (")[-1], kv[0])))


def metric_table(run: Run, metrics: list[str]) -> str:
    rows = [
        "| arm | params | runs | " + " | ".join(metrics) + " |",
        "|" + "---|" * (3 + len(metrics)),
    ]
    for arm, ts in by_config(run).items():
        params = ", ".join(f"{k}={v:g}" for k, v in ts[0]["params"].items())
        cells = [
            mean_std([float(t["metrics"][m]) for t in ts if t["metrics"].get(m) is not None])
            for m in metrics
        ]
        rows.append(f"| {arm} | {params} | {len(ts)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def reliability_figure(run: Run, path: Path) -> str:
    """One reliability diagram per configuration, bins pooled over its runs (count-weighted)."""
    configs = by_config(run)
    cols = 2
    fig = figure(cols, (len(configs) + cols - 1) // cols, width=4.2, height=3.8)
    for i, (arm, ts) in enumerate(configs.items()):
        ax = fig.add_subplot((len(configs) + cols - 1) // cols, cols, i + 1)
        pooled: dict[float, list[float]] = {}
        for t in ts:
            for b in run.details[t["id"]]["reliability"]:
                if b["count"]:
                    acc = pooled.setdefault(b["lower"], [b["upper"], 0.0, 0.0, 0.0])
                    acc[1] += b["count"]
                    acc[2] += b["count"] * b["accuracy"]
                    acc[3] += b["count"] * b["confidence"]
        lows = sorted(pooled)
        accs = [pooled[lo][2] / pooled[lo][1] for lo in lows]
        ax.bar(
            lows,
            accs,
            width=[pooled[lo][0] - lo for lo in lows],
            align="edge",
            edgecolor="white",
            label="accuracy",
        )
        ax.plot(
            [pooled[lo][3] / pooled[lo][1] for lo in lows],
            accs,
            "o",
            color="tab:red",
            ms=4,
            label="mean confidence",
        )
        ax.plot([0, 1], [0, 1], "--", color="grey", lw=1)
        ece = statistics.fmean(float(t["metrics"]["ece"]) for t in ts)
        ax.set_title(f"{arm}: ECE {ece:.3f}", fontsize=10)
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence")
        if i % cols == 0:
            ax.set_ylabel("accuracy")
        if i == 0:
            ax.legend(loc="upper left", fontsize=8)
    return save(fig, path)


# Spec -> (its figure, its label in the facts, what the section says about its setting).
SPECS = {
    "calibration": (
        "calibration-reliability.png",
        "",
        "Fixed clipping on digits (MLP)",
    ),
    "calibration-cnn1d": (
        "calibration-cnn1d-reliability.png",
        "cnn1d ",
        "The same protocol with a GroupNorm CNN (cnn1d) on MNIST-1D, evaluated on its public "
        "test records: fixed clipping",
    ),
}


def section(name: str, scale: str, work: Path, figures: Path) -> tuple[list[str], Run]:
    """One spec's sweep, its plan, results, reliability figure and reading."""
    image_name, _, setting = SPECS[name]
    spec = load(name, scale)
    r = run_spec(spec, work / name, details=True)
    sigmas = {g["arm"]: g["noise_multiplier"] for g in r.summary["plan"]}
    if len(set(sigmas.values())) != 1:
        raise RuntimeError(f"the two arms should share sigma; the plan gave {sigmas}")
    image = reliability_figure(r, figures / image_name)
    configs = by_config(r)
    ece = {a: statistics.fmean(float(t["metrics"]["ece"]) for t in ts) for a, ts in configs.items()}
    acc = {
        a: statistics.fmean(float(t["metrics"]["accuracy"]) for t in ts)
        for a, ts in configs.items()
    }
    products = sorted({float(f"{t['params']['lr'] * t['params']['clip']:.6g}") for t in r.done()})
    text = [
        f"{setting} with a small and a large clipping norm at the **same σ** (both arms are "
        "grids of the same size at the same ε, so the planner gives them one noise multiplier) "
        f"and the **same lr·C** ({', then '.join(f'{v:g}' for v in products)}), "
        f"{spec.get('seeds', 1)} seeds per configuration. Each run is charged; the grid's ε is "
        "the composition of all its runs.",
        "",
        spec_block(spec),
        "",
        "**Plan** (σ per arm and level; the grid's ε verified by a second accountant):",
        "",
        plan_table(r),
        "",
        "**Results** (mean ± std over seeds, at the best checkpoint on the evaluation split):",
        "",
        metric_table(r, ["accuracy", "ece", "mce"]),
        "",
        image,
        "",
        "Measured here (mean over seeds): "
        + "; ".join(f"{k}: accuracy {acc[k]:.3f}, ECE {ece[k]:.3f}" for k in ece)
        + f". Wall time {r.seconds:.0f} s ({len(r.trials)} runs).",
        "",
        *reading(name.replace("-", "_"), scale),
    ]
    return text, r


def run(scale: str, work: Path, figures: Path) -> tuple[str, dict[str, Any]]:
    text = [TITLE, "", f"Scale: {scale}.", ""]
    facts: dict[str, Any] = {}
    for i, (name, (_, label, _)) in enumerate(SPECS.items()):
        lines, r = section(name, scale, work, figures)
        if i:
            text += [f"### {label.strip()} on MNIST-1D (a GroupNorm CNN)", ""]
        else:
            text += ["### mlp on digits", ""]
        text += lines
        facts[f"{label.replace(' ', '_')}seconds"] = r.seconds
        for a, ts in by_config(r).items():
            facts[f"ece_{label}{a}"] = statistics.fmean(float(t["metrics"]["ece"]) for t in ts)
    return "\n".join(text), facts
