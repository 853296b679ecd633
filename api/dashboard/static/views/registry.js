// What a spec may name: every registered model, dataset loader, strategy and accountant, with
// its options (GET /api/v1/registry; installed plug-ins included). Shown on the datasets page,
// and as hints on the submit page.

import { api } from "../api.js";
import { errorBox, h } from "../ui.js";

let cached = null;

/** The registry listing (fetched once per page load: it changes only when the server restarts). */
export function registry() {
  cached ||= api("/registry").catch((e) => { cached = null; throw e; });
  return cached;
}

function optionText(o) {
  let what = o.kind === "choice" ? o.choices.join(" | ") : `${o.kind} ${o.range}`;
  if (o.sequence) what = `list of ${what}`;
  const dflt = o.default === null ? (o.optional ? "derived" : "required") : JSON.stringify(o.default);
  return `${o.name}: ${what}, default ${dflt}`;
}

function options(list) {
  if (!list.length) return h("span", { class: "muted" }, "none");
  return h("ul", { class: "options" }, list.map((o) => h("li", { title: o.help }, h("code", {}, optionText(o)), o.help ? h("span", { class: "muted small" }, ` ${o.help}`) : "")));
}

const SECTIONS = [
  ["models", "Models", ["input", "task", "options"], (m) => [m.input_kind, m.task, options(m.options)]],
  ["datasets", "Dataset loaders", ["input", "needs", "options"], (d) => [d.input_kind, d.needs.join(", ") || "–", options(d.options)]],
  ["strategies", "Clipping strategies", ["private", "hyperparameters"], (s) => [s.private ? "yes" : "no", options(s.hyperparameters)]],
  ["accountants", "Accountants", ["library", "tight"], (a) => [a.library, a.tight ? "yes" : "upper bound"]],
];

/** A card listing the four registries into ``el`` (tables with ids ``registry-<kind>``). */
export function registrySection(el) {
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  el.append(h("div", { class: "card", id: "registry" },
    h("h2", {}, "Models, loaders, strategies and accountants"),
    h("p", { class: "muted small" }, "The names a spec may use, with their options; plug-ins the operator installed (entry points) included. The same list as `dpsweep plugins`."),
    body));
  registry().then((reg) => {
    body.replaceChildren(...SECTIONS.map(([kind, title, cols, cells]) => h("div", {},
      h("h3", {}, title),
      h("table", { class: "grid compact", id: `registry-${kind}` },
        h("thead", {}, h("tr", {}, ["name", "description", ...cols].map((c) => h("th", {}, c)))),
        h("tbody", {}, reg[kind].map((e) => h("tr", { "data-name": e.name },
          h("td", {}, h("code", {}, e.name)), h("td", {}, e.description),
          ...cells(e).map((c) => h("td", {}, c)))))))));
  }).catch((e) => body.replaceChildren(errorBox(e)));
}

/** One line of hints for the submit page: the registered names of each kind. */
export function registryHints(el) {
  const line = h("p", { class: "muted small", id: "registry-hints" });
  el.append(line);
  registry().then((reg) => {
    line.replaceChildren(...["models", "datasets", "strategies", "accountants"].flatMap((k, i) => [
      i ? " · " : "", h("strong", {}, `${k}: `), reg[k].map((e) => e.name).join(", ")]),
    " (", h("a", { href: "/datasets#registry" }, "options"), ")");
  }).catch(() => line.replaceChildren());
}
