// Small DOM, formatting and URL helpers shared by the views.

/** h("div", {class: "x", onclick: fn}, child, ...) builds an element. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "value") el.value = v;
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function num(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v) && Math.abs(v) < 1e6) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  return Number(v.toPrecision(digits)).toString();
}

export function when(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

export function params(p) {
  return Object.entries(p || {}).map(([k, v]) => `${k}=${num(v)}`).join(", ");
}

/** A grid axis as the plan stores it: a list, or {logspace|linspace: [a, b], k}. */
export function axisText(axis) {
  if (Array.isArray(axis)) return `[${axis.map((v) => num(v)).join(", ")}]`;
  if (axis && typeof axis === "object") {
    const kind = axis.logspace ? "logspace" : "linspace";
    const [a, b] = axis[kind] || [];
    return `${kind} ${num(a)}…${num(b)}, ${axis.k} points`;
  }
  return String(axis);
}

// The plan's public fields as the API's schema titles and describes them (its PlanGrid: one
// declaration, dpsweep/plan_fields.py, gives the CLI's table, the summaries and these headers).
// Read once; without it a header shows the field's name.
let planFieldsRead = null;

/** @returns {Promise<Object<string, {title?: string, description?: string}>>} by field name */
export function planFields() {
  planFieldsRead ||= fetch("/openapi.json").then((r) => r.json())
    .then((d) => d.components?.schemas?.PlanGrid?.properties || {}).catch(() => ({}));
  return planFieldsRead;
}

/** A plan table's header row: each field's title, its description as the tooltip. */
export function planHeader(fields, names, unit) {
  // With a privacy unit (a person), every epsilon column says "per person".
  const per = perUnit(unit);
  return h("thead", {}, h("tr", {}, names.map((n) => h("th",
    { "data-field": n, title: fields[n]?.description || "" },
    `${fields[n]?.title || n}${per && n.startsWith("epsilon") ? per : ""}`))));
}

/**
 * What follows an ε where the plan has a privacy unit: " per person"; nothing for example-level
 * DP (each row its own unit: every label stays as it was).
 */
export function perUnit(unit) {
  return unit && unit !== "example" ? ` per ${unit}` : "";
}

/** A plan's privacy unit in a sentence ("" for example-level DP). */
export function unitNote(unit) {
  const per = perUnit(unit);
  return per ? `Every ε${per} (unit: ${unit}): all of a ${unit}'s rows together; q, T and N count units.` : "";
}

/**
 * Public pre-tuning (an arm's tune_on): for each grid tuned first on a public dataset, where,
 * the best point there and its score, and the private grid centred on it. Nothing when no
 * grid was tuned. No ε is spent by the tuning: only public records are read.
 */
export function tuningCard(grids, fields) {
  const tuned = (grids || []).filter((g) => g.tuned_on);
  if (!tuned.length) return "";
  const cols = ["arm", "epsilon_budget", "tuned_on", "tuned_params", "tuned_score", "tuned_grid"];
  return h("div", { class: "card", id: "tuning-card" }, h("h2", {}, "Public pre-tuning"),
    h("p", { class: "muted small" }, "These grids were first trained on a dataset declared public, at the grid's σ; no ε is spent. The private grid then centres on the best point there."),
    h("table", { class: "grid compact", id: "tuning-table" },
      planHeader(fields, cols),
      h("tbody", {}, tuned.map((g) => h("tr", { "data-arm": g.arm, "data-level": g.epsilon_budget },
        h("td", {}, g.arm), h("td", {}, num(g.epsilon_budget)), h("td", {}, g.tuned_on),
        h("td", {}, params(g.tuned_params)), h("td", {}, num(g.tuned_score)),
        h("td", {}, Object.entries(g.tuned_grid || {}).map(([k, v]) => `${k}: ${axisText(v)}`).join("; ")))))));
}

export const TERMINAL = new Set(["done", "failed", "cancelled"]);

