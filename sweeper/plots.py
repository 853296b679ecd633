"""Pareto-front plots for the CLI and reports.

Two figures summarise a sweep:

* the privacy/utility front: per-grid ε budget (x, lower is better) against the best mean
  objective of each arm at that level (y), one series per arm, with seed error bars;
* the calibration front: every finished trial's objective (x) against its expected calibration
  error (y, lower is better), coloured by arm.

On both, the non-dominated points are overlaid by one scatter artist whose ``gid`` is
:data:`PARETO_GID` and joined by a step line whose ``gid`` is :data:`PARETO_STEP_GID`, so
callers and tests can find them on the returned figure.

Matplotlib is imported lazily inside the functions (the light client install does not need it)
and only through :class:`matplotlib.figure.Figure` with an Agg canvas: no ``pyplot``, no global
figure manager, no interactive backend, so the functions are safe to call from worker threads.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sweeper.results import FrontPoint, best_per_arm_level, calibration_front, epsilon_front
from workers.errors import ConfigError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "FORMATS",
    "PARETO_GID",
    "PARETO_STEP_GID",
    "calibration_front_figure",
    "epsilon_front_figure",
    "save_figure",
    "write_pareto_plots",
]

FORMATS: tuple[str, ...] = ("png", "svg", "pdf")
"""File formats :func:`save_figure` and :func:`write_pareto_plots` write."""

PARETO_GID = "pareto"
"""``gid`` of the scatter artist holding exactly the non-dominated points."""

PARETO_STEP_GID = "pareto-step"
"""``gid`` of the step line joining the non-dominated points, sorted by x."""

NO_TRIALS_TEXT = "no finished trials"
"""Text drawn on a figure that has nothing to plot."""

PARETO_LEGEND = "Pareto front (non-dominated)"
DOMINATED_LEGEND = "dominated"

_MODES = ("max", "min")
_PNG_DPI = 150
_FIGSIZE = (7.0, 4.5)
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")
_LEGEND_INSIDE_MAX = 6
_LEGEND_ONE_COLUMN_MAX = 16
_DIGITS = re.compile(r"(\d+)")
_TRIAL_KEYS = ("arm", "strategy", "epsilon_budget", "params")


def _check_mode(mode: str) -> None:
    if mode not in _MODES:
        raise ConfigError(
            f"mode must be one of {', '.join(_MODES)}, got {mode!r}",
            field="mode",
        )


def _direction(mode: str) -> str:
    return "higher is better" if mode == "max" else "lower is better"


def _finite(p: FrontPoint) -> bool:
    try:
        return math.isfinite(float(p.x)) and math.isfinite(float(p.y))
    except (TypeError, ValueError):
        return False


def _new_figure(n_labels: int = 0) -> tuple[Figure, Axes]:
    """A stand-alone figure with an Agg canvas (no pyplot state).

    Wider when the legend, with many labels, goes outside the axes.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width, height = _FIGSIZE
    if n_labels + 2 > _LEGEND_INSIDE_MAX:
        width += 2.5 if n_labels + 2 <= _LEGEND_ONE_COLUMN_MAX else 4.0
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.3, linewidth=0.6)
    return fig, ax


def _labels(points: Sequence[FrontPoint]) -> list[str]:
    """Distinct labels in natural order (``arm2`` before ``arm10``)."""

    def key(label: str) -> list[tuple[int, int | str]]:
        return [(0, int(tok)) if tok.isdigit() else (1, tok) for tok in _DIGITS.split(label) if tok]

    return sorted({str(p.label) for p in points}, key=lambda lab: (key(lab), lab))


def _styles(labels: Sequence[str]) -> dict[str, tuple[Any, str]]:
    """A (colour, marker) per label: tab10, or tab20 beyond ten labels, cycling the marker."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(labels) <= 10 else "tab20"]
    n = int(cmap.N)
    return {
        label: (cmap(i % n), _MARKERS[(i // n) % len(_MARKERS)]) for i, label in enumerate(labels)
    }


def _no_data(ax: Axes, text: str = NO_TRIALS_TEXT) -> None:
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


def _draw_front(
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


def _legend(ax: Axes, handles: list[Any], *, dominated_hollow: bool) -> None:
    """Series entries, then one for the Pareto marker and one for dominated points."""
    from matplotlib.lines import Line2D

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


def _epsilon_ticks(ax: Axes, xs: Sequence[float]) -> None:
    """Log-scale ε when the budgets span a decade or more; tick exactly the grid's budgets."""
    from matplotlib.ticker import NullFormatter

    levels = sorted(set(xs))
    if levels and levels[0] > 0 and levels[-1] / levels[0] >= 10:
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    if 0 < len(levels) <= 12:
        ax.set_xticks(levels, [f"{x:g}" for x in levels])


