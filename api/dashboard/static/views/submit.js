import { api } from "../api.js";
import { errorBox, h, navigate, num, perUnit, planFields, planHeader, tuningCard, unitNote } from "../ui.js";
import { registryHints } from "./registry.js";

const EXAMPLE = `name: my-sweep
dataset: {name: digits}
model: {name: mlp}
training: {epochs: 2, batch_size: 128}
privacy: {budgets: [1, 4], delta: 1.0e-5, accounting: compose}
arms:
  - strategy: fixed
    grid: {lr: [0.3, 1.0], clip: [0.5, 2.0]}
seeds: 1
`;

/** Paste or load a YAML spec, see its plan (a dry run that stores nothing), then submit. */
export function submitView(el) {
  const text = h("textarea", { id: "spec", rows: 18, cols: 80, spellcheck: "false" }, EXAMPLE);
  const file = h("input", { type: "file", id: "spec-file", accept: ".yaml,.yml,.json" });
  const out = h("div", { id: "plan" });
  const planBtn = h("button", { id: "plan-btn", class: "primary" }, "Plan (dry run)");
  const submitBtn = h("button", { id: "submit-btn", disabled: true }, "Submit sweep");
  let planned = null; // the text that was planned: submit is offered for exactly that text
  el.append(
    h("h1", {}, "New sweep"),
    h("p", { class: "muted" }, "A sweep spec in YAML or JSON (every field is described in docs/spec.md of the dpsweep repository). Planning shows the noise each grid uses and the budget it would reserve; nothing is stored until you submit."),
    h("div", { class: "card" }, h("div", { class: "toolbar" }, h("label", {}, "Load a file ", file)), text,
      h("div", { class: "toolbar" }, planBtn, submitBtn)),
    out);
  registryHints(el.querySelector(".card"));

  file.addEventListener("change", async () => {
    if (file.files[0]) { text.value = await file.files[0].text(); invalidate(); }
  });
  text.addEventListener("input", invalidate);
  function invalidate() { planned = null; submitBtn.disabled = true; }

  function ctype() { return text.value.trim().startsWith("{") ? "application/json" : "application/yaml"; }

  planBtn.addEventListener("click", async () => {
    out.replaceChildren(h("p", { class: "muted" }, "Planning…"));
    const body = text.value;
    try {
      const plan = await api("/sweeps:plan", { method: "POST", body, contentType: ctype() });
      planned = body;
      submitBtn.disabled = false;
      out.replaceChildren(planTable(plan, await planFields()));
    } catch (e) { invalidate(); out.replaceChildren(errorBox(e)); }
  });

  submitBtn.addEventListener("click", async () => {
    if (planned === null) return;
    submitBtn.disabled = true;
    try {
      const s = await api("/sweeps", {
        method: "POST", body: planned, contentType: ctype(),
        // A retried click must not submit (and reserve) twice.
        extraHeaders: { "Idempotency-Key": submitBtn.dataset.key ||= crypto.randomUUID() },
      });
      navigate(`/sweeps/${s.id}`);
    } catch (e) { submitBtn.disabled = false; delete submitBtn.dataset.key; out.replaceChildren(errorBox(e)); }
  });
  return null;
}

function planTable(p, fields) {
  const cols = ["arm", "strategy", "epsilon_budget", "trials", "noise_multiplier", "steps_per_trial",
    "sample_rate", "epsilon_per_trial", "epsilon_total", "epsilon_verified", "epsilon_reserved"];
  // A plan with a privacy unit (a person): every ε is per unit.
  const unit = perUnit(p.grids[0]?.privacy_unit) ? p.grids[0].privacy_unit : "";
  return h("div", { class: "card", id: "plan-result" },
    h("h2", {}, `Plan for ${p.name}`),
    h("p", {}, `${p.trials} trials on ${p.dataset}; reserves ε ${num(p.epsilon_reserved)}${perUnit(unit)}, δ ${num(p.delta_reserved)}.`),
    unit ? h("p", { class: "info", id: "plan-unit", "data-unit": unit }, unitNote(unit)) : "",
    h("table", { class: "grid compact", id: "plan-table" },
      planHeader(fields, cols, unit),
      h("tbody", {}, p.grids.map((g) => h("tr", {},
        h("td", {}, g.arm), h("td", {}, g.strategy), h("td", {}, num(g.epsilon_budget)), h("td", {}, g.trials),
        h("td", {}, num(g.noise_multiplier)), h("td", {}, g.steps_per_trial), h("td", {}, num(g.sample_rate)),
        h("td", {}, num(g.epsilon_per_trial)), h("td", {}, num(g.epsilon_total)),
        h("td", {}, num(g.epsilon_verified)), h("td", {}, num(g.epsilon_reserved)))))),
    tuningCard(p.grids, fields));
}
