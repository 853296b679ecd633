// One dataset's owners-and-analysts view (/datasets?open=ID). Its owner manages who may
// sweep it (grants with ε allowances), what analysts may use and see (the analyst policy), and
// reads the audit log of every release on its records. An analyst sees their allowance and
// spending, the owner's public description, the evaluation modes they may use, and their own
// releases: never the records, nor anything computed from them without noise.
//
// Routes: GET/POST /datasets/{id}/grants, DELETE /datasets/{id}/grants/{analyst},
// GET/PUT /datasets/{id}/policy, GET /datasets/{id}/audit (?cursor=<next_cursor>&limit=).

import { api } from "../api.js";
import { badge, confirmDialog, errorBox, h, num, when } from "../ui.js";

const MODES = [
  ["public", "Public evaluation dataset", "Metrics on a dataset the spec names as public: nothing of the private records."],
  ["dp", "DP evaluation", "Metrics on held-out private records, released with noise and charged to the trial's ε."],
  ["carve-out", "Unprotected carve-out", null],
];
const CARVE_OUT_WARNING = "A carve-out releases raw (unnoised) metrics computed on private records: whoever runs the sweep learns them outside the ε guarantee. Allow it only for analysts you trust with the data.";
const AUDIT_PAGE = 50;

const enc = encodeURIComponent;

/**
 * Draw dataset `id`'s access panels into `el`.
 *
 * @param {HTMLElement} el
 * @param {string} id
 * @param {object | undefined} item the dataset as GET /datasets lists it (absent for an analyst
 *   when the list does not include granted datasets)
 * @param {object} me GET /me
 * @returns {() => void} cleanup
 */
export function datasetAccess(el, id, item, me) {
  let alive = true;
  const role = roleOf(item, me);
  const section = h("section", { id: "dataset-detail", "data-dataset": id, "data-role": role },
    h("div", { class: "row" },
      h("h2", {}, "Dataset ", h("code", {}, item?.name || id)),
      h("span", { class: "badge", id: "dataset-role" }, role === "owner" ? "you own it" : "you are an analyst"),
      h("span", { class: "spacer" }),
      h("a", { href: "/datasets" }, "All datasets")));
  el.append(section);
  const live = () => alive;
  if (role === "owner") {
    grantsPanel(section, id, live);
    policyPanel(section, id, live);
    auditPanel(section, id, live, "Audit log", "Every release on this dataset's records, whoever received it.");
  } else {
    analystPanels(section, id, item, live);
    auditPanel(section, id, live, "Your releases", "What was released to you from this dataset, and the ε each release was charged.");
  }
  return () => { alive = false; };
}

function roleOf(item, me) {
  if (item?.role) return item.role;
  if (!item) return "analyst"; // not in the list: only a grant can let this viewer open it
  return !me.auth || me.admin || item.owner === me.name ? "owner" : "analyst";
}

function card(parent, id, title, note) {
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  parent.append(h("div", { class: "card", id }, h("h3", {}, title),
    note ? h("p", { class: "muted small" }, note) : null, body));
  return body;
}

// ---------------------------------------------------------------------------------------------
// The owner: grants, policy

