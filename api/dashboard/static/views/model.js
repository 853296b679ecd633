// A trial's kept model on its page: the download buttons and the model card, rendered.
// The card is JSON written by the server (sweeper/artifacts/cards.py); it is rendered as the
// card's README.md reads (render_card_markdown): its title, the warnings, the privacy statement
// (each ε with the release it covers), the evaluation, the metrics, the model, strategy and
// hyperparameters, and how to download and load it. Fields no section shows (a newer card's)
// are listed under "Details". Rendered defensively: a missing key shows "–", never an error.

import { ApiError, api, apiBytes } from "../api.js";
import { download, h, num, params, when } from "../ui.js";

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

// What the rendered card shows in its own sections, per part of the card; every other field
// (a newer server's, say) is listed under "Details", so nothing on the card goes unshown.
const SHOWN = {
  "": ["format", "card_version", "dpsweep_version", "trial", "dataset", "model", "privacy", "evaluation",
    "metrics", "warnings"],
  trial: ["id", "sweep", "sweep_name", "arm", "strategy", "epsilon_budget", "hyperparameters", "seed",
    "seed_seeds", "best_step"],
  dataset: ["name", "identity", "identity_note", "n_train", "n_eval", "privacy_unit", "eval_mode", "eval_dataset"],
  model: ["name", "options", "input_shape", "num_classes", "parameters", "weights"],
  privacy: ["private", "randomness", "randomness_warning", "epsilon", "delta", "privacy_unit", "covers", "grid", "sweep",
    "accounting", "accountant", "verification", "noise_multiplier", "gradient_noise_multiplier", "sample_rate",
    "steps", "target_delta", "single_run_epsilon", "warning", "selected_trial", "selection"],
  evaluation: ["mode", "statement", "n_train", "n_eval", "protected", "covered", "dataset", "eval_releases",
    "eval_noise_multiplier", "epsilon_eval"],
  metrics: ["metric", "mode", "best_step", "values"],
};
// Friendlier names for the details the card is known to carry; others read as their key.
const LABELS = {
  created_at: "card written", "trial.number": "trial number", "trial.started_at": "trial started",
  "trial.finished_at": "trial finished", "trial.train_seconds": "training time (s)", "trial.steps": "steps trained",
  "dataset.input_scaling": "input scaling",
};
const TIMES = new Set(["created_at", "trial.started_at", "trial.finished_at"]);

