"""Pareto-front plots: real files on disk, and the Pareto artists checked against the fronts."""

from __future__ import annotations

import math
import struct
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from api.plots import (
    NO_TRIALS_TEXT,
    PARETO_GID,
    PARETO_LEGEND,
    PARETO_STEP_GID,
    calibration_front_figure,
    epsilon_front_figure,
    save_figure,
    write_pareto_plots,
)
from dpsweep.errors import ConfigError
from sweeper.sweeps.results import FrontPoint, best_per_arm_level, calibration_front, epsilon_front

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _trial(
    arm: str,
    eps: float,
    lr: float,
    seed: int,
    acc: float | None,
    ece: float | None = 0.1,
    state: str = "done",
) -> dict[str, Any]:
    return {
        "arm": arm,
        "strategy": arm,
        "epsilon_budget": eps,
        "params": {"lr": lr},
        "seed": seed,
        "state": state,
        "metrics": {"accuracy": acc, "ece": ece},
    }


def _trials() -> list[dict[str, Any]]:
    return [
        # fixed @ 1: lr=0.1 averages 0.6 over two seeds (std > 0, so error bars)
        _trial("fixed", 1.0, 0.1, 0, 0.5, 0.2),
        _trial("fixed", 1.0, 0.1, 1, 0.7, 0.2),
        _trial("fixed", 3.0, 0.1, 0, 0.8, 0.05),
        _trial("fixed", 3.0, 0.1, 1, None, state="failed"),
        _trial("online", 1.0, 1.0, 0, 0.7, 0.08),
        _trial("online", 3.0, 1.0, 0, 0.75, 0.03),
        _trial("online", 8.0, 1.0, 0, 0.9, 0.1),
        # skipped: a NaN objective, a missing one, an unfinished trial
        _trial("ghost", 2.0, 1.0, 0, math.nan),
        _trial("ghost", 2.0, 1.0, 1, None),
        _trial("ghost", 2.0, 1.0, 2, 0.99, 0.0, state="running"),
    ]


def _eps_points(trials: list[dict[str, Any]]) -> list[FrontPoint]:
    return epsilon_front(best_per_arm_level(trials))


def _artist(fig: Any, gid: str) -> Any:
    (ax,) = fig.axes
    found = [a for a in [*ax.lines, *ax.collections] if a.get_gid() == gid]
    assert len(found) == 1, f"expected one artist with gid {gid!r}, found {len(found)}"
    return found[0]


def _scatter_pairs(fig: Any) -> list[tuple[float, float]]:
    offsets = np.asarray(_artist(fig, PARETO_GID).get_offsets(), dtype=float).reshape(-1, 2)
    return sorted((float(x), float(y)) for x, y in offsets)


def _step_vertices(fig: Any) -> list[tuple[float, float]]:
    line = _artist(fig, PARETO_STEP_GID)
    return [(float(x), float(y)) for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True)]


def _front(points: list[FrontPoint]) -> list[tuple[float, float]]:
    return sorted((p.x, p.y) for p in points if not p.dominated)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def _svg_text(path: Path) -> str:
    """The SVG parsed as XML (it must be well formed); its text, comments included.

    Matplotlib draws text as glyph paths and names each string in a comment beside it.
    """
    parser = ET.XMLParser(target=ET.TreeBuilder(insert_comments=True))
    root = ET.fromstring(path.read_text(encoding="utf-8"), parser=parser)
    assert root.tag.endswith("svg")
    return "\n".join(el.text or "" for el in root.iter())


# --- figures: the Pareto artists hold exactly the non-dominated points ------------------------


def test_epsilon_figure_marks_exactly_the_non_dominated_points() -> None:
    points = _eps_points(_trials())
    expected = _front(points)
    # hand-checked: (1, 0.7 online), (3, 0.8 fixed), (8, 0.9 online)
    assert expected == [(1.0, 0.7), (3.0, 0.8), (8.0, 0.9)]
    fig = epsilon_front_figure(points, metric="accuracy")
    assert _scatter_pairs(fig) == expected  # same floats, no arithmetic
    assert _step_vertices(fig) == expected  # sorted by x
    # ε minimised: each front objective holds from its budget on ("post" steps)
    assert _artist(fig, PARETO_STEP_GID).get_drawstyle() == "steps-post"


