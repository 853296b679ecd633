"""The live display of ``dpsweep run`` fits its frame: at most 80 columns, or the terminal's
width if smaller, whatever the names, counts and events it shows (issue 37, item 6)."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from rich.live import Live

from api.cli.run import LIVE_WIDTH, _progress_view
from sweeper.driver.progress import Snapshot

LONG_ARM = "quantile-clipping-with-adaptive-target-and-a-very-long-arm-name-indeed-x2"
ARMS = {
    "quantile": 0.912345,
    "online": 0.8,
    "fixed": 0.5012,
    LONG_ARM: 0.93123,
    "online_adaptive_clipping_with_momentum": 0.7,
}
LONG_EVENT = (
    f"{LONG_ARM}: trial 3f9a2c81 failed: interrupted: its worker was lost (out of memory; "
    "the worker's node ran out of memory while training the pack of 16 trials, see the "
    "trial's error for details)"
)


def busy_snapshot(**kw: object) -> Snapshot:
    """A big sweep part way through: thousands of trials, long names, hours of running."""
    fields: dict[str, object] = dict(
        counts={"done": 12345, "running": 64, "failed": 123, "pending": 30000},
        total=42532,
        best=dict(ARMS),
        elapsed=123456.7,
        eta=987654.3,
        hidden_grids=0,
        metric="accuracy",
        last_event=f"{LONG_ARM}: step 123456/200000",
    )
    fields.update(kw)
    return Snapshot(**fields)  # type: ignore[arg-type]


def render(snap: Snapshot, width: int, name: str = "digits-clipping-comparison") -> list[str]:
    """The display's lines as a ``width``-column terminal shows them."""
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(_progress_view(snap, name))
    return out.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 160, 250])
@pytest.mark.parametrize(
    "snap",
    [
        busy_snapshot(),
        busy_snapshot(last_event=LONG_EVENT),
        busy_snapshot(metric="balanced_accuracy_on_the_public_split"),
        busy_snapshot(eta=None, counts={"done": 0, "running": 0, "pending": 5}, total=5),
    ],
    ids=["busy", "long-event", "long-metric", "starting"],
)
def test_every_line_fits_and_the_best_header_is_one_line(snap: Snapshot, width: int) -> None:
    lines = render(snap, width, name="a-sweep-named-at-length-" * 3)
    frame = min(width, LIVE_WIDTH)
    assert max(len(line) for line in lines) <= frame, "\n".join(lines)
    text = [line.rstrip() for line in lines]
    # The header and the column heads are whole lines, never wrapped ("best accuracy so / far").
    header = f"best {snap.metric} so far"
    assert header in text, "\n".join(lines)
    heads = text[text.index(header) + 1].split()
    assert heads == ["arm", snap.metric], heads
    # One row per arm, each with its whole value: short names whole, long ones cut.
    rows = text[text.index(header) + 2 : text.index(header) + 2 + len(ARMS)]
    for (arm, value), row in zip(sorted(ARMS.items()), rows, strict=True):
        cells = row.split()
        assert cells[-1] == f"{value:.4f}"
        assert cells[0] == arm or (cells[0].endswith("…") and arm.startswith(cells[0][:-1]))
    assert any(arm in text_line for text_line in text for arm in ("quantile", "online", "fixed"))
    # The counts are intact, on one line.
    if snap.eta is not None:
        assert any(
            re.search(r"done 12345/42532 +running 64 +failed 123 +elapsed \S+ +ETA \S+", t)
            for t in text
        ), "\n".join(lines)


