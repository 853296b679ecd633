"""Experiment 3 (paper 003, Figure 2): clipping bias of DP-SGD vs BAM at the same budget."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from report.common import (
    COLOURS,
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

TITLE = "## 3. Clipping bias: DP-SGD vs BAM (paper 003, Figure 2)"


def series(
    run: Run, trials: list[dict[str, Any]], name: str
) -> tuple[list[int], list[list[float]]]:
    """A trajectory's steps and, per step, its values over the trials (missing ones dropped)."""
    steps: list[int] = run.details[trials[0]["id"]]["trajectories"]["step"]
    values: list[list[float]] = [[] for _ in steps]
    for t in trials:
        traj = run.details[t["id"]]["trajectories"]
        for i, v in enumerate(traj.get(name, [])[: len(steps)]):
            if v is not None:
                values[i].append(float(v))
    return steps, values


def _method(arm: str) -> str:
    """``dp-sgd C=0.1`` -> ``dp-sgd``: the colour of an arm is its method, whatever its C."""
    return arm.split(" C=")[0]


def bias_figure(run: Run, path: Path) -> str:
    """Bias magnitude over training, one panel per clipping norm, mean ± std over seeds."""
    arms = run.done_by_arm()
    clips = sorted({float(t["params"]["clip"]) for ts in arms.values() for t in ts})
    methods = list(dict.fromkeys(_method(a) for a in arms))
    fig = figure(len(clips), width=4.6, height=3.6)
    for k, clip in enumerate(clips):
        ax = fig.add_subplot(1, len(clips), k + 1)
        for arm, ts in arms.items():
            ts = [t for t in ts if float(t["params"]["clip"]) == clip]
            if not ts:
                continue
            steps, values = series(run, ts, "clip_bias")
            pts = [(s, v) for s, v in zip(steps, values, strict=True) if v]
            mean = [statistics.fmean(v) for _, v in pts]
            sd = [statistics.stdev(v) if len(v) > 1 else 0.0 for _, v in pts]
            xs = [s for s, _ in pts]
            colour = COLOURS[methods.index(_method(arm))]
            ax.plot(xs, mean, color=colour, lw=1.4, label=_method(arm))
            ax.fill_between(
                xs,
                [m - s for m, s in zip(mean, sd, strict=True)],
                [m + s for m, s in zip(mean, sd, strict=True)],
                color=colour,
                alpha=0.15,
                lw=0,
            )
        ax.set(title=f"C = {clip:g}", xlabel="step", ylabel="bias ‖g_clip − g‖ (eval split)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, path)


def results_table(run: Run) -> str:
    rows = [
        "| arm | λ | runs | accuracy (best checkpoint) | accuracy (last step) | ECE | "
        "mean bias over training | final bias | share clipped | cos(g_priv, g) | "
        "step time (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lambdas = {a["name"]: (a.get("params") or {}).get("bam_lambda") for a in run.spec["arms"]}
    for arm, ts in run.done_by_arm().items():
        det = [run.details[t["id"]] for t in ts]

        def traj_mean(d: dict[str, Any], name: str) -> float:
            vals = [float(v) for v in d["trajectories"].get(name, []) if v is not None]
            return statistics.fmean(vals) if vals else float("nan")

        def traj_last(d: dict[str, Any], name: str) -> float:
            vals = [float(v) for v in d["trajectories"].get(name, []) if v is not None]
            return vals[-1] if vals else float("nan")

        rows.append(
            f"| {arm} | {lambdas[arm] if lambdas[arm] is not None else '–'} | {len(ts)} | "
            f"{mean_std([float(t['metrics']['accuracy']) for t in ts])} | "
            f"{mean_std([float(d['final_metrics']['accuracy']) for d in det])} | "
            f"{mean_std([float(t['metrics']['ece']) for t in ts])} | "
            f"{mean_std([traj_mean(d, 'clip_bias') for d in det])} | "
            f"{mean_std([traj_last(d, 'clip_bias') for d in det])} | "
            f"{mean_std([traj_mean(d, 'frac_clipped') for d in det])} | "
            f"{mean_std([traj_mean(d, 'grad_cos') for d in det])} | "
            f"{mean_std([float(d['step_time_ms_median']) for d in det])} |"
        )
    return "\n".join(rows)


def run(scale: str, work: Path, figures: Path) -> tuple[str, dict[str, Any]]:
    spec = load("clip-bias", scale)
    # One trial per pack and one pack at a time: each trial's step time is its own.
    r = run_spec(spec, work, details=True, workers=1, env={"DPSWEEP_MAX_PACK_SIZE": "1"})
    sigmas = {g["noise_multiplier"] for g in r.summary["plan"]}
    if len(sigmas) != 1:
        raise RuntimeError(f"every arm should share sigma; the plan gave {sigmas}")
    image = bias_figure(r, figures / "clip-bias.png")
    bias = {
        arm: statistics.fmean(
            float(v)
            for t in ts
            for v in r.details[t["id"]]["trajectories"]["clip_bias"]
            if v is not None
        )
        for arm, ts in r.done_by_arm().items()
        if ts
    }
    text = [
        TITLE,
        "",
        f"Scale: {scale}. DP-SGD (fixed clipping) and BAM at two ascent lengths λ, on digits "
        "(MLP), every arm at the same per-grid ε and so the same σ, at two clipping norms with "
        "the same lr·C. The bias is ‖g_clip − g‖, 003's bias vector: g is the mean unclipped "
        "gradient at the current weights θ (what an unbiased step would follow) and g_clip the "
        "mean of what the strategy releases before noise (for BAM, the clipped gradients taken "
        "at its per-example ascent points θ + λ g_i/‖g_i‖), both on a batch of the public "
        "evaluation split; cos(g_priv, g) adds the step's noise (004's diagnostic). Nothing "
        "here is computed on the private training batches. Each run "
        "ran alone (one trial per pack, one pack at a time), so its step time is its own.",
        "",
        spec_block(spec),
        "",
        "**Plan:**",
        "",
        plan_table(r),
        "",
        "**Results** (mean ± std over seeds):",
        "",
        results_table(r),
        "",
        image,
        "",
        f"Wall time {r.seconds:.0f} s ({len(r.trials)} runs).",
        "",
        *reading("clip_bias", scale),
    ]
    return "\n".join(text), {"seconds": r.seconds, **{f"bias_{a}": v for a, v in bias.items()}}