def epsilon_front_figure(
    points: Sequence[FrontPoint],
    *,
    metric: str,
    mode: str = "max",
    title: str | None = None,
) -> Figure:
    """The privacy/utility Pareto front: ε budget against the best objective, per arm.

    Each label (arm) is one line sorted by ε with hollow markers and, where the point's payload
    carries a positive ``objective_std``, error bars of one standard deviation over seeds. The
    non-dominated points are overlaid as large filled markers with a black edge (the artist with
    ``gid`` :data:`PARETO_GID`) and joined by a dashed step line (:data:`PARETO_STEP_GID`).
    Points with a non-finite x or y are skipped.

    Args:
        points: Output of :func:`sweeper.results.epsilon_front`.
        metric: Name of the objective metric, used for the y-axis label.
        mode: ``"max"`` when a higher objective is better, ``"min"`` otherwise.
        title: Figure title; a default naming the metric when None.

    Returns:
        A stand-alone matplotlib figure with an Agg canvas.

    Raises:
        ConfigError: If ``mode`` is neither ``"max"`` nor ``"min"``.
    """
    _check_mode(mode)
    pts = [p for p in points if _finite(p)]
    labels = _labels(pts)
    fig, ax = _new_figure(len(labels))
    ax.set_xlabel("ε (per-grid budget)")
    ax.set_ylabel(f"{metric} ({_direction(mode)})")
    ax.set_title(title if title is not None else f"Privacy/utility front: {metric} vs ε")
    if not pts:
        _no_data(ax)
        return fig

    styles = _styles(labels)
    handles: list[Any] = []
    for label in labels:
        colour, marker = styles[label]
        series = sorted((p for p in pts if str(p.label) == label), key=lambda p: (p.x, p.y))
        xs = [float(p.x) for p in series]
        ys = [float(p.y) for p in series]
        errs = []
        for p in series:
            std = p.payload.get("objective_std") if isinstance(p.payload, dict) else None
            try:
                err = float(std) if std is not None else 0.0
            except (TypeError, ValueError):
                err = 0.0
            errs.append(err if math.isfinite(err) and err > 0 else 0.0)
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
        handles.append(line)

    front = [p for p in pts if not p.dominated]
    _draw_front(ax, front, [styles[str(p.label)][0] for p in front], where="post")
    _epsilon_ticks(ax, [float(p.x) for p in pts])
    _legend(ax, handles, dominated_hollow=True)
    return fig


def calibration_front_figure(
    points: Sequence[FrontPoint],
    *,
    metric: str,
    mode: str = "max",
    title: str | None = None,
) -> Figure:
    """The calibration Pareto front: every trial's objective against its ECE.

    All trials are a faded scatter coloured by label (arm). The non-dominated trials are
    overlaid as large filled markers with a black edge (``gid`` :data:`PARETO_GID`) and joined,
    sorted by objective, by a dashed step line (:data:`PARETO_STEP_GID`) tracing the boundary
    of the dominated region. Points with a non-finite x or y are skipped.

    Args:
        points: Output of :func:`sweeper.results.calibration_front`.
        metric: Name of the objective metric, used for the x-axis label.
        mode: ``"max"`` when a higher objective is better, ``"min"`` otherwise.
        title: Figure title; a default naming the metric when None.

    Returns:
        A stand-alone matplotlib figure with an Agg canvas.

    Raises:
        ConfigError: If ``mode`` is neither ``"max"`` nor ``"min"``.
    """
    _check_mode(mode)
    pts = [p for p in points if _finite(p)]
    labels = _labels(pts)
    fig, ax = _new_figure(len(labels))
    ax.set_xlabel(f"{metric} ({_direction(mode)})")
    ax.set_ylabel("ECE (lower is better)")
    ax.set_title(title if title is not None else f"Calibration front: {metric} vs ECE")
    if not pts:
        _no_data(ax, f"{NO_TRIALS_TEXT} with {metric} and ECE")
        return fig

    styles = _styles(labels)
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
    _draw_front(
        ax,
        front,
        [styles[str(p.label)][0] for p in front],
        where="pre" if mode == "max" else "post",
    )
    _legend(ax, handles, dominated_hollow=False)
    return fig