function grantsPanel(parent, id, live) {
  const body = card(parent, "grants-panel", "Grants",
    "Analysts may sweep this dataset within their ε allowance and receive only DP outputs. The lifetime cap still bounds everyone's spending together. Revoking stops new sweeps and trials; running trials finish and what was charged stays charged.");
  const table = h("div", { id: "grants" });
  const msg = h("div", { id: "grant-result" });
  const form = h("form", { id: "grant-form" },
    h("div", { class: "form-grid" },
      h("label", { for: "grant-analyst" }, "Analyst (tenant)"), h("input", { type: "text", id: "grant-analyst", name: "analyst", required: true, maxlength: "200" }),
      h("label", { for: "grant-eps" }, "ε allowance"), h("input", { type: "number", id: "grant-eps", name: "epsilon_allowance", min: "0", step: "any", required: true }),
      h("label", { for: "grant-note" }, "Note"), h("input", { type: "text", id: "grant-note", name: "note", placeholder: "optional", maxlength: "2000" })),
    h("button", { type: "submit", class: "primary" }, "Grant"),
    h("span", { class: "muted small" }, " A new grant to an analyst who holds one replaces it; their spending carries over."),
    msg);
  body.replaceChildren(table, form);

  async function load() {
    let items;
    try { ({ items } = await api(`/datasets/${enc(id)}/grants`)); } catch (e) { table.replaceChildren(errorBox(e)); return; }
    if (!live()) return;
    if (!items.length) { table.replaceChildren(h("p", { class: "muted", id: "grants-empty" }, "No analyst has been granted access.")); return; }
    table.replaceChildren(h("table", { class: "grid compact", id: "grants-table" },
      h("thead", {}, h("tr", {}, ["analyst", "allowance ε", "used ε", "left ε", "", "state", "granted", "note", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, items.map((g) => {
        const left = Math.max(0, g.epsilon_allowance - g.epsilon_used);
        return h("tr", { "data-grant": g.id, "data-analyst": g.analyst, "data-active": String(g.active) },
          h("td", {}, h("strong", {}, g.analyst)), h("td", {}, num(g.epsilon_allowance)),
          h("td", { class: "used" }, num(g.epsilon_used)), h("td", { class: "left" }, g.active ? num(left) : "–"),
          h("td", {}, allowanceBar(g.epsilon_allowance, g.epsilon_used)),
          h("td", { class: "state" }, g.active ? badge("active") : h("span", { class: "badge s-cancelled", "data-state": "revoked", title: when(g.revoked_at) }, "revoked")),
          h("td", {}, when(g.created_at)), h("td", { class: "small" }, g.note || ""),
          h("td", {}, g.active ? h("button", { class: "danger revoke-grant", type: "button", onclick: () => revoke(g) }, "Revoke") : ""));
      }))));
  }

  async function revoke(g) {
    const ok = await confirmDialog(`Revoke ${g.analyst}'s access to this dataset? No new sweep or trial of theirs starts from now on; running trials finish and stay charged (ε ${num(g.epsilon_used)} used so far).`);
    if (!ok) return;
    try {
      await api(`/datasets/${enc(id)}/grants/${enc(g.analyst)}`, { method: "DELETE" });
      msg.replaceChildren(h("div", { class: "info" }, `Revoked ${g.analyst}'s grant.`));
    } catch (e) { msg.replaceChildren(errorBox(e)); }
    load();
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const fd = new FormData(form);
    const body = { analyst: String(fd.get("analyst")).trim(), epsilon_allowance: Number(fd.get("epsilon_allowance")) };
    if (fd.get("note")) body.note = String(fd.get("note"));
    try {
      let g;
      try {
        g = await api(`/datasets/${enc(id)}/grants`, { method: "POST", body });
      } catch (e) {
        // No API token has that name (a typo?): grant it only if the owner confirms the name.
        const unknown = e.status === 422 && e.errors.some((x) => x.field === "analyst" && /\bconfirm\b/.test(x.message || ""));
        if (!unknown || !(await confirmDialog(`No API token is named "${body.analyst}" yet. Grant the name anyway? Whoever later gets a token named "${body.analyst}" holds this grant.`))) throw e;
        g = await api(`/datasets/${enc(id)}/grants`, { method: "POST", body: { ...body, confirm: true } });
      }
      msg.replaceChildren(h("div", { class: "info" }, `Granted ${g.analyst} ε ${num(g.epsilon_allowance)}. They can name it in a spec as dataset: {name: ${id}}.`));
      form.reset();
    } catch (e) { msg.replaceChildren(errorBox(e)); }
    load();
  });
  load();
}

function policyPanel(parent, id, live) {
  const body = card(parent, "policy-panel", "Analyst policy",
    "What analysts may use and see. The description is what you declare public: it is shown to analysts as written and never computed from the records.");
  const msg = h("div", { id: "policy-result" });
  const warn = h("div", { class: "warning", id: "carve-out-warning" }, CARVE_OUT_WARNING);
  const boxes = MODES.map(([mode, label, help]) => h("label", { class: "mode" },
    h("input", { type: "checkbox", name: "mode", value: mode, id: `mode-${mode}` }), " ", label,
    help ? h("span", { class: "muted small" }, ` ${help}`) : h("span", { class: "small warn-text" }, " Raw metrics on private records: see below.")));
  const labels = h("input", { type: "text", id: "policy-labels", placeholder: "e.g. benign, malignant" });
  const desc = h("textarea", { id: "policy-description", rows: "3" });
  const facts = h("div", { id: "declared-facts" });
  const form = h("form", { id: "policy-form" },
    facts,
    h("fieldset", { class: "modes" }, h("legend", {}, "Evaluation modes analysts may use"), boxes),
    warn,
    h("div", { class: "form-grid" },
      h("label", { for: "policy-labels" }, "Label names (comma-separated, in class order)"), labels,
      h("label", { for: "policy-description" }, "Description"), desc),
    h("button", { type: "submit", class: "primary", id: "policy-save" }, "Save"), msg);
  const carve = () => form.querySelector("#mode-carve-out");
  const syncWarning = () => warn.classList.toggle("emphasis", carve().checked);
  form.addEventListener("change", syncWarning);

  // Size, classes and feature shape: an analyst sees and plans with these only once declared.
  function showFacts(view) {
    if (!view) { facts.replaceChildren(); return; }
    const declared = new Set(view.declared || []);
    const shown = (v) => (Array.isArray(v) ? v.join(", ") : v == null ? "—" : String(v));
    const rows = [["n_examples", "Records"], ["classes", "Classes"], ["input_shape", "Feature shape"]].map(([k, label]) =>
      h("tr", { "data-fact": k, "data-declared": String(declared.has(k)) },
        h("td", {}, label), h("td", {}, shown(view[k])),
        h("td", {}, declared.has(k) ? "declared public" : h("span", { class: "warn-text" }, "not declared: analysts see none"))));
    const all = declared.size === 3;
    const declare = h("button", { type: "button", id: "declare-counted" }, "Declare these counts public");
    declare.addEventListener("click", async () => {
      try {
        const p = await api(`/datasets/${enc(id)}/policy`, { method: "PUT", body: { declare_counted: true } });
        fill(p);
        msg.replaceChildren(h("div", { class: "info", id: "facts-declared" }, "Declared: analysts now see and plan with these figures."));
      } catch (e) { msg.replaceChildren(errorBox(e)); }
    });
    facts.replaceChildren(
      h("fieldset", { class: "facts" }, h("legend", {}, "What sizes an analyst's plan"),
        h("table", { class: "grid compact" }, h("tbody", {}, rows)),
        all ? h("p", { class: "muted small" }, "All declared: analysts may be granted.")
          : h("p", { class: "small" }, "Analysts are granted once all three are declared (counted from the records, they would say how many records there are). ", declare)));
  }

  function fill(p) {
    showFacts(p.view);
    for (const box of form.querySelectorAll("input[name=mode]")) box.checked = p.analyst_eval_modes.includes(box.value);
    labels.value = (p.public_info?.label_names || []).join(", ");
    desc.value = p.public_info?.description || "";
    syncWarning();
  }

  api(`/datasets/${enc(id)}/policy`).then((p) => {
    if (!live()) return;
    body.replaceChildren(form);
    fill(p);
  }).catch((e) => body.replaceChildren(errorBox(e)));

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const modes = [...form.querySelectorAll("input[name=mode]:checked")].map((b) => b.value);
    const names = labels.value.split(",").map((s) => s.trim()).filter(Boolean);
    const info = {};
    if (names.length) info.label_names = names;
    if (desc.value.trim()) info.description = desc.value.trim();
    try {
      const p = await api(`/datasets/${enc(id)}/policy`, { method: "PUT", body: { analyst_eval_modes: modes, public_info: info } });
      fill(p);
      msg.replaceChildren(h("div", { class: "info", id: "policy-saved" }, `Saved: analysts may evaluate with ${p.analyst_eval_modes.join(", ") || "no mode"}.`));
    } catch (e) { msg.replaceChildren(errorBox(e)); }
  });
}

