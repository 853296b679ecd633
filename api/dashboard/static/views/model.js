// A trial's kept model on its page: the download buttons and the model card, rendered.
// The card is JSON written by the server (sweeper/artifacts/cards.py); it is rendered
// defensively: what is present is shown, a missing key shows "–" or nothing, never an error.

import { ApiError, api, apiBytes } from "../api.js";
import { download, h, num } from "../ui.js";

const PS = "papernot-steinke";

/**
 * The "Model" panel of trial `t` (the trial JSON). It loads the card itself; a 404 from the
 * card means no model is kept, and its detail (why) is shown.
 *
 * @returns {HTMLElement}
 */
export function modelPanel(t) {
  const body = h("div", { id: "model-body" }, h("p", { class: "muted" }, "Loading the model card…"));
  const panel = h("div", { class: "card", id: "model-panel", "data-state": "loading" },
    h("h2", {}, "Model"), body);
  const paths = routes(t);
  (async () => {
    let card;
    try {
      card = await api(paths.card);
    } catch (e) {
      panel.dataset.state = "missing";
      if (e instanceof ApiError && e.status === 404) {
        body.replaceChildren(h("p", { class: "muted", id: "model-missing" }, e.message));
      } else {
        body.replaceChildren(h("div", { class: "error", id: "model-error" },
          h("strong", {}, "The model card could not be read: "), e.message));
      }
      return;
    }
    panel.dataset.state = "kept";
    body.replaceChildren(...renderCard(t, card || {}, paths));
  })();
  return panel;
}

/** Where the model and its card are: the trial JSON's `model` links when it has them. */
function routes(t) {
  const rel = (u) => {
    if (!u) return null;
    const p = new URL(u, location.href).pathname;
    return p.startsWith("/api/v1/") ? p.slice("/api/v1".length) : null;
  };
  const m = t.model && typeof t.model === "object" ? t.model : {};
  return {
    model: rel(m.url) || `/trials/${t.id}/model`,
    card: rel(m.card_url) || `/trials/${t.id}/model-card`,
  };
}