def _format_of(path: Path) -> str:
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        allowed = ", ".join(f".{f}" for f in FORMATS)
        raise ConfigError(
            f"cannot write plot {str(path)!r}: unsupported suffix {path.suffix or '(none)'!r}; "
            f"allowed suffixes are {allowed}",
            field="plot",
        )
    return fmt


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write a figure to ``path``, its format taken from the suffix.

    Parent directories are created. PNG is rendered at 150 dpi; SVG and PDF are written without
    a creation date so that the same figure gives the same bytes.

    Args:
        fig: The figure to write.
        path: Destination ending in ``.png``, ``.svg`` or ``.pdf`` (case-insensitive).

    Returns:
        The path written.

    Raises:
        ConfigError: If the suffix is not one of the allowed ones (``field="plot"``).
    """
    path = Path(path)
    fmt = _format_of(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "png":
        fig.savefig(path, format="png", dpi=_PNG_DPI)
    elif fmt == "svg":
        fig.savefig(path, format="svg", metadata={"Date": None})
    else:
        fig.savefig(path, format="pdf", metadata={"CreationDate": None})
    return path


def _output_paths(out: Path, fmt: str) -> tuple[Path, Path]:
    if out.is_dir() or not out.suffix:
        return out / f"pareto_epsilon.{fmt}", out / f"pareto_calibration.{fmt}"
    return out, out.with_name(f"{out.stem}_calibration{out.suffix}")


def write_pareto_plots(
    trials: Iterable[dict[str, Any]],
    *,
    out: str | Path,
    metric: str = "accuracy",
    mode: str = "max",
    fmt: str = "png",
    title: str | None = None,
) -> list[Path]:
    """Compute both Pareto fronts from trial records and write one figure for each.

    Trial records are the plain dicts documented in :mod:`sweeper.results`. Unfinished trials
    and trials whose objective is missing or non-finite are skipped; with none left, the
    figures are still written and say so.

    Args:
        trials: Trial records (consumed once).
        out: A directory (existing, or any path without a suffix), into which
            ``pareto_epsilon.<fmt>`` and ``pareto_calibration.<fmt>`` are written; or a file
            path with a suffix, written with the ε front, the calibration front going to
            ``<stem>_calibration<suffix>`` beside it (the suffix then decides the format).
        metric: Objective metric name in each trial's ``metrics``.
        mode: ``"max"`` when a higher objective is better, ``"min"`` otherwise.
        fmt: ``"png"``, ``"svg"`` or ``"pdf"``, used when ``out`` is a directory.
        title: Common title prefix; each figure gets its default title when None.

    Returns:
        The paths written: the ε front first, then the calibration front.

    Raises:
        ConfigError: If ``fmt``, ``mode`` or the suffix of ``out`` is not allowed.
    """
    fmt_norm = fmt.lower().lstrip(".")
    if fmt_norm not in FORMATS:
        raise ConfigError(
            f"plot format must be one of {', '.join(FORMATS)}, got {fmt!r}",
            field="plot",
        )
    _check_mode(mode)
    eps_path, cal_path = _output_paths(Path(out), fmt_norm)
    _format_of(eps_path)  # fail before any work when the suffix is wrong

    records = [t for t in trials if _usable(t, metric)]
    eps_points = epsilon_front(best_per_arm_level(records, metric=metric, mode=mode), mode=mode)
    cal_points = calibration_front(
        [t for t in records if _finite_number(t["metrics"].get("ece"))], metric=metric, mode=mode
    )

    eps_fig = epsilon_front_figure(
        eps_points,
        metric=metric,
        mode=mode,
        title=None if title is None else f"{title}: privacy/utility front",
    )
    cal_fig = calibration_front_figure(
        cal_points,
        metric=metric,
        mode=mode,
        title=None if title is None else f"{title}: calibration front",
    )
    return [save_figure(eps_fig, eps_path), save_figure(cal_fig, cal_path)]


def _finite_number(value: Any) -> bool:
    """A real number (not a bool, not a string) that is finite."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _usable(trial: dict[str, Any], metric: str) -> bool:
    """A finished, well-formed trial whose objective is a finite number."""
    if trial.get("state") != "done" or any(k not in trial for k in _TRIAL_KEYS):
        return False
    if not _finite_number(trial.get("epsilon_budget")):
        return False
    return _finite_number((trial.get("metrics") or {}).get(metric))