// ---------------------------------------------------------------------------------------------
// The analyst: allowance, public description, eval modes

function analystPanels(parent, id, item, live) {
  const allowance = card(parent, "allowance-panel", "Your allowance",
    "The ε your sweeps on this dataset may hold: what they reserve less what they release unused. A sweep over what is left is refused.");
  const about = card(parent, "public-panel", "About this dataset",
    "What its owner declared public, and its shape. You receive only DP outputs: never the records, nor statistics computed from them without noise.");

  api(`/datasets/${enc(id)}/grants`).then(({ items }) => {
    if (!live()) return;
    const g = items.find((x) => x.active) || items[0];
    const a = item?.allowance || (g && {
      epsilon_allowance: g.epsilon_allowance, epsilon_used: g.epsilon_used,
      epsilon_left: Math.max(0, g.epsilon_allowance - g.epsilon_used), active: g.active,
    });
    if (!a) { allowance.replaceChildren(h("p", { class: "muted" }, "You hold no grant on this dataset.")); return; }
    allowance.replaceChildren(...[
      h("div", { id: "allowance", "data-allowance": a.epsilon_allowance, "data-used": a.epsilon_used, "data-left": a.epsilon_left, "data-active": String(a.active) },
        allowanceBar(a.epsilon_allowance, a.epsilon_used, "allowance-bar"),
        h("p", { id: "allowance-text" }, `ε ${num(a.epsilon_used)} used of ${num(a.epsilon_allowance)} · ${num(a.epsilon_left)} left`)),
      a.active ? null : h("div", { class: "warning", id: "allowance-revoked" }, "The owner revoked your grant: no new sweep or trial of yours starts on this dataset. What was released to you stays yours."),
      h("p", { class: "muted small" }, "Name it in a spec as ", h("code", {}, `dataset: {name: ${id}}`), "."),
    ].filter(Boolean));
  }).catch((e) => allowance.replaceChildren(errorBox(e)));

  Promise.all([
    api(`/datasets/${enc(id)}/policy`).catch(() => null),
    item ? Promise.resolve(item) : api(`/datasets/${enc(id)}`).catch(() => null),
  ]).then(([policy, d]) => {
    if (!live()) return;
    const info = { ...(d?.public_info || {}), ...(policy?.public_info || {}) };
    const modes = policy?.analyst_eval_modes || d?.analyst_eval_modes || null;
    const shape = d?.input_shape ? `[${d.input_shape.join(", ")}]` : "–";
    const rows = [
      ["Description", info.description || h("span", { class: "muted" }, "none given")],
      ["Label names", info.label_names?.length ? info.label_names.join(", ") : h("span", { class: "muted" }, "none given")],
      ["Input shape", shape],
      ["Classes", d?.num_classes ?? "–"],
      ["Training records", d?.n_train ?? d?.n_examples ?? "–"],
      ["Evaluation modes you may use", modes ? h("ul", { class: "plain", id: "analyst-modes" }, modes.map((m) => h("li", { "data-mode": m }, h("code", {}, m), " ", MODES.find(([k]) => k === m)?.[1] || ""))) : "–"],
    ];
    about.replaceChildren(h("dl", { class: "kv", id: "public-description" }, rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])));
  });
}