def test_epsilon_figure_has_one_series_per_label_sorted_by_x_with_error_bars() -> None:
    points = _eps_points(_trials())
    fig = epsilon_front_figure(points, metric="accuracy")
    (ax,) = fig.axes
    fixed = _artist(fig, "series:fixed")
    online = _artist(fig, "series:online")
    assert list(fixed.get_xdata()) == [1.0, 3.0]
    assert list(fixed.get_ydata()) == pytest.approx([0.6, 0.8])
    assert list(online.get_xdata()) == [1.0, 3.0, 8.0]
    assert fixed.get_label() == "fixed" and online.get_label() == "online"
    # fixed @ 1 has two seeds: an error-bar collection; online has one seed per level: none.
    assert any(c.get_gid() == "errorbar:fixed" for c in ax.collections)
    assert not any(c.get_gid() == "errorbar:online" for c in ax.collections)
    assert ax.get_xlabel() == "ε (per-grid budget)"
    assert ax.get_ylabel() == "accuracy (higher is better)"
    legend = ax.get_legend()
    assert legend is not None
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts[:2] == ["fixed", "online"] and PARETO_LEGEND in texts


def test_epsilon_figure_min_mode_and_non_finite_points_skipped() -> None:
    points = [
        FrontPoint(1.0, 2.0, "a", False, {"objective_std": 0.1}),
        FrontPoint(2.0, 2.5, "a", True, {"objective_std": None}),
        FrontPoint(2.0, 1.0, "b", False, {}),
        FrontPoint(4.0, math.nan, "b", True, {}),
        FrontPoint(math.inf, 0.5, "b", True, {}),
    ]
    fig = epsilon_front_figure(points, metric="loss", mode="min", title="custom")
    (ax,) = fig.axes
    assert ax.get_title() == "custom"
    assert ax.get_ylabel() == "loss (lower is better)"
    assert _scatter_pairs(fig) == [(1.0, 2.0), (2.0, 1.0)]
    assert list(_artist(fig, "series:b").get_xdata()) == [2.0]  # NaN and inf points skipped


def test_calibration_figure_marks_exactly_the_non_dominated_points() -> None:
    trials = _trials()
    points = calibration_front(trials)
    finite = [p for p in points if math.isfinite(p.x) and math.isfinite(p.y)]
    expected = _front(finite)
    # hand-checked: (0.75, 0.03), (0.8, 0.05) and (0.9, 0.1); the running trial is not counted
    assert expected == [(0.75, 0.03), (0.8, 0.05), (0.9, 0.1)]
    fig = calibration_front_figure(points, metric="accuracy")
    assert _scatter_pairs(fig) == expected  # same floats, no arithmetic
    step = _step_vertices(fig)
    assert step == expected  # sorted by x
    # objective maximised: each front ECE holds up to its point ("pre" steps)
    assert _artist(fig, PARETO_STEP_GID).get_drawstyle() == "steps-pre"
    (ax,) = fig.axes
    assert ax.get_xlabel() == "accuracy (higher is better)"
    assert ax.get_ylabel() == "ECE (lower is better)"
    # every finite trial is in the per-label scatters
    plotted = sorted(
        (float(x), float(y))
        for c in ax.collections
        if str(c.get_gid()).startswith("trials:")
        for x, y in np.asarray(c.get_offsets(), dtype=float).reshape(-1, 2)
    )
    assert plotted == sorted((p.x, p.y) for p in finite)


def test_single_point_and_many_labels() -> None:
    one = [FrontPoint(3.0, 0.8, "solo", False, {"objective_std": 0.0})]
    fig = epsilon_front_figure(one, metric="accuracy")
    assert _scatter_pairs(fig) == [(3.0, 0.8)]
    assert _step_vertices(fig) == [(3.0, 0.8)]

    many = [
        FrontPoint(float(e), 0.5 + 0.01 * i + 0.02 * e, f"arm{i}", True, {})
        for i in range(25)
        for e in (1, 4)
    ]
    fig = calibration_front_figure(many, metric="accuracy")
    (ax,) = fig.axes
    legend = ax.get_legend()
    assert legend is not None
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts[:3] == ["arm0", "arm1", "arm2"]  # natural order
    assert {f"arm{i}" for i in range(25)} <= set(texts)
    assert _scatter_pairs(fig) == []  # nothing marked non-dominated, nothing highlighted
    colours = {tuple(c.get_facecolor()[0][:3]) for c in ax.collections if c.get_offsets().size}
    assert len(colours) == 20  # tab20, cycling


