// GENERATED from api/plots/palette.py by `python -m api.plots.palette`: do not edit.
// The arms' palette the CLI's plots use too, so that an arm has one colour everywhere.

export const TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
export const TAB20 = ["#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896", "#9467bd", "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d", "#17becf", "#9edae5"];
export const SYMBOLS = ["circle", "square", "triangle-up", "diamond", "triangle-down", "cross", "x", "triangle-left", "triangle-right"];

function naturalKey(label) {
  return String(label).split(/([0-9]+)/).filter((t) => t !== "")
    .map((t) => (/^[0-9]+$/.test(t) ? [0, BigInt(t)] : [1, t]));
}

function compareTokens(a, b) {
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    const [ka, va] = a[i];
    const [kb, vb] = b[i];
    if (ka !== kb) return ka - kb;
    if (va !== vb) return va < vb ? -1 : 1;
  }
  return a.length - b.length;
}

/** The distinct labels in natural order (arm2 before arm10), as Python's natural_order. */
export function naturalOrder(labels) {
  const distinct = [...new Set(Array.from(labels, String))];
  const byLabel = (a, b) => (a < b ? -1 : a > b ? 1 : 0);
  return distinct.sort((a, b) => compareTokens(naturalKey(a), naturalKey(b)) || byLabel(a, b));
}

/** Each arm's {color, symbol}, keyed by the natural order of all the arms (arm_styles). */
export function armStyles(arms) {
  const order = naturalOrder(arms);
  const colors = order.length <= TAB10.length ? TAB10 : TAB20;
  const out = {};
  order.forEach((arm, i) => {
    const symbol = SYMBOLS[Math.floor(i / colors.length) % SYMBOLS.length];
    out[arm] = { color: colors[i % colors.length], symbol };
  });
  return out;
}
