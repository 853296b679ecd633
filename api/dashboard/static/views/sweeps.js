import { api, pages } from "../api.js";
import { badge, h, num, progress, query, setQuery, TERMINAL, when } from "../ui.js";

const STATES = ["", "pending", "running", "done", "failed", "cancelled"];
const SORTS = {
  created: (s) => s.created_at,
  name: (s) => s.name.toLowerCase(),
  state: (s) => s.state,
  progress: (s) => (s.trials ? (s.trials.done || 0) / Math.max(1, total(s)) : -1),
  dataset: (s) => s.dataset,
};

function total(s) {
  return s.trials ? Object.values(s.trials).reduce((a, b) => a + b, 0) : 0;
}

/** All sweeps: state filter, search, sortable columns; refreshes while any sweep is live. */
export function sweepsView(el) {
  let timer = null;
  let alive = true;
  let sweeps = [];
  let budgets = {};
  const q = query();
  const search = h("input", { type: "search", id: "sweep-search", placeholder: "Search name, id, dataset",
    value: q.get("q") || "" });
  const stateSel = h("select", { id: "state-filter" },
    STATES.map((s) => h("option", { value: s, selected: (q.get("state") || "") === s }, s || "all states")));
  const body = h("tbody");
  const table = h("table", { class: "grid", id: "sweeps-table" }, header(), body);
  const status = h("p", { class: "muted", id: "sweeps-status" }, "Loading…");
  el.append(
    h("div", { class: "row" }, h("h1", {}, "Sweeps"), h("span", { class: "spacer" }),
      h("a", { href: "/submit", class: "button primary" }, "New sweep")),
    h("div", { class: "toolbar" }, stateSel, search),
    table, status);

  function header() {
    const cur = query().get("sort") || "created";
    const dir = query().get("dir") || (cur === "created" ? "desc" : "asc");
    const th = (label, key) => h("th", {
      class: "sortable", "data-sort": key, "aria-sort": cur === key ? `${dir}ending` : null,
      onclick: () => {
        setQuery({ sort: key, dir: cur === key && dir === "asc" ? "desc" : "asc" });
        table.tHead.replaceWith(header());
        render();
      },
    }, label + (cur === key ? (dir === "asc" ? " ▲" : " ▼") : ""));
    return h("thead", {}, h("tr", {},
      th("Name", "name"), th("State", "state"), th("Progress", "progress"),
      h("th", {}, "Best trial per arm"), h("th", {}, "ε levels"), th("Dataset (ε left)", "dataset"),
      th("Created", "created")));
  }

  function render() {
    const text = search.value.trim().toLowerCase();
    const key = query().get("sort") || "created";
    const dir = query().get("dir") || (key === "created" ? "desc" : "asc");
    const f = SORTS[key] || SORTS.created;
    const rows = sweeps
      .filter((s) => !text || `${s.name} ${s.id} ${s.dataset}`.toLowerCase().includes(text))
      .sort((a, b) => {
        const x = f(a), y = f(b);
        return (x < y ? -1 : x > y ? 1 : 0) * (dir === "asc" ? 1 : -1);
      });
    body.replaceChildren(...rows.map((s) => {
      const b = budgets[s.dataset];
      const left = b ? (b.epsilon_remaining === null ? "uncapped" : `${b.scope === "yours" ? "≤ " : ""}ε ${num(b.epsilon_remaining, 3)} left`) : "";
      return h("tr", { "data-sweep": s.id, "data-state": s.state },
        h("td", {}, h("a", { href: `/sweeps/${s.id}` }, s.name), h("div", { class: "muted small" }, s.id.slice(0, 12))),
        h("td", {}, badge(s.state)),
        h("td", {}, progress(s.trials)),
        h("td", {}, s.best
          ? (s.best.length ? h("ul", { class: "plain" }, s.best.map((b2) =>
            h("li", {}, `${b2.arm}: `, h("strong", {}, num(b2.objective, 3))))) : "–")
          : h("span", { class: "muted" }, "selected only"),
        s.best && s.best.length ? h("div", { class: "muted small" }, `${s.objective.metric} (${s.objective.mode})`) : null),
        h("td", {}, s.levels.map((l) => num(l)).join(", ")),
        h("td", {}, s.dataset, h("div", { class: "muted small" }, left)),
        h("td", {}, when(s.created_at)));
    }));
    status.textContent = rows.length ? `${rows.length} of ${sweeps.length} sweeps` : (sweeps.length ? "No sweep matches." : "No sweeps yet: submit one.");
  }

  async function load() {
    const state = stateSel.value;
    try {
      const [items, ds] = await Promise.all([
        pages(`/sweeps${state ? `?state=${state}` : ""}`, { limit: 200 }),
        api("/datasets"),
      ]);
      if (!alive) return;
      sweeps = items;
      budgets = Object.fromEntries(ds.items.map((d) => [d.id, d.budget]));
      render();
      clearTimeout(timer);
      // Live sweeps move on their own: refresh the list while any is pending or running.
      if (sweeps.some((s) => !TERMINAL.has(s.state))) timer = setTimeout(load, 3000);
    } catch (e) {
      if (alive) status.textContent = `Could not load sweeps: ${e.message}`;
    }
  }

  stateSel.addEventListener("change", () => { setQuery({ state: stateSel.value }); load(); });
  search.addEventListener("input", () => { setQuery({ q: search.value }); render(); });
  load();
  return () => { alive = false; clearTimeout(timer); };
}