function renderCard(t, card, paths) {
  const obj = (v) => (v && typeof v === "object" && !Array.isArray(v) ? v : {});
  const trial = obj(card.trial);
  const data = obj(card.dataset);
  const model = obj(card.model);
  const weights = obj(model.weights);
  const p = obj(card.privacy);
  const grid = obj(p.grid);
  const sweep = obj(p.sweep);
  const verification = obj(p.verification);
  const single = obj(p.single_run_epsilon);
  const ev = obj(card.evaluation);
  const met = obj(card.metrics);
  const sha = weights.sha256 ?? t.model?.sha256;
  const size = weights.size_bytes ?? t.model?.size_bytes;
  const trialId = trial.id ?? t.id;
  const code = (v) => h("code", {}, text(v ?? "–"));

  // --- download ---------------------------------------------------------------------------
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

  // --- title and what it is ---------------------------------------------------------------
  const title = h("h3", { id: "model-card-title" }, `Model card: ${text(model.name ?? "model")} from trial ${trialId}`);
  const sweepName = trial.sweep_name !== undefined ? `“${text(trial.sweep_name)}” ` : "";
  const intro = h("p", { id: "model-card-intro" },
    `Trained by dpsweep ${text(card.dpsweep_version ?? "–")} in sweep ${sweepName}(${trial.sweep ?? t.sweep}), arm `,
    code(trial.arm ?? t.arm), " (strategy ", code(trial.strategy ?? t.strategy), ") at the ε level ",
    num(trial.epsilon_budget ?? t.epsilon_budget), ", on dataset ", code(data.name ?? "–"), ".");

  // --- warnings ---------------------------------------------------------------------------
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
  if (p.private === false) {
    warnings.push(h("div", { class: "warning emphasis", id: "model-not-private" },
      h("strong", {}, "Not differentially private: "), "this model carries no ε guarantee."));
  }
  const cardWarnings = (Array.isArray(card.warnings) ? card.warnings : [])
    .concat(p.warning && !(card.warnings || []).includes(p.warning) ? [p.warning] : []);
  const warningSection = cardWarnings.length
    ? section("Warnings", "model-warnings",
      h("ul", { id: "model-card-warning" }, cardWarnings.map((w) => h("li", {}, h("strong", {}, text(w))))))
    : "";

  // --- privacy ----------------------------------------------------------------------------
  const privacyItems = [];
  if (p.private === false) {
    privacyItems.push(h("li", {}, text(p.warning ?? "not differentially private: no ε applies to this model")));
  } else {
    // The model's release is its grid: that ε is what releasing it spent (per unit: a person).
    const per = p.privacy_unit && p.privacy_unit !== "example" ? ` per ${p.privacy_unit} (unit: ${p.privacy_unit})` : "";
    const gridEps = p.epsilon ?? grid.epsilon ?? t.planned?.grid_epsilon_budget ?? t.epsilon_budget;
    const gridDelta = p.delta ?? grid.delta ?? p.target_delta ?? t.target_delta;
    privacyItems.push(h("li", { id: "model-privacy-statement" },
      h("strong", { id: "model-grid-epsilon", "data-epsilon": gridEps ?? "" }, `ε = ${num(gridEps)}${per}`),
      ` at δ = ${num(gridDelta)} (this model's grid): covers ${text(p.covers ?? grid.covers ?? "–")}.`));
    if (Object.keys(sweep).length) {
      privacyItems.push(h("li", { id: "model-sweep-epsilon", "data-epsilon": sweep.epsilon ?? "" },
        h("strong", {}, `ε = ${num(sweep.epsilon)}${per}`),
        ` at δ = ${num(sweep.delta)} (the whole sweep): covers ${text(sweep.covers ?? "–")}.`));
    }
    const gradSigma = p.gradient_noise_multiplier !== undefined && p.gradient_noise_multiplier !== null
      && p.gradient_noise_multiplier !== p.noise_multiplier ? ` (gradients σ = ${num(p.gradient_noise_multiplier)})` : "";
    privacyItems.push(h("li", { id: "model-mechanism" },
      `σ = ${num(p.noise_multiplier)}${gradSigma}, q = ${num(p.sample_rate)}, T = ${num(p.steps)} steps, `,
      `δ per run = ${num(p.target_delta)}.`));
    const verifiedBy = grid.verified_by ?? verification.verified_by;
    const verifiedEps = grid.epsilon_verified ?? verification.epsilon_verified;
    privacyItems.push(h("li", {}, "Accounting ", code(p.accounting), ", accountant ", code(p.accountant),
      verifiedBy ? `; verified by ${text(verifiedBy)} (ε ≈ ${num(verifiedEps)}).` : "."));
    if (Object.keys(single).length) {
      privacyItems.push(h("li", { id: "model-single-run" },
        `Single run's ε: ${num(single.epsilon)}`, single.note ? ` (${text(single.note)}).` : "."));
    }
    if (p.selection) privacyItems.push(h("li", {}, `${text(p.selection)}.`));
  }
  if (p.randomness !== undefined) privacyItems.push(h("li", {}, `Randomness: ${text(p.randomness)}.`));
  const privacy = section("Privacy", "model-privacy", h("ul", {}, privacyItems));

  // --- evaluation -------------------------------------------------------------------------
  const evalNoise = ev.eval_releases
    ? ` ${ev.eval_releases} noisy evaluations per run (σₑ = ${num(ev.eval_noise_multiplier)}, ε of the evaluations ${num(ev.epsilon_eval)}).`
    : "";
  const evaluation = section("Evaluation", "model-evaluation",
    h("p", { id: "model-evaluation-statement" }, "Mode ", code(ev.mode ?? data.eval_mode), ": ",
      text(ev.statement ?? "–"), ".", evalNoise));

  // --- metrics ----------------------------------------------------------------------------
  const values = met.values && typeof met.values === "object"
    ? met.values : rest(met, SHOWN.metrics); // cards written before metrics.values: flat
  const bestStep = met.best_step ?? trial.best_step;
  const metricsSection = section(`Metrics (best checkpoint, step ${num(bestStep)})`, "model-metrics",
    met.metric !== undefined ? h("p", {}, `Objective: ${text(met.metric)} (${text(met.mode ?? "max")}).`) : "",
    Object.keys(values).length
      ? h("table", { class: "grid compact", id: "model-metrics-table" },
        h("thead", {}, h("tr", {}, h("th", {}, "metric"), h("th", {}, "value"))),
        h("tbody", {}, Object.entries(values).sort(([a], [b]) => a.localeCompare(b)).map(([k, v]) =>
          h("tr", {}, h("td", {}, k === "ece" ? "ECE (calibration error)" : k), h("td", { "data-key": k }, value(v))))))
      : h("p", { class: "muted" }, "No metrics on the card."));

  // --- the model --------------------------------------------------------------------------
  const shape = Array.isArray(model.input_shape) ? model.input_shape.join(" × ") : model.input_shape;
  const options = model.options && typeof model.options === "object" ? model.options : {};
  const hyper = trial.hyperparameters && typeof trial.hyperparameters === "object" ? trial.hyperparameters : {};
  const arch = section("Model", "model-architecture",
    h("ul", {},
      h("li", { id: "model-arch" }, "Architecture ", code(model.name),
        Object.keys(options).length ? [" with options ", code(params(options))] : "",
        `, input shape ${text(shape ?? "–")}, ${text(model.num_classes ?? "–")} classes, `,
        `${typeof model.parameters === "number" ? model.parameters.toLocaleString("en-US") : text(model.parameters ?? "–")} parameters.`),
      h("li", {}, `Weights: ${text(weights.format ?? "safetensors")}, ${size !== undefined ? bytes(size) : "–"}, sha256 `,
        h("code", { id: "model-sha256" }, sha ?? "–"), "."),
      h("li", { id: "model-hyperparameters" }, "Strategy ", code(trial.strategy ?? t.strategy), "; hyperparameters ",
        Object.keys(hyper).length ? code(params(hyper)) : "none",
        `; seed ${text(trial.seed ?? t.seed ?? "–")}`, trial.seed_seeds ? ` (${text(trial.seed_seeds)})` : "", ".")));

  // With a privacy unit the sizes count units (people), not records.
  const counted = data.privacy_unit && data.privacy_unit !== "example" ? `units (${data.privacy_unit})` : "records";
  const dataSection = section("Dataset", "model-dataset",
    h("p", {}, code(data.name ?? "–"),
      data.n_train != null ? `: ${data.n_train} training ${counted}` : "",
      data.n_eval != null ? `, ${data.n_eval} evaluation ${counted}` : "",
      data.eval_mode ? ` (evaluation: ${text(data.eval_mode)}${data.eval_dataset ? `, from ${text(data.eval_dataset)}` : ""})` : "",
      "."),
    data.identity_note ? h("p", { class: "muted small" }, `${capitalize(text(data.identity_note))}.`) : "");

  // --- download and load ------------------------------------------------------------------
  const howTo = section("Download and load", "model-howto",
    h("p", {}, "“Download model” above saves the weights (safetensors), “Download card” this card as JSON. ",
      "With the Python client (", h("code", {}, "pip install dpsweep"), "; loading needs the server extra for torch):"),
    h("pre", { class: "code", id: "model-load-snippet" }, [
      "from dpsweep import Client",
      "",
      "with Client() as client:  # DPSWEEP_URL and DPSWEEP_TOKEN",
      `    trial = client.trial("${trialId}")`,
      "    trial.download_model(\"model/\")  # the safetensors file and its card",
      "    model = trial.load_model()  # a torch.nn.Module in eval mode",
    ].join("\n")),
    h("p", {}, "On the server's machine, ", h("code", {}, `dpsweep model ${trialId} -o DIR`),
      " writes model.safetensors, card.json and README.md (this card); ", h("code", {}, "--onnx"),
      " also writes model.onnx."));

  // --- anything else on the card ----------------------------------------------------------
  const extra = details(card);
  const detailsSection = extra.length
    ? h("details", { class: "model-section", id: "model-details" },
      h("summary", {}, `Details (${extra.length})`),
      h("dl", { class: "kv" }, extra.map(([path, v]) => [
        h("dt", {}, LABELS[path] ?? humanize(path)),
        h("dd", { "data-key": path }, TIMES.has(path) && typeof v === "string" ? when(v) : value(v))])))
    : "";

  return [
    h("article", { class: "model-card", id: "model-card" },
      title, intro, actions, ...warnings, warningSection,
      h("div", { class: "model-grid" }, h("div", {}, privacy, evaluation), h("div", {}, metricsSection, arch, dataSection)),
      howTo, detailsSection,
      h("p", { class: "muted small", id: "model-card-footer" },
        `card format ${text(card.format ?? "–")}${card.card_version !== undefined ? ` v${card.card_version}` : ""} · written by dpsweep ${text(card.dpsweep_version ?? "–")}`)),
  ];
}

/** The card's fields no section shows, as [path, value] (null values left out). */
function details(card) {
  const rows = [];
  const isObj = (v) => v && typeof v === "object" && !Array.isArray(v);
  for (const [k, v] of Object.entries(card)) {
    if (!SHOWN[""].includes(k)) rows.push([k, v]);
    else if (k in SHOWN && k !== "" && isObj(v)) {
      for (const [kk, vv] of Object.entries(v)) if (!SHOWN[k].includes(kk)) rows.push([`${k}.${kk}`, vv]);
    }
  }
  return rows.filter(([, v]) => v !== null && v !== undefined);
}

/** "dataset.split_seed" reads "split seed (dataset)". */
function humanize(path) {
  const [head, ...tail] = path.split(".");
  const name = (tail.length ? tail.join(".") : head).replace(/_/g, " ");
  return tail.length ? `${name} (${head})` : name;
}

function section(title, id, ...children) {
  return h("section", { class: "model-section", id }, h("h4", {}, title), ...children);
}

/** The keys of `o` not in `known`. */
function rest(o, known) {
  return Object.fromEntries(Object.entries(o || {}).filter(([k]) => !known.includes(k)));
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

function capitalize(s) {
  return s ? s[0].toUpperCase() + s.slice(1) : s;
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