function renderCard(t, card, paths) {
  const obj = (v) => (v && typeof v === "object" && !Array.isArray(v) ? v : {});
  const trial = obj(card.trial);
  const model = obj(card.model);
  const weights = obj(model.weights);
  const p = obj(card.privacy);
  const grid = obj(p.grid);
  const sweep = obj(p.sweep);
  const ev = obj(card.evaluation);
  const sha = weights.sha256 ?? t.model?.sha256;
  const size = weights.size_bytes ?? t.model?.size_bytes;

  const status = h("span", { class: "muted small", id: "model-download-status" });
  const fetchAndSave = (path, fallback, what) => async (e) => {
    const btn = e.currentTarget;
    btn.disabled = true;
    status.textContent = `Downloading the ${what}…`;
    try {
      const { blob, filename } = await apiBytes(path);
      download(filename || fallback, blob, blob.type);
      status.textContent = "";
    } catch (err) {
      status.textContent = `The ${what} could not be downloaded: ${err.message}`;
    } finally {
      btn.disabled = false;
    }
  };
  const fileStem = `dpsweep-${t.id}`;
  const actions = h("div", { class: "toolbar" },
    h("button", { class: "primary", id: "download-model", type: "button",
      onclick: fetchAndSave(paths.model, `${fileStem}.safetensors`, "model") }, "Download model"),
    h("button", { id: "download-card", type: "button",
      onclick: fetchAndSave(paths.card, `${fileStem}-card.json`, "model card") }, "Download card (JSON)"),
    size !== undefined ? h("span", { class: "muted small" }, `safetensors · ${bytes(size)}`) : "",
    status);

  const warnings = [];
  const reproducible = p.randomness === "reproducible" || t.model?.reproducible === true
    || t.randomness === "reproducible";
  if (reproducible) {
    warnings.push(h("div", { class: "warning", id: "model-reproducible-warning" },
      h("strong", {}, "Reproducible-mode model: "),
      "its batches and noise came from the public seed, so its ε does not hold against anyone ",
      "who knows the seed. Do not release it as a private model."));
  }
  const selected = t.planned?.accounting === PS || p.accounting === PS || grid.accounting === PS;
  if (selected) {
    warnings.push(h("div", { class: "warning", id: "model-selected-warning" },
      h("strong", {}, "Selected trial (Papernot–Steinke): "),
      "this is the one model its grid released; its ε is the grid's, for the whole private ",
      "search. The grid's other runs, and how many there were, stay private."));
  }
  if (p.warning) {
    warnings.push(h("div", { class: "warning", id: "model-card-warning" },
      h("strong", {}, "Card warning: "), text(p.warning)));
  }
  if (p.private === false) {
    warnings.push(h("div", { class: "warning", id: "model-not-private" },
      h("strong", {}, "Not differentially private: "), "this model carries no ε guarantee."));
  }

  // The release's ε: the card's grid, else the trial's (the grid's budget: the same release).
  const gridEps = grid.epsilon ?? t.planned?.grid_epsilon_budget ?? t.epsilon_budget;
  const gridDelta = grid.delta ?? p.target_delta ?? t.target_delta;
  const covers = h("dl", { class: "kv", id: "model-covers" },
    h("dt", {}, "grid (this release)"),
    h("dd", {}, h("span", { id: "model-grid-epsilon", "data-epsilon": gridEps ?? "" }, `ε ${num(gridEps)}`),
      gridDelta !== undefined ? `, δ ${num(gridDelta)}` : ""),
    Object.keys(sweep).length ? [
      h("dt", {}, "whole sweep"),
      h("dd", { id: "model-sweep-epsilon", "data-epsilon": sweep.epsilon ?? "" },
        `ε ${num(sweep.epsilon)}`, sweep.delta !== undefined ? `, δ ${num(sweep.delta)}` : ""),
    ] : "",
    sweep.covers !== undefined ? [h("dt", {}, "sweep ε covers"), h("dd", {}, value(sweep.covers))] : "",
    grid.covers !== undefined ? [h("dt", {}, "grid ε covers"), h("dd", {}, value(grid.covers))] : "");
  const privacyKnown = ["private", "noise_multiplier", "sample_rate", "steps", "target_delta", "grid",
    "sweep", "accountant", "verifier", "single_run_epsilon", "randomness", "warning", "accounting"];
  const privacy = section("Privacy guarantee", "model-privacy",
    h("h3", {}, "What ε covers"), covers,
    h("h3", {}, "Mechanism"),
    kv({
      "σ (noise multiplier)": p.noise_multiplier, "sample rate q": p.sample_rate, "steps T": p.steps,
      "target δ": p.target_delta, "single-run ε (this run alone)": p.single_run_epsilon,
      accountant: p.accountant, verifier: p.verifier, accounting: p.accounting, randomness: p.randomness,
      ...rest(p, privacyKnown),
    }));

  const evaluation = section("Evaluation", "model-evaluation",
    ev.statement ? h("p", { id: "model-evaluation-statement" }, text(ev.statement)) : "",
    kv({
      mode: ev.mode,
      "ε covers the evaluation": typeof ev.covered === "boolean" ? (ev.covered ? "yes" : "no") : ev.covered,
      ...rest(ev, ["statement", "mode", "covered"]),
    }));

  const metrics = obj(card.metrics);
  const metricsSection = section("Metrics at the kept checkpoint", "model-metrics",
    Object.keys(metrics).length
      ? kv(Object.fromEntries(Object.entries(metrics).map(([k, v]) => [k === "ece" ? "ECE (calibration error)" : k, v])))
      : h("p", { class: "muted" }, "No metrics on the card."));

  const arch = section("Architecture", "model-architecture",
    kv({
      model: model.name, options: model.options,
      "input shape": Array.isArray(model.input_shape) ? model.input_shape.join(" × ") : model.input_shape,
      classes: model.num_classes,
      parameters: typeof model.parameters === "number" ? model.parameters.toLocaleString("en-US") : model.parameters,
      ...rest(model, ["name", "options", "input_shape", "num_classes", "parameters", "weights"]),
      "weights size": size !== undefined ? bytes(size) : undefined,
    }),
    h("p", { class: "small" }, "sha256 ", h("code", { id: "model-sha256" }, sha ?? "–")));

  const origin = section("Trial and data", "model-trial",
    kv({
      trial: trial.id ?? t.id, arm: trial.arm ?? t.arm, strategy: trial.strategy ?? t.strategy,
      hyperparameters: trial.hyperparameters,
      ...rest(trial, ["id", "sweep_id", "arm", "strategy", "hyperparameters"]),
      sweep: trial.sweep_id ?? t.sweep,
    }),
    card.dataset !== undefined ? [h("h3", {}, "Dataset"), value(card.dataset)] : "");

  const known = ["format", "trial", "dataset", "model", "privacy", "evaluation", "metrics", "dpsweep_version"];
  const others = rest(card, known);
  return [
    actions,
    ...warnings,
    h("div", { class: "model-grid" }, privacy, evaluation, metricsSection, arch, origin,
      Object.keys(others).length ? section("More on the card", "model-other", kv(others)) : ""),
    h("p", { class: "muted small", id: "model-card-footer" },
      `card format ${text(card.format ?? "–")} · written by dpsweep ${text(card.dpsweep_version ?? "–")}`),
  ];
}

function section(title, id, ...children) {
  return h("div", { class: "model-section", id }, h("h3", {}, title), ...children);
}

/** The keys of `o` not in `known` (so that nothing on the card goes unshown). */
function rest(o, known) {
  return Object.fromEntries(Object.entries(o || {}).filter(([k]) => !known.includes(k)));
}

function kv(o) {
  const rows = Object.entries(o).filter(([, v]) => v !== undefined);
  if (!rows.length) return h("p", { class: "muted" }, "–");
  return h("dl", { class: "kv" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", { "data-key": k }, value(v))]));
}

/** Any JSON value as text or nested key/value lists (depth-limited). */
function value(v, depth = 0) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return num(v);
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (typeof v === "string") return v;
  if (depth > 3) return JSON.stringify(v);
  if (Array.isArray(v)) {
    return v.every((x) => x === null || typeof x !== "object")
      ? v.map((x) => value(x)).join(", ")
      : h("ul", { class: "plain" }, v.map((x) => h("li", {}, value(x, depth + 1))));
  }
  const entries = Object.entries(v);
  if (!entries.length) return "–";
  return h("dl", { class: "kv" }, entries.map(([k, x]) => [h("dt", {}, k), h("dd", {}, value(x, depth + 1))]));
}

function text(v) {
  return typeof v === "string" ? v : JSON.stringify(v);
}

function bytes(n) {
  if (typeof n !== "number") return String(n);
  if (n < 1024) return `${n} B`;
  if (n < 2 ** 20) return `${num(n / 1024, 3)} KiB`;
  return `${num(n / 2 ** 20, 3)} MiB`;
}
