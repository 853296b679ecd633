"""The live display of ``dpsweep run``: progress per arm, the last events, laid out to fit."""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len, set_cell_size
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.constrain import Constrain
from rich.text import Text

# The live display of ``dpsweep run`` is at most this wide, whatever the terminal's width: a
# wider frame is harder to read, and a frame wider than the terminal wraps, which breaks the
# redraw of a live display. A narrower terminal gets a frame of its own width.
LIVE_WIDTH = 80
# Below this the frame is laid out for this width and the terminal crops it (never wraps it).
LIVE_MIN_WIDTH = 24
# Lines of the last event at most (a long error message wraps; the rest is cut off).
LIVE_EVENT_LINES = 3


def _cell(text: str, width: int, *, right: bool = False) -> str:
    """``text`` in exactly ``width`` terminal columns: padded, or cut with an ellipsis."""
    if cell_len(text) > width:
        return set_cell_size(text, max(0, width - 1)) + "…" if width else ""
    pad = " " * (width - cell_len(text))
    return pad + text if right else text + pad


def _line(*parts: str | tuple[str, str]) -> Text:
    """One line of the live display: never wrapped, cut with an ellipsis at the frame's edge."""
    return Text.assemble(*parts, no_wrap=True, overflow="ellipsis")


class ProgressView:
    """The live progress of ``dpsweep run``, laid out for the width it is drawn at.

    Every line is at most :data:`LIVE_WIDTH` columns (or the terminal's width if smaller):
    the sweep's name, then the counts on a line of their own when both do not fit; the best
    objective per arm under a header that is never wrapped (arm names are cut with an
    ellipsis instead); the last event, wrapped to at most :data:`LIVE_EVENT_LINES` lines.

    A sweep with papernot-steinke grids shows elapsed time and which searches are under way,
    never done/running/failed counts or an ETA: each would follow the secret number of runs.

    Args:
        snap: The driver's snapshot (``sweeper.driver.progress.Snapshot``).
        name: The sweep's name.
    """

    def __init__(self, snap: Any, name: str) -> None:
        self.snap = snap
        self.name = name

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(LIVE_MIN_WIDTH, min(LIVE_WIDTH, options.max_width))
        yield Constrain(Group(*self.lines(width)), width)

    def lines(self, width: int) -> list[Any]:
        """The display's lines for a frame ``width`` columns wide."""
        from sweeper.driver.progress import format_elapsed  # deferred: SQLAlchemy

        snap = self.snap
        if snap.hidden_grids:
            fields: list[list[str | tuple[str, str]]] = [
                [f"elapsed {format_elapsed(snap.elapsed)}"]
            ]
        else:
            c = snap.counts
            fields = [
                ["done ", (f"{c.get('done', 0)}", "green"), f"/{snap.total}"],
                ["running ", (f"{c.get('running', 0)}", "cyan")],
                ["failed ", (f"{c.get('failed', 0)}", "red")],
                [f"elapsed {format_elapsed(snap.elapsed)}"],
                ["ETA " + ("—" if snap.eta is None else format_elapsed(snap.eta))],
            ]
        status: list[str | tuple[str, str]] = []
        for i, f in enumerate(fields):
            status += ["  "] * bool(i) + f
        status_len = Text.assemble(*status).cell_len
        out: list[Any] = []
        if cell_len(self.name) + 2 + status_len <= width:
            out.append(_line((self.name, "bold"), "  ", *status))
        else:
            out.append(_line((self.name, "bold")))
            out.append(_line(*status))
        if snap.hidden_grids:
            note = (
                f"{snap.hidden_grids} papernot-steinke grid(s): the number of runs is private; "
                "each grid releases its selected trial when its search completes"
            )
            out.append(Text(note, style="dim"))
        elif snap.best:
            out += self._best_lines(width)
        if snap.last_event:
            event = Text(snap.last_event, style="dim", overflow="ellipsis")
            out.append(_Clamp(event, LIVE_EVENT_LINES))
        return out

    def _best_lines(self, width: int) -> list[Text]:
        """The best objective so far per arm: a header line, column heads, one row per arm."""
        metric = self.snap.metric
        values = {arm: f"{v:.4f}" for arm, v in sorted(self.snap.best.items())}
        value_w = max(cell_len(metric), *(len(v) for v in values.values()))
        # Two columns of indent, two between the columns; the arm names take what is left.
        arm_w = max(3, min(max(3, *(cell_len(a) for a in values)), width - value_w - 4))
        out = [_line((f"best {metric} so far", "bold"))]
        out.append(
            _line(
                "  ",
                (_cell("arm", arm_w), "bold"),
                "  ",
                (_cell(metric, value_w, right=True), "bold"),
            )
        )
        for arm, value in values.items():
            out.append(_line("  ", _cell(arm, arm_w), "  ", _cell(value, value_w, right=True)))
        return out


class _Clamp:
    """A renderable wrapped to the width it is drawn at, cut after ``lines`` lines."""

    def __init__(self, renderable: Text, lines: int) -> None:
        self.renderable = renderable
        self.max_lines = lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = list(self.renderable.wrap(console, options.max_width))
        if len(lines) > self.max_lines:
            kept = lines[: self.max_lines]
            last = kept[-1]
            last.append(" …")
            last.truncate(options.max_width, overflow="ellipsis")
            lines = kept
        for line in lines:
            line.end = "\n"
            yield line


def _progress_view(snap: Any, name: str) -> ProgressView:
    """The live progress of ``dpsweep run`` (:class:`ProgressView`)."""
    return ProgressView(snap, name)
