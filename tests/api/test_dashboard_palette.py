"""The arms' palette is one: the dashboard's ``static/palette.js`` is generated from
:mod:`api.plots.palette`, which the CLI's plots draw with (no browser needed here; the browser
tests in ``test_dashboard_display`` compare the colours a real page draws)."""

from __future__ import annotations

import matplotlib.colors as mcolors

from api.plots import epsilon_front_figure
from api.plots.drawing import label_styles
from api.plots.palette import PALETTE_JS, TAB10, TAB20, arm_styles, natural_order, palette_js
from sweeper.sweeps.results import FrontPoint


def test_palette_js_is_generated_from_the_python_palette() -> None:
    assert PALETTE_JS.read_text(encoding="utf-8") == palette_js(), (
        "api/dashboard/static/palette.js is out of date: run python -m api.plots.palette"
    )
    for colour in (*TAB10, *TAB20):
        assert colour in palette_js()


def test_palette_is_matplotlibs_tab10_and_tab20() -> None:
    import matplotlib

    for ours, name in ((TAB10, "tab10"), (TAB20, "tab20")):
        cmap = matplotlib.colormaps[name]
        assert list(ours) == [mcolors.to_hex(cmap(i)) for i in range(cmap.N)]


def test_styles_are_keyed_by_the_natural_order_of_all_arms() -> None:
    assert natural_order(["arm10", "arm2", "b", "arm2", "a"]) == ["a", "arm2", "arm10", "b"]
    styles = arm_styles(["arm10", "arm2", "a"])
    assert [styles[a].colour for a in ("a", "arm2", "arm10")] == list(TAB10[:3])
    many = arm_styles([f"arm{i}" for i in range(25)])
    assert many["arm0"].colour == TAB20[0] and many["arm19"].colour == TAB20[19]
    assert many["arm20"].colour == TAB20[0] and many["arm20"].marker != many["arm0"].marker
    # The figures draw with these styles, keyed by the sweep's arms when given: an arm with no
    # point on a figure still takes its place in the order.
    assert label_styles(["b", "a"]) == {"a": (TAB10[0], "o"), "b": (TAB10[1], "o")}
    fig = epsilon_front_figure(
        [FrontPoint(1.0, 0.5, "b", False, {})], metric="accuracy", arms=["a", "b"]
    )
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_gid() == "series:b"]
    assert mcolors.to_hex(str(line.get_color())) == TAB10[1]