def test_the_long_arm_name_is_cut_not_wrapped_at_80_and_whole_where_it_fits() -> None:
    at_80 = [line.rstrip() for line in render(busy_snapshot(), 80)]
    rows = at_80[at_80.index("best accuracy so far") + 2 :][: len(ARMS)]
    assert not any(LONG_ARM in row for row in rows)
    assert rows[-1].split() == [LONG_ARM[:67] + "…", "0.9312"], rows[-1]
    short = busy_snapshot(best={k: v for k, v in ARMS.items() if len(k) < 40})
    cells = [line.split() for line in render(short, 80)]
    assert ["online_adaptive_clipping_with_momentum", "0.7000"] in cells
    # Name and counts share a line when both fit; else the counts get a line of their own.
    quick = busy_snapshot(elapsed=75, eta=30)
    first = render(quick, 80, name="digits")[0]
    assert re.match(r"digits +done 12345/42532 .* elapsed 1m15s +ETA 30s$", first), first
    first, second = render(quick, 80, name="digits-clipping-comparison-" * 2)[:2]
    assert first.rstrip() == "digits-clipping-comparison-" * 2
    assert re.match(r"done 12345/42532 .* ETA 30s$", second.rstrip()), second


def test_a_long_event_wraps_within_the_frame_to_three_lines_at_most() -> None:
    lines = render(busy_snapshot(last_event=LONG_EVENT * 3), 160)
    assert max(len(line) for line in lines) <= LIVE_WIDTH
    tail = [line for line in lines if line.rstrip().endswith("…") or "trial 3f9a2c81" in line]
    assert lines[-1].rstrip().endswith("…")
    assert len(lines) == 2 + 2 + len(ARMS) + 3, "\n".join(lines)
    assert tail


@pytest.mark.parametrize("width", [60, 40, 30, 24, 12])
def test_a_narrow_terminal_gets_a_frame_of_its_width(width: int) -> None:
    for snap in (busy_snapshot(), busy_snapshot(last_event=LONG_EVENT)):
        lines = render(snap, width)
        assert max(len(line) for line in lines) <= width, "\n".join(lines)
        if width >= 24:
            assert "best accuracy so far" in [line.rstrip() for line in lines]


@pytest.mark.parametrize("width", [80, 160, 40])
def test_the_papernot_steinke_view_fits_and_shows_no_counts(width: int) -> None:
    snap = Snapshot(
        counts={},
        total=0,
        best={},
        elapsed=4000.0,
        eta=None,
        hidden_grids=3,
        metric="accuracy",
        last_event="papernot-steinke grids quantile@1, online@1, "
        f"{LONG_ARM}@3 running (elapsed 1h06m40s)",
    )
    lines = render(snap, width, name="a-sweep-named-at-length-" * 3)
    assert max(len(line) for line in lines) <= min(width, LIVE_WIDTH), "\n".join(lines)
    text = " ".join(" ".join(lines).split())
    assert "elapsed 1h06m40s" in text
    assert "the number of runs is private" in text
    assert not re.search(r"\b(done|running \d|failed|ETA)\b", text)


def test_the_live_display_redraws_within_the_terminal() -> None:
    """Through rich's Live (as ``dpsweep run`` draws it) on a wide terminal."""
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None, force_terminal=True)
    with Live(console=console, auto_refresh=False) as live:
        for done in (1, 2, 3):
            counts = {"done": done, "running": 64, "failed": 0, "pending": 40 - done}
            live.update(_progress_view(busy_snapshot(counts=counts), "digits"), refresh=True)
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    lines = [line for line in plain.replace("\r", "\n").splitlines() if line]
    assert max(len(line) for line in lines) <= LIVE_WIDTH
    assert "best accuracy so far" in [line.rstrip() for line in lines]


@pytest.mark.parametrize("width", [80, 30])
def test_wide_characters_are_measured_in_terminal_columns(width: int) -> None:
    from rich.cells import cell_len

    wide = "精度の高い腕の名前がとても長い場合のテストです精度の高い腕の名前"
    lines = render(busy_snapshot(best={wide: 0.5, "x": 0.25}), width, name="名前")
    assert max(cell_len(line) for line in lines) <= width, "\n".join(lines)
    text = [line.rstrip() for line in lines]
    rows = text[text.index("best accuracy so far") + 1 :][:3]
    # The value column stays aligned: every row's value ends in the same column.
    assert len({cell_len(row) for row in rows}) == 1, rows