def test_empty_figures_say_so() -> None:
    for fig in (
        epsilon_front_figure([], metric="accuracy"),
        calibration_front_figure([], metric="accuracy"),
    ):
        (ax,) = fig.axes
        assert any(NO_TRIALS_TEXT in t.get_text() for t in ax.texts)


# --- files ------------------------------------------------------------------------------------


def test_write_png_into_a_directory(tmp_path: Path) -> None:
    paths = write_pareto_plots(_trials(), out=tmp_path / "plots")
    assert paths == [
        tmp_path / "plots" / "pareto_epsilon.png",
        tmp_path / "plots" / "pareto_calibration.png",
    ]
    for path in paths:
        assert path.stat().st_size > 1000
        width, height = _png_size(path)
        assert 600 <= width <= 2400 and 400 <= height <= 1200  # 7 x 4.5 in at 150 dpi


def test_write_svg_to_a_file_path_has_labels_and_axis_text(tmp_path: Path) -> None:
    out = tmp_path / "report" / "front.svg"
    eps_path, cal_path = write_pareto_plots(_trials(), out=out, title="Run 7")
    assert eps_path == out and cal_path == tmp_path / "report" / "front_calibration.svg"
    eps_text = _svg_text(eps_path)
    for needle in ("fixed", "online", "ε (per-grid budget)", "accuracy (higher is better)"):
        assert needle in eps_text
    assert "ghost" not in eps_text  # its trials were all skipped
    assert "Run 7" in eps_text and PARETO_LEGEND in eps_text
    cal_text = _svg_text(cal_path)
    for needle in ("fixed", "online", "ECE (lower is better)", "accuracy (higher is better)"):
        assert needle in cal_text
    assert f'id="{PARETO_GID}"' in eps_path.read_text(encoding="utf-8")


def test_existing_directory_with_a_dot_is_a_directory(tmp_path: Path) -> None:
    out = tmp_path / "sweep.v2"
    out.mkdir()
    paths = write_pareto_plots(_trials(), out=out, fmt="pdf")
    assert [p.name for p in paths] == ["pareto_epsilon.pdf", "pareto_calibration.pdf"]
    assert all(p.read_bytes().startswith(b"%PDF") for p in paths)


@pytest.mark.parametrize("trials", [[], [_trial("a", 1.0, 0.1, 0, math.nan)]])
def test_no_finished_trials_still_writes_files(tmp_path: Path, trials: list[Any]) -> None:
    paths = write_pareto_plots(trials, out=tmp_path, fmt="svg")
    assert len(paths) == 2
    for path in paths:
        assert NO_TRIALS_TEXT in _svg_text(path)


def test_save_figure_creates_parents_and_bad_suffix_is_a_config_error(tmp_path: Path) -> None:
    fig = epsilon_front_figure(_eps_points(_trials()), metric="accuracy")
    path = save_figure(fig, tmp_path / "a" / "b" / "front.PNG")
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    for bad in ("front.jpg", "front"):
        with pytest.raises(ConfigError, match=r"\.png, \.svg, \.pdf") as err:
            save_figure(fig, tmp_path / bad)
        assert err.value.field == "plot"
    assert not (tmp_path / "front.jpg").exists()


def test_bad_format_and_suffix_and_mode_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="png, svg, pdf") as err:
        write_pareto_plots(_trials(), out=tmp_path, fmt="gif")
    assert err.value.field == "plot"
    with pytest.raises(ConfigError, match=r"\.png, \.svg, \.pdf"):
        write_pareto_plots(_trials(), out=tmp_path / "front.eps")
    with pytest.raises(ConfigError, match="max, min"):
        write_pareto_plots(_trials(), out=tmp_path, mode="best")
    assert list(tmp_path.iterdir()) == []  # nothing written on error
