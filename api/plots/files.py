"""Writing figures to files, and both Pareto plots of a sweep from its trial records."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from api.plots.drawing import check_mode
from api.plots.figures import calibration_front_figure, epsilon_front_figure
from dpsweep.errors import ConfigError
from sweeper.sweeps.results import best_per_arm_level, calibration_front, epsilon_front

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS: tuple[str, ...] = ("png", "svg", "pdf")
"""File formats :func:`save_figure` and :func:`write_pareto_plots` write."""

_PNG_DPI = 150
_TRIAL_KEYS = ("arm", "strategy", "epsilon_budget", "params")


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

    Trial records are the plain dicts documented in :mod:`sweeper.sweeps.results`. Unfinished trials
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
    check_mode(mode)
    eps_path, cal_path = _output_paths(Path(out), fmt_norm)
    _format_of(eps_path)  # fail before any work when the suffix is wrong

    eps_fig, cal_fig = pareto_figures(trials, metric=metric, mode=mode, title=title)
    return [save_figure(eps_fig, eps_path), save_figure(cal_fig, cal_path)]


def pareto_figures(
    trials: Iterable[dict[str, Any]],
    *,
    metric: str = "accuracy",
    mode: str = "max",
    title: str | None = None,
) -> tuple[Figure, Figure]:
    """Both Pareto figures of trial records, as :func:`write_pareto_plots` writes them: the ε
    front, then the calibration front (arguments as there).

    Raises:
        ConfigError: If ``mode`` is not allowed.
    """
    check_mode(mode)
    every = list(trials)
    # Colours are keyed by every arm the records name (finished or not), as the dashboard keys
    # them by the sweep's arms: an arm keeps its colour on both figures and in both places.
    arms = {str(t["arm"]) for t in every if isinstance(t, dict) and t.get("arm") is not None}
    records = [t for t in every if _usable(t, metric)]
    eps_points = epsilon_front(best_per_arm_level(records, metric=metric, mode=mode), mode=mode)
    cal_points = calibration_front(
        [t for t in records if _finite_number(t["metrics"].get("ece"))], metric=metric, mode=mode
    )
    eps_fig = epsilon_front_figure(
        eps_points,
        metric=metric,
        mode=mode,
        title=None if title is None else f"{title}: privacy/utility front",
        arms=arms,
    )
    cal_fig = calibration_front_figure(
        cal_points,
        metric=metric,
        mode=mode,
        title=None if title is None else f"{title}: calibration front",
        arms=arms,
    )
    return eps_fig, cal_fig


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
