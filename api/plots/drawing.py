"""The shared pieces of both Pareto figures: an Agg figure, styles per arm, the front's
artists (found by ``gid``), the legend and the ε axis.

Matplotlib is imported inside the functions: the light client install does not need it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from api.plots.palette import arm_styles, natural_order
from dpsweep.errors import ConfigError
from sweeper.sweeps.results import FrontPoint

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PARETO_GID = "pareto"
"""``gid`` of the scatter artist holding exactly the non-dominated points."""

PARETO_STEP_GID = "pareto-step"
"""``gid`` of the step line joining the non-dominated points, sorted by x."""

NO_TRIALS_TEXT = "no finished trials"
"""Text drawn on a figure that has nothing to plot."""

PARETO_LEGEND = "Pareto front (non-dominated)"
DOMINATED_LEGEND = "dominated"

_MODES = ("max", "min")
_FIGSIZE = (7.0, 4.5)
_LEGEND_INSIDE_MAX = 6
_LEGEND_ONE_COLUMN_MAX = 16


def check_mode(mode: str) -> None:
    """Refuse a mode other than ``"max"`` or ``"min"`` (ConfigError naming ``mode``)."""
    if mode not in _MODES:
        raise ConfigError(
            f"mode must be one of {', '.join(_MODES)}, got {mode!r}",
            field="mode",
        )


def direction(mode: str) -> str:
    """The axis label's note on which way is better."""
    return "higher is better" if mode == "max" else "lower is better"


def is_finite(p: FrontPoint) -> bool:
    """Whether a point has a finite x and y (others are not drawn)."""
    try:
        return math.isfinite(float(p.x)) and math.isfinite(float(p.y))
    except (TypeError, ValueError):
        return False


def new_figure(n_labels: int = 0) -> tuple[Figure, Axes]:
    """A stand-alone figure with an Agg canvas (no pyplot state).

    Wider when the legend, with many labels, goes outside the axes.
    """
    # deferred: matplotlib takes about half a second to import; only drawing a plot needs it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # deferred: matplotlib, as above

    width, height = _FIGSIZE
    if n_labels + 2 > _LEGEND_INSIDE_MAX:
        width += 2.5 if n_labels + 2 <= _LEGEND_ONE_COLUMN_MAX else 4.0
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.3, linewidth=0.6)
    return fig, ax


def natural_labels(points: Sequence[FrontPoint]) -> list[str]:
    """Distinct labels in natural order (``arm2`` before ``arm10``)."""
    return natural_order(str(p.label) for p in points)


def label_styles(labels: Iterable[str]) -> dict[str, tuple[Any, str]]:
    """A (colour, marker) per label from the arms' palette (:mod:`api.plots.palette`): tab10,
    or tab20 beyond ten labels, cycling the marker; keyed by the labels' natural order, as
    the dashboard keys its colours."""
    return {label: (s.colour, s.marker) for label, s in arm_styles(labels).items()}


def no_data(ax: Axes, text: str = NO_TRIALS_TEXT) -> None:
    """Say on an empty figure that there is nothing to plot."""
    ax.text(
        0.5,
        0.5,
        text,
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize="large",
        color="0.4",
        gid="no-data",
    )
    ax.set_xticks([])
    ax.set_yticks([])


def draw_front(
    ax: Axes,
    front: Sequence[FrontPoint],
    colours: Sequence[Any],
    *,
    where: Literal["pre", "post"],
) -> None:
    """Overlay the non-dominated points and join them with a step line sorted by x.

    The artists are always created (empty when ``front`` is), so they can always be found.
    """
    order = sorted(range(len(front)), key=lambda i: (front[i].x, front[i].y))
    xs = [float(front[i].x) for i in order]
    ys = [float(front[i].y) for i in order]
    ax.step(
        xs,
        ys,
        where=where,
        color="black",
        linestyle="--",
        linewidth=1.2,
        alpha=0.7,
        zorder=3,
        gid=PARETO_STEP_GID,
        label="_pareto_step",
    )
    ax.scatter(
        xs,
        ys,
        s=110,
        c=[colours[i] for i in order] if order else None,
        edgecolors="black",
        linewidths=1.6,
        zorder=4,
        gid=PARETO_GID,
        label="_pareto",
    )


def add_legend(ax: Axes, handles: list[Any], *, dominated_hollow: bool) -> None:
    """Series entries, then one for the Pareto marker and one for dominated points."""
    from matplotlib.lines import Line2D  # deferred: matplotlib (see new_figure)

    handles = [
        *handles,
        Line2D(
            [],
            [],
            color="black",
            linestyle="--",
            marker="o",
            markersize=9,
            markerfacecolor="0.75",
            markeredgecolor="black",
            markeredgewidth=1.6,
            label=PARETO_LEGEND,
        ),
        Line2D(
            [],
            [],
            linestyle="none",
            marker="o",
            markersize=6,
            markerfacecolor="none" if dominated_hollow else "0.4",
            markeredgecolor="0.4",
            alpha=0.6 if dominated_hollow else 0.45,
            label=DOMINATED_LEGEND,
        ),
    ]
    if len(handles) <= _LEGEND_INSIDE_MAX:
        ax.legend(handles=handles, loc="best", fontsize="small", framealpha=0.85)
    else:
        ax.legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
            borderaxespad=0.0,
            fontsize="small",
            ncols=1 if len(handles) <= _LEGEND_ONE_COLUMN_MAX else 2,
        )


def epsilon_ticks(ax: Axes, xs: Sequence[float]) -> None:
    """Log-scale ε when the budgets span a decade or more; tick exactly the grid's budgets."""
    from matplotlib.ticker import NullFormatter  # deferred: matplotlib (see new_figure)

    levels = sorted(set(xs))
    if levels and levels[0] > 0 and levels[-1] / levels[0] >= 10:
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    if 0 < len(levels) <= 12:
        ax.set_xticks(levels, [f"{x:g}" for x in levels])