// ---------------------------------------------------------------------------------------------
// The audit log (both roles; the server decides whose entries)

function auditPanel(parent, id, live, title, note) {
  const body = card(parent, "audit-panel", title, `${note} Oldest first, as released; “More” loads later entries.`);
  const tbody = h("tbody", {});
  const more = h("button", { type: "button", id: "audit-more", hidden: true }, "More");
  const status = h("p", { class: "muted small", id: "audit-status" });
  let next = null;
  let shown = 0;
  body.replaceChildren(h("table", { class: "grid compact", id: "audit-table" },
    h("thead", {}, h("tr", {}, ["when", "who", "sweep", "trial", "kind", "grid", "ε", "δ"].map((c) => h("th", {}, c)))),
    tbody), status, more);

  async function page() {
    more.disabled = true;
    const q = `?limit=${AUDIT_PAGE}${next ? `&cursor=${enc(next)}` : ""}`;
    let out;
    try { out = await api(`/datasets/${enc(id)}/audit${q}`); } catch (e) { status.replaceChildren(errorBox(e)); return; }
    if (!live()) return;
    tbody.append(...out.items.map((e) => h("tr", { "data-entry": e.id, "data-kind": e.kind, "data-principal": e.principal ?? "", "data-sweep": e.sweep_id, "data-trial": e.trial_id ?? "" },
      h("td", {}, when(e.at)), h("td", {}, e.principal ?? h("span", { class: "muted" }, "local")),
      h("td", {}, h("a", { href: `/sweeps/${e.sweep_id}` }, h("code", {}, e.sweep_id.slice(0, 8)))),
      h("td", {}, e.trial_id ? h("a", { href: `/trials/${e.trial_id}` }, h("code", {}, e.trial_id.slice(0, 8))) : "–"),
      h("td", {}, e.kind), h("td", { class: "small" }, e.grid ?? "–"),
      h("td", { class: "eps" }, num(e.epsilon)), h("td", {}, num(e.delta)))));
    shown += out.items.length;
    next = out.next_cursor || null;
    more.hidden = !next;
    more.disabled = false;
    status.textContent = shown ? `${shown} release${shown === 1 ? "" : "s"}${next ? " so far" : ""}.` : "Nothing has been released yet.";
  }
  more.addEventListener("click", page);
  page();
}

/** used / allowance as a bar (green: used; grey: left). */
function allowanceBar(allowance, used, id = null) {
  const pct = allowance > 0 ? Math.min(100, (100 * used) / allowance) : (used > 0 ? 100 : 0);
  return h("div", { class: "bar budget allowance", id, title: `ε ${num(used)} used of ${num(allowance)}` },
    h("span", { class: "p-done", style: `width:${pct}%` }));
}
