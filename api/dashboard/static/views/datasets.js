import { api } from "../api.js";
import { errorBox, h, num, query, when } from "../ui.js";
import { datasetAccess } from "./dataset-access.js";
import { registrySection } from "./registry.js";

/**
 * Built-in, registered and uploaded datasets with their lifetime ε budget, and an upload form; with
 * ?open=ID, that dataset's grants, analyst policy and audit log (its owner) or allowance and
 * public description (an analyst) above the list.
 */
export function datasetsView(el) {
  let alive = true;
  let closeDetail = null;
  const open = query().get("open");
  const detail = h("div", { id: "dataset-access" });
  const list = h("div", { id: "datasets" }, h("p", { class: "muted" }, "Loading…"));
  const msg = h("div", { id: "upload-result" });
  const form = h("form", { class: "card", id: "upload-form" },
    h("h2", {}, "Upload a dataset"),
    h("p", { class: "muted small" }, "A CSV with a label column, or an NPZ with arrays x and y. It is parsed as a sweep will read it; nothing of a refused file is kept. Caps bound every sweep's spending on it, for its lifetime."),
    h("div", { class: "form-grid" },
      h("label", { for: "up-file" }, "File"), h("input", { type: "file", id: "up-file", name: "file", accept: ".csv,.npz", required: true }),
      h("label", { for: "up-name" }, "Name"), h("input", { type: "text", id: "up-name", name: "name", placeholder: "optional" }),
      h("label", { for: "up-label" }, "Label column (CSV)"), h("input", { type: "text", id: "up-label", name: "label_column", placeholder: "label" }),
      h("label", { for: "up-eps" }, "ε cap"), h("input", { type: "number", id: "up-eps", name: "epsilon_cap", min: "0", step: "any" }),
      h("label", { for: "up-delta" }, "δ cap"), h("input", { type: "number", id: "up-delta", name: "delta_cap", min: "0", max: "1", step: "any" })),
    h("button", { type: "submit", class: "primary" }, "Upload"), msg);
  el.append(h("h1", {}, "Datasets"), detail, list, form);
  registrySection(el);

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const fd = new FormData(form);
    for (const k of ["name", "label_column", "epsilon_cap", "delta_cap"]) if (!fd.get(k)) fd.delete(k);
    msg.replaceChildren(h("p", { class: "muted" }, "Uploading…"));
    try {
      const d = await api("/datasets", { method: "POST", body: fd });
      msg.replaceChildren(h("div", { class: "info" }, `Stored ${d.name} as `, h("code", {}, d.id),
        `: ${d.n_examples} examples, ${d.num_classes} classes. Name it in a spec as dataset: {name: ${d.id}}.`,
        // Records held before: which ledger this upload joined, and what it spent.
        d.ledger ? h("div", { class: "small", id: "upload-ledger" }, d.ledger.message) : null));
      form.reset();
      load();
    } catch (e) { msg.replaceChildren(errorBox(e)); }
  });

  async function load() {
    let ds;
    try { ds = await api("/datasets"); } catch (e) { list.replaceChildren(errorBox(e)); return; }
    if (!alive) return;
    if (open && !closeDetail) {
      let me;
      try { me = await api("/me"); } catch (e) { detail.replaceChildren(errorBox(e)); return; }
      if (!alive) return;
      closeDetail = datasetAccess(detail, open, ds.items.find((d) => d.id === open), me);
    }
    const focus = query().get("focus") || open;
    list.replaceChildren(h("table", { class: "grid", id: "datasets-table" },
      h("thead", {}, h("tr", {}, ["dataset", "kind", "examples", "classes", "ε cap", "spent", "reserved", "remaining", "budget", "added", "access"].map((c) => h("th", {}, c)))),
      h("tbody", {}, ds.items.map((d) => {
        const b = d.budget || {};
        // A built-in set is shared by every tenant: the API gives a tenant their own figures.
        const yours = b.scope === "yours"
          ? h("div", { class: "muted small budget-scope", title: "shared by every tenant: your own spending only" }, "yours") : "";
        return h("tr", { "data-dataset": d.id, class: focus === d.id ? "focus" : null },
          h("td", {}, h("strong", {}, d.name), d.id !== d.name ? h("div", { class: "muted small" }, h("code", {}, d.id)) : ""),
          h("td", {}, d.kind, ownerNote(d)), h("td", {}, d.n_examples ?? "–"), h("td", {}, d.num_classes ?? "–"),
          h("td", {}, b.epsilon_cap === null ? "uncapped" : num(b.epsilon_cap)),
          h("td", {}, num(b.epsilon_committed), yours), h("td", {}, num(b.epsilon_reserved)),
          h("td", { title: b.scope === "yours" ? "the cap less your own spending: others' may leave less" : null },
            b.epsilon_remaining === null ? "∞" : num(b.epsilon_remaining)),
          h("td", {}, d.allowance ? allowanceCell(d.allowance) : bar(b)), h("td", {}, when(d.created_at)),
          h("td", {}, d.kind !== "upload" && d.kind !== "registered" ? "" : h("a", { href: `/datasets?open=${encodeURIComponent(d.id)}`, class: "open-dataset" },
            d.role === "analyst" ? "Open" : "Grants & audit")));
      }))));
  }

  load();
  return () => { alive = false; if (closeDetail) closeDetail(); };
}

// Whose a stored file is: a tenant's, or the operator's (registered on the command line
// without --owner: admins see it). Analysts see only their allowance, not the owner.
function ownerNote(d) {
  if ((d.kind !== "upload" && d.kind !== "registered") || d.role === "analyst") return "";
  return h("div", { class: "muted small dataset-owner" }, d.owner ? `owner: ${d.owner}` : "the operator's");
}

function allowanceCell(a) {
  const pct = a.epsilon_allowance > 0 ? Math.min(100, (100 * a.epsilon_used) / a.epsilon_allowance) : 0;
  return h("div", {},
    h("div", { class: "bar budget allowance", title: `your allowance: ε ${num(a.epsilon_used)} used of ${num(a.epsilon_allowance)}` },
      h("span", { class: "p-done", style: `width:${pct}%` })),
    h("span", { class: "muted small" }, `yours: ${num(a.epsilon_left)} left${a.active ? "" : " (revoked)"}`));
}

export function bar(b) {
  if (b.epsilon_cap === null || b.epsilon_cap === undefined) {
    return h("span", { class: "muted small" }, `ε ${num(b.epsilon_committed)} ${b.scope === "yours" ? "spent by you" : "spent"}, no cap`);
  }
  const cap = b.epsilon_cap || 1e-12;
  const pct = (v) => Math.min(100, (100 * v) / cap);
  const whose = b.scope === "yours" ? "you spent" : "spent";
  // The spent part's colour says how much is left: green, then amber from 70 %, red from 90 %.
  const used = (b.epsilon_committed + b.epsilon_reserved) / cap;
  const level = used >= 0.9 ? "high" : used >= 0.7 ? "mid" : "low";
  return h("div", { class: "bar budget", "data-used": level, title: `${whose} ${num(b.epsilon_committed)}, reserved ${num(b.epsilon_reserved)} of ${num(b.epsilon_cap)}` },
    h("span", { class: `p-done spent-${level}`, style: `width:${pct(b.epsilon_committed)}%` }),
    h("span", { class: "p-running", style: `width:${pct(b.epsilon_reserved)}%` }));
}
