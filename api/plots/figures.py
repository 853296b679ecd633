"""The two Pareto figures of a sweep: the privacy/utility front and the calibration front."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from api.plots.drawing import (
    NO_TRIALS_TEXT,
    add_legend,
    check_mode,
    direction,
    draw_front,
    epsilon_ticks,
    is_finite,
    label_styles,
    natural_labels,
    new_figure,
    no_data,
)
from sweeper.sweeps.results import FrontPoint

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def epsilon_front_figure(
    points: Sequence[FrontPoint],
    *,
    metric: str,
    mode: str = "max",
    title: str | None = None,
    arms: Iterable[str] | None = None,
) -> Figure:
    """The privacy/utility Pareto front: ε budget against the best objective, per arm.

    Each label (arm) is one line sorted by ε with hollow markers and, where the point's payload
    carries a positive ``objective_std``, error bars of one standard deviation over seeds. The
    non-dominated points are overlaid as large filled markers with a black edge (the artist with
    ``gid`` :data:`PARETO_GID`) and joined by a dashed step line (:data:`PARETO_STEP_GID`).
    Points with a non-finite x or y are skipped.

    Args:
        points: Output of :func:`sweeper.sweeps.results.epsilon_front`.
        metric: Name of the objective metric, used for the y-axis label.
        mode: ``"max"`` when a higher objective is better, ``"min"`` otherwise.
        title: Figure title; a default naming the metric when None.
        arms: Every arm of the sweep, which the colours are keyed by (:mod:`api.plots.palette`,
            as the dashboard keys them); the points' labels when None.

    Returns:
        A stand-alone matplotlib figure with an Agg canvas.

    Raises:
        ConfigError: If ``mode`` is neither ``"max"`` nor ``"min"``.
    """
    check_mode(mode)
    pts = [p for p in points if is_finite(p)]
    labels = natural_labels(pts)
    fig, ax = new_figure(len(labels))
    ax.set_xlabel("ε (per-grid budget)")
    ax.set_ylabel(f"{metric} ({direction(mode)})")
    ax.set_title(title if title is not None else f"Privacy/utility front: {metric} vs ε")
    if not pts:
        no_data(ax)
        return fig

    styles = label_styles([*labels, *(arms or ())])
    handles: list[Any] = []
    for label in labels:
        series = sorted((p for p in pts if str(p.label) == label), key=lambda p: (p.x, p.y))
        handles.append(_draw_arm_line(ax, label, series, *styles[label]))

    front = [p for p in pts if not p.dominated]
    draw_front(ax, front, [styles[str(p.label)][0] for p in front], where="post")
    epsilon_ticks(ax, [float(p.x) for p in pts])
    add_legend(ax, handles, dominated_hollow=True)
    return fig


def _draw_arm_line(ax: Axes, label: str, series: list[FrontPoint], colour: Any, marker: str) -> Any:
    """One arm's points (sorted by ε) as a line with hollow markers, and error bars where a
    point carries a positive ``objective_std``; returns the line, for the legend."""
    xs = [float(p.x) for p in series]
    ys = [float(p.y) for p in series]
    errs = [_objective_std(p) for p in series]
    if any(errs):
        ax.errorbar(
            xs,
            ys,
            yerr=errs,
            fmt="none",
            ecolor=colour,
            elinewidth=1.0,
            capsize=3,
            alpha=0.6,
            zorder=1,
            gid=f"errorbar:{label}",
        )
    (line,) = ax.plot(
        xs,
        ys,
        linestyle="-",
        linewidth=1.5,
        marker=marker,
        markersize=6,
        markerfacecolor="none",
        markeredgecolor=colour,
        color=colour,
        alpha=0.75,
        zorder=2,
        gid=f"series:{label}",
        label=label,
    )
    return line


def _objective_std(p: FrontPoint) -> float:
    """The point's standard deviation over seeds: its payload's ``objective_std`` when that is
    a positive finite number, else 0 (no error bar)."""
    std = p.payload.get("objective_std") if isinstance(p.payload, dict) else None
    try:
        err = float(std) if std is not None else 0.0
    except (TypeError, ValueError):
        err = 0.0
    return err if math.isfinite(err) and err > 0 else 0.0


def calibration_front_figure(
    points: Sequence[FrontPoint],
    *,
    metric: str,
    mode: str = "max",
    title: str | None = None,
    arms: Iterable[str] | None = None,
) -> Figure:
    """The calibration Pareto front: every trial's objective against its ECE.

    All trials are a faded scatter coloured by label (arm). The non-dominated trials are
    overlaid as large filled markers with a black edge (``gid`` :data:`PARETO_GID`) and joined,
    sorted by objective, by a dashed step line (:data:`PARETO_STEP_GID`) tracing the boundary
    of the dominated region. Points with a non-finite x or y are skipped.

    Args:
        points: Output of :func:`sweeper.sweeps.results.calibration_front`.
        metric: Name of the objective metric, used for the x-axis label.
        mode: ``"max"`` when a higher objective is better, ``"min"`` otherwise.
        title: Figure title; a default naming the metric when None.
        arms: Every arm of the sweep, which the colours are keyed by (:mod:`api.plots.palette`,
            as the dashboard keys them); the points' labels when None.

    Returns:
        A stand-alone matplotlib figure with an Agg canvas.

    Raises:
        ConfigError: If ``mode`` is neither ``"max"`` nor ``"min"``.
    """
    check_mode(mode)
    pts = [p for p in points if is_finite(p)]
    labels = natural_labels(pts)
    fig, ax = new_figure(len(labels))
    ax.set_xlabel(f"{metric} ({direction(mode)})")
    ax.set_ylabel("ECE (lower is better)")
    ax.set_title(title if title is not None else f"Calibration front: {metric} vs ECE")
    if not pts:
        no_data(ax, f"{NO_TRIALS_TEXT} with {metric} and ECE")
        return fig

    styles = label_styles([*labels, *(arms or ())])
    handles: list[Any] = []
    for label in labels:
        colour, marker = styles[label]
        series = [p for p in pts if str(p.label) == label]
        handles.append(
            ax.scatter(
                [float(p.x) for p in series],
                [float(p.y) for p in series],
                s=28,
                marker=marker,
                color=colour,
                alpha=0.45,
                linewidths=0,
                zorder=2,
                gid=f"trials:{label}",
                label=label,
            )
        )

    front = [p for p in pts if not p.dominated]
    # Boundary of the dominated region: with the objective maximised, a front point's ECE holds
    # on the interval ending at it ("pre"); minimised, on the interval starting at it ("post").
    draw_front(
        ax,
        front,
        [styles[str(p.label)][0] for p in front],
        where="pre" if mode == "max" else "post",
    )
    add_legend(ax, handles, dominated_hollow=False)
    return fig
