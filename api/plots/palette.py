"""The one palette of arms, shared by the CLI's plots and the web dashboard.

An arm's colour (and marker) depends only on its name and on the names of its sweep's arms:
the arms are put in natural order (``arm2`` before ``arm10``) and the i-th gets the i-th colour
of tab10, or of tab20 when the sweep has more than ten arms; past the palette's end the colours
repeat with the next marker. The matplotlib figures (:mod:`api.plots.figures`) and the
dashboard's charts both take their styles from here: the dashboard's
``static/palette.js`` is generated from this module (``python -m api.plots.palette`` rewrites
it, and a test checks it is up to date), so the same arm has the same colour in both.

This module imports nothing heavy (no matplotlib): colours are hex strings, which matplotlib
and Plotly both accept.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: matplotlib's tab10 (also Plotly's and D3's category10), for sweeps of up to ten arms.
TAB10: tuple[str, ...] = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
#: matplotlib's tab20, for sweeps of more than ten arms.
TAB20: tuple[str, ...] = (
    "#1f77b4",
    "#aec7e8",
    "#ff7f0e",
    "#ffbb78",
    "#2ca02c",
    "#98df8a",
    "#d62728",
    "#ff9896",
    "#9467bd",
    "#c5b0d5",
    "#8c564b",
    "#c49c94",
    "#e377c2",
    "#f7b6d2",
    "#7f7f7f",
    "#c7c7c7",
    "#bcbd22",
    "#dbdb8d",
    "#17becf",
    "#9edae5",
)
#: Markers, matplotlib's name -> Plotly's symbol; the next one is used each time the colours
#: run out.
MARKERS: tuple[tuple[str, str], ...] = (
    ("o", "circle"),
    ("s", "square"),
    ("^", "triangle-up"),
    ("D", "diamond"),
    ("v", "triangle-down"),
    ("P", "cross"),
    ("X", "x"),
    ("<", "triangle-left"),
    (">", "triangle-right"),
)

#: Where the dashboard's copy is (served as ``/static/palette.js``).
PALETTE_JS = Path(__file__).resolve().parents[1] / "dashboard" / "static" / "palette.js"

_DIGITS = re.compile(r"([0-9]+)")


@dataclass(frozen=True)
class ArmStyle:
    """How one arm is drawn: its colour (hex), matplotlib marker and Plotly symbol."""

    colour: str
    marker: str
    symbol: str


def natural_key(label: str) -> tuple[list[tuple[int, int | str]], str]:
    """Sort key of the natural order: runs of ASCII digits compare as numbers, then the label
    itself."""
    tokens: list[tuple[int, int | str]] = [
        (0, int(tok)) if _DIGITS.fullmatch(tok) else (1, tok) for tok in _DIGITS.split(label) if tok
    ]
    return tokens, label


def natural_order(labels: Iterable[str]) -> list[str]:
    """The distinct labels in natural order (``arm2`` before ``arm10``)."""
    return sorted({str(label) for label in labels}, key=natural_key)


def arm_styles(arms: Iterable[str]) -> dict[str, ArmStyle]:
    """Each arm's style, keyed by the natural order of all of ``arms`` (see the module)."""
    order = natural_order(arms)
    colours = TAB10 if len(order) <= len(TAB10) else TAB20
    n = len(colours)
    out = {}
    for i, arm in enumerate(order):
        marker, symbol = MARKERS[(i // n) % len(MARKERS)]
        out[arm] = ArmStyle(colours[i % n], marker, symbol)
    return out


def palette_js() -> str:
    """The dashboard's ``palette.js``: these constants and the same keying, in JavaScript."""
    data = {
        "TAB10": list(TAB10),
        "TAB20": list(TAB20),
        "SYMBOLS": [symbol for _, symbol in MARKERS],
    }
    consts = "\n".join(f"export const {k} = {json.dumps(v)};" for k, v in data.items())
    return f"""\
// GENERATED from api/plots/palette.py by `python -m api.plots.palette`: do not edit.
// The arms' palette the CLI's plots use too, so that an arm has one colour everywhere.

{consts}

function naturalKey(label) {{
  return String(label).split(/([0-9]+)/).filter((t) => t !== "")
    .map((t) => (/^[0-9]+$/.test(t) ? [0, BigInt(t)] : [1, t]));
}}

function compareTokens(a, b) {{
  for (let i = 0; i < Math.min(a.length, b.length); i++) {{
    const [ka, va] = a[i];
    const [kb, vb] = b[i];
    if (ka !== kb) return ka - kb;
    if (va !== vb) return va < vb ? -1 : 1;
  }}
  return a.length - b.length;
}}

/** The distinct labels in natural order (arm2 before arm10), as Python's natural_order. */
export function naturalOrder(labels) {{
  const distinct = [...new Set(Array.from(labels, String))];
  const byLabel = (a, b) => (a < b ? -1 : a > b ? 1 : 0);
  return distinct.sort((a, b) => compareTokens(naturalKey(a), naturalKey(b)) || byLabel(a, b));
}}

/** Each arm's {{color, symbol}}, keyed by the natural order of all the arms (arm_styles). */
export function armStyles(arms) {{
  const order = naturalOrder(arms);
  const colors = order.length <= TAB10.length ? TAB10 : TAB20;
  const out = {{}};
  order.forEach((arm, i) => {{
    const symbol = SYMBOLS[Math.floor(i / colors.length) % SYMBOLS.length];
    out[arm] = {{ color: colors[i % colors.length], symbol }};
  }});
  return out;
}}
"""


def main(argv: list[str] | None = None) -> int:
    """Rewrite the dashboard's ``palette.js`` (``--check``: only say whether it is current)."""
    args = sys.argv[1:] if argv is None else argv
    text = palette_js()
    current = PALETTE_JS.read_text(encoding="utf-8") if PALETTE_JS.exists() else None
    if "--check" in args:
        if current != text:
            print(f"{PALETTE_JS} is out of date: run python -m api.plots.palette", file=sys.stderr)
            return 1
        return 0
    if current != text:
        PALETTE_JS.write_text(text, encoding="utf-8")
    return 0


__all__ = [
    "MARKERS",
    "PALETTE_JS",
    "TAB10",
    "TAB20",
    "ArmStyle",
    "arm_styles",
    "natural_key",
    "natural_order",
    "palette_js",
]

if __name__ == "__main__":
    raise SystemExit(main())