export function badge(state) {
  return h("span", { class: `badge s-${state}`, "data-state": state }, state);
}

/** A done/running/failed progress bar for trial counts by state. */
export function progress(counts) {
  if (!counts) return h("span", { class: "muted", title: "Papernot–Steinke: the number of runs is private" }, "hidden");
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  const part = (k) => counts[k] || 0;
  const failed = part("failed") + part("interrupted");
  const pct = (n) => (total ? (100 * n) / total : 0);
  return h("div", { class: "progress", "data-done": part("done"), "data-total": total },
    h("div", { class: "bar" },
      h("span", { class: "p-done", style: `width:${pct(part("done"))}%` }),
      h("span", { class: "p-running", style: `width:${pct(part("running"))}%` }),
      h("span", { class: "p-failed", style: `width:${pct(failed)}%` })),
    h("span", { class: "progress-text" },
      `${part("done")} done · ${part("running")} running · ${failed} failed of ${total}`));
}

// ---------------------------------------------------------------------------------------------
// The URL holds the view's state (tab, filters, sort) so that a link reproduces it.

export function query() { return new URLSearchParams(location.search); }

/** Merge values into the query string without a new history entry (null removes a key). */
export function setQuery(values) {
  const q = query();
  for (const [k, v] of Object.entries(values)) {
    if (v === null || v === undefined || v === "") q.delete(k);
    else q.set(k, v);
  }
  const s = q.toString();
  history.replaceState(history.state, "", location.pathname + (s ? `?${s}` : ""));
}

export function navigate(url) {
  history.pushState({}, "", url);
  window.dispatchEvent(new Event("dpsweep:navigate"));
}

// ---------------------------------------------------------------------------------------------

export function errorBox(err) {
  const items = (err.errors || []).map((e) => h("li", {}, h("code", {}, e.field), ": ", e.message));
  return h("div", { class: "error", role: "alert" },
    h("strong", {}, err.problem?.title || "Error"), " ", err.message,
    items.length ? h("ul", {}, items) : null);
}

export function confirmDialog(text) {
  const dlg = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    dlg.addEventListener("close", () => resolve(dlg.returnValue === "yes"), { once: true });
    dlg.returnValue = "";
    dlg.showModal();
  });
}

export function toCsv(rows, columns) {
  const cell = (v) => {
    if (v === null || v === undefined) return "";
    const s = typeof v === "object" ? JSON.stringify(v) : String(v);
    return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  };
  return [columns.map((c) => cell(c.label)).join(","),
    ...rows.map((r) => columns.map((c) => cell(c.get(r))).join(","))].join("\n") + "\n";
}

/** Save text (or a Blob, as fetched) as a file named `name`. */
export function download(name, text, type = "text/csv") {
  const blob = text instanceof Blob ? text : new Blob([text], { type });
  const url = URL.createObjectURL(blob);
  const a = h("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
}

// ---------------------------------------------------------------------------------------------
// Charts (Plotly.js, vendored)

// The arms' colours are not here: they come from palette.js, generated from the CLI plots'
// palette (api/plots/palette.py), so that the two cannot drift apart.

export function plot(el, traces, layout = {}, { onClick } = {}) {
  const base = {
    margin: { l: 60, r: 20, t: 30, b: 50 },
    hovermode: "closest",
    legend: { orientation: "h", y: -0.2 },
    font: { family: "system-ui, sans-serif", size: 12 },
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "#fff",
  };
  const out = window.Plotly.react(el, traces, { ...base, ...layout },
    { responsive: true, displaylogo: false });
  if (onClick) {
    el.dpClick = onClick;
    if (!el.dataset.clickBound) {
      el.dataset.clickBound = "1";
      el.on("plotly_click", (ev) => {
        const p = ev.points && ev.points[0];
        if (p) el.dpClick(p);
      });
    }
  }
  return out;
}
