import { pages } from "../api.js";
import { badge, download, h, num, query, setQuery, TERMINAL, toCsv } from "../ui.js";

const SHOW = 200; // rows drawn before "show all"

/**
 * A sweep's trials: server-side filters (arm, level, state), user-chosen columns, client-side
 * sort and search over the loaded rows, CSV export of what is shown. State lives in the URL.
 */
export function trialsTable(el, sweepId, summary) {
  // Papernot–Steinke sweeps list only each grid's selected trial, with no position or times.
  const hidden = summary.plan.some((g) => g.release === "selected-only");
  let rows = [];
  let all = false;
  let loading = null;
  let lastLoad = 0;
  const q = query();

  const armSel = h("select", { id: "f-arm" }, h("option", { value: "" }, "all arms"),
    summary.arms.map((a) => h("option", { value: a.name, selected: q.get("arm") === a.name }, a.name)));
  const levels = [...new Set(summary.plan.map((g) => g.epsilon_budget))].sort((a, b) => a - b);
  const levelSel = h("select", { id: "f-level" }, h("option", { value: "" }, "all ε levels"),
    levels.map((l) => h("option", { value: l, selected: q.get("level") === String(l) }, `ε ${num(l)}`)));
  const stateSel = h("select", { id: "f-state" }, h("option", { value: "" }, "all states"),
    ["pending", "running", "done", "failed", "interrupted", "cancelled"].map((s) =>
      h("option", { value: s, selected: q.get("tstate") === s }, s)));
  const search = h("input", { type: "search", id: "f-search", placeholder: "Search params, arm, error", value: q.get("tq") || "" });
  const colBox = h("div", { class: "columns", id: "column-chooser" });
  const exportBtn = h("button", { id: "export-csv", onclick: exportCsv }, "Export CSV");
  const table = h("table", { class: "grid compact", id: "trials-table" });
  const status = h("p", { class: "muted", id: "trials-status" }, "Loading trials…");
  const more = h("button", { id: "show-all", hidden: true, onclick: () => { all = true; render(); } });
  el.append(
    h("div", { class: "toolbar" }, armSel, levelSel, stateSel, search,
      h("details", { class: "chooser" }, h("summary", {}, "Columns"), colBox), exportBtn),
    table, status, more);

  function columns() {
    const paramKeys = new Set();
    const metricKeys = new Set();
    for (const r of rows) {
      Object.keys(r.params || {}).forEach((k) => paramKeys.add(k));
      Object.keys(r.metrics || {}).forEach((k) => metricKeys.add(k));
    }
    const metric = summary.objective.metric;
    return [
      { key: "number", label: "#", get: (r) => r.number, show: true },
      { key: "arm", label: "arm", get: (r) => r.arm, show: true },
      { key: "level", label: "ε level", get: (r) => r.epsilon_budget, show: true },
      { key: "seed", label: "seed", get: (r) => r.seed, show: false },
      ...[...paramKeys].sort().map((k) => ({ key: `p.${k}`, label: k, get: (r) => r.params?.[k], show: true })),
      { key: "state", label: "state", get: (r) => r.state, show: true, cell: (r) => badge(r.state) },
      { key: "objective", label: `${metric} (objective)`, get: (r) => r.objective, show: true },
      ...[...metricKeys].sort().filter((k) => k !== metric).map((k) => ({
        key: `m.${k}`, label: k, get: (r) => r.metrics?.[k], show: k === "ece" })),
      { key: "sigma", label: "σ", get: (r) => r.noise_multiplier, show: true },
      { key: "single_run_epsilon", label: "single-run ε", title: "what this run alone would cost; its grid spent the grid budget for all its trials", get: (r) => r.single_run_epsilon, show: true },
      { key: "steps", label: "steps", get: (r) => r.steps, show: false },
      { key: "best_step", label: "best step", get: (r) => r.best_step, show: false },
      { key: "seconds", label: "train s", get: (r) => r.train_seconds, show: false },
      { key: "attempts", label: "attempts", get: (r) => r.attempts, show: false },
      { key: "error", label: "error", get: (r) => r.error, show: false },
    ];
  }

  function chosen(cols) {
    const want = query().get("cols");
    if (!want) return cols.filter((c) => c.show);
    const keys = want.split(",");
    return cols.filter((c) => keys.includes(c.key));
  }

  function drawChooser(cols) {
    const on = new Set(chosen(cols).map((c) => c.key));
    colBox.replaceChildren(...cols.map((c) => h("label", {},
      h("input", { type: "checkbox", value: c.key, checked: on.has(c.key), onchange: () => {
        const keys = [...colBox.querySelectorAll("input:checked")].map((i) => i.value);
        setQuery({ cols: keys.join(",") });
        render();
      } }), ` ${c.label}`)));
  }

  function visible(cols) {
    const text = search.value.trim().toLowerCase();
    let out = rows;
    if (text) {
      out = out.filter((r) => `${r.arm} ${JSON.stringify(r.params)} ${r.error || ""} ${r.id}`.toLowerCase().includes(text));
    }
    const key = query().get("tsort");
    const col = cols.find((c) => c.key === key);
    if (col) {
      const dir = query().get("tdir") === "desc" ? -1 : 1;
      out = [...out].sort((a, b) => {
        const x = col.get(a), y = col.get(b);
        if (x === y) return 0;
        if (x === null || x === undefined) return 1; // missing values last either way
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * dir;
      });
    }
    return out;
  }

  function render() {
    const cols = columns();
    if (!colBox.childElementCount || colBox.childElementCount !== cols.length) drawChooser(cols);
    const shown = chosen(cols);
    const out = visible(cols);
    const key = query().get("tsort");
    const dir = query().get("tdir") === "desc" ? "desc" : "asc";
    const head = h("thead", {}, h("tr", {}, shown.map((c) => h("th", {
      class: "sortable", "data-col": c.key, "aria-sort": key === c.key ? `${dir}ending` : null,
      onclick: () => { setQuery({ tsort: c.key, tdir: key === c.key && dir === "asc" ? "desc" : "asc" }); render(); },
    }, c.label + (key === c.key ? (dir === "asc" ? " ▲" : " ▼") : "")))));
    const limit = all ? out.length : SHOW;
    const body = h("tbody", {}, out.slice(0, limit).map((r) => h("tr", { "data-trial": r.id, "data-state": r.state },
      shown.map((c) => {
        if (c.cell) return h("td", {}, c.cell(r));
        const v = c.get(r);
        // Papernot–Steinke: the released trial has no position (see the sweep's plan).
        if (c.key === "number") return h("td", {}, h("a", { href: `/trials/${r.id}` }, hidden ? "selected" : `#${v}`));
        return h("td", { title: c.key === "error" ? v || "" : null }, typeof v === "number" ? num(v) : v ?? "–");
      }))));
    table.replaceChildren(head, body);
    more.hidden = out.length <= limit;
    more.textContent = `Show all ${out.length} rows`;
    status.textContent = `${out.length} of ${rows.length} trials${loading ? " (loading…)" : ""}`;
  }

  function exportCsv() {
    const cols = columns();
    const shown = chosen(cols);
    const csv = toCsv(visible(cols), [{ label: "id", get: (r) => r.id }, ...shown]);
    download(`sweep-${sweepId.slice(0, 12)}-trials.csv`, csv);
  }

  async function load() {
    lastLoad = Date.now();
    const qs = new URLSearchParams();
    if (armSel.value) qs.set("arm", armSel.value);
    if (levelSel.value) qs.set("level", levelSel.value);
    if (stateSel.value) qs.set("state", stateSel.value);
    const mine = {};
    loading = mine;
    try {
      await pages(`/sweeps/${sweepId}/trials?${qs}`, {
        limit: 500,
        onPage: (items) => { if (loading === mine) { rows = items; render(); } },
      });
    } catch (e) {
      status.textContent = `Could not load trials: ${e.message}`;
      return;
    } finally {
      if (loading === mine) loading = null;
    }
    if (loading === null) render();
  }

  const onFilter = () => {
    setQuery({ arm: armSel.value, level: levelSel.value, tstate: stateSel.value });
    load();
  };
  armSel.addEventListener("change", onFilter);
  levelSel.addEventListener("change", onFilter);
  stateSel.addEventListener("change", onFilter);
  search.addEventListener("input", () => { setQuery({ tq: search.value }); render(); });
  load();

  return {
    reload(s) {
      summary = s;
      // While a sweep runs, redraws come every 1.5 s; re-reading every trial that often is waste.
      if (!loading && (TERMINAL.has(s.state) || Date.now() - lastLoad > 5000)) load();
    },
  };
}
